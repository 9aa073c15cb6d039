/*
 * cli.c - what every ckptctl command shares.
 *
 * Design note: commands (cmd_*.c) hold only their own logic; everything two
 * of them would otherwise repeat lives here: messages in the one
 * "ckptctl: CMD: message" shape, option and location parsing (DIR@STEP),
 * size/time/shape formatting, JSON building (jansson; allocation failure
 * ends the process, so callers need no error paths for it), the progress
 * line on a terminal, SIGINT/SIGTERM cancellation and opening a checkpoint
 * through the public API. Nothing here knows about any one command.
 */
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

const char *cli_cmd_name = NULL;
int cli_bytes = 0;
volatile sig_atomic_t cli_interrupted = 0;

/* ------------------------------------------------------------------ */
/* Messages                                                           */
/* ------------------------------------------------------------------ */

/* "ckptctl: CMD: " + message + newline on stderr. */
static void vmessage(const char *fmt, va_list ap)
{
	if (cli_cmd_name)
		fprintf(stderr, "ckptctl: %s: ", cli_cmd_name);
	else
		fputs("ckptctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void cli_err(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	va_start(ap, fmt);
	vmessage(fmt, ap);
	va_end(ap);
}

int cli_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vmessage(fmt, ap);
	va_end(ap);
	if (cli_cmd_name)
		fprintf(stderr, "Try 'ckptctl %s --help'.\n", cli_cmd_name);
	else
		fputs("Try 'ckptctl --help'.\n", stderr);
	return CLI_EXIT_USAGE;
}

const char *cli_libmsg(const char *m, int rc)
{
	return (m && *m) ? m : ckpt_strerror(rc);
}

/* ------------------------------------------------------------------ */
/* Options and operands                                               */
/* ------------------------------------------------------------------ */

int cli_bad_option(int c, char **argv)
{
	const char *arg = argv[optind - 1];

	if (c == ':')
		return cli_usage("option '%s' requires an argument", arg);
	if (optopt)
		return cli_usage("unknown option '-%c'", optopt);
	return cli_usage("unknown option '%s'", arg);
}

int cli_getopt(int argc, char **argv, const char *shortopts,
	       const struct option *longopts, const char *help, int *json,
	       int *status)
{
	int c;

	/* -j/--json is every command's; it needs no case of its own. */
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) ==
		       'j' &&
	       json)
		*json = 1;
	if (c == 'h') {
		fputs(help, stdout);
		*status = 0;
		return CLI_OPT_EXIT;
	}
	if (c == '?' || c == ':') {
		*status = cli_bad_option(c, argv);
		return CLI_OPT_EXIT;
	}
	return c;
}

int cli_parse_host(const char *arg, uint32_t *host)
{
	uint64_t v;

	if (cli_parse_u64(arg, &v, 0) || v > UINT32_MAX)
		return cli_usage("bad --host '%s'", arg);
	*host = (uint32_t)v;
	return 0;
}

int cli_journal_opt(int c, const char *arg, const char **location,
		    uint32_t *host, int *status)
{
	switch (c) {
	case 'l':
		*location = arg;
		return 0;
	case 'H':
		*status = cli_parse_host(arg, host);
		return *status ? CLI_OPT_EXIT : 0;
	}
	return c;
}

int cli_operands(int argc, int want, const char *missing)
{
	if (argc - optind == want)
		return 0;
	return cli_usage("%s",
			 argc - optind > want ? "too many arguments" : missing);
}

/*
 * The arguments of the commands that only display (ls, inspect):
 * -j/--json, -b/--bytes, -h/--help and one location operand.
 */
int cli_display_args(int argc, char **argv, const char *help, int allow_step,
		     int *json, cli_location *loc)
{
	static const struct option opts[] = { { "bytes", no_argument, NULL,
						'b' },
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, status, rc;

	while ((c = cli_getopt(argc, argv, ":jbh", opts, help, json,
			       &status)) != -1) {
		switch (c) {
		case 'b':
			cli_bytes = 1;
			break;
		case CLI_OPT_EXIT:
			return status;
		}
	}
	rc = cli_operands(argc, 1,
			  allow_step ? "missing DIR[@STEP]" : "missing DIR");
	if (rc)
		return rc;
	rc = cli_parse_location(argv[optind], allow_step, loc);
	return rc ? rc : -1;
}

/* Strict unsigned decimal with optional binary suffix (K, M, G, KiB...). */
int cli_parse_u64(const char *s, uint64_t *out, int allow_suffix)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!*s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	if (*end && allow_suffix) {
		if (!strcmp(end, "K") || !strcmp(end, "k") ||
		    !strcmp(end, "KiB"))
			mul = 1ull << 10;
		else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
			mul = 1ull << 20;
		else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
			mul = 1ull << 30;
		else
			return -1;
	} else if (*end) {
		return -1;
	}
	if (v > UINT64_MAX / mul)
		return -1;
	*out = (uint64_t)v * mul;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Formatting helpers                                                 */
/* ------------------------------------------------------------------ */

const char *cli_fmt_size(uint64_t v, char *buf, size_t len)
{
	static const char *units[] = {
		"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"
	};
	double d = (double)v;
	int u = -1;

	if (cli_bytes || v < 1024) {
		snprintf(buf, len, cli_bytes ? "%" PRIu64 : "%" PRIu64 " B", v);
		return buf;
	}
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", d, units[u]);
	return buf;
}

const char *cli_fmt_ratio(uint64_t raw, uint64_t stored, char *buf, size_t len)
{
	if (stored == 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.2fx", (double)raw / (double)stored);
	return buf;
}

const char *cli_fmt_time(int64_t ns, char *buf, size_t len)
{
	time_t sec = (time_t)(ns / 1000000000);
	struct tm tm;

	if (ns <= 0 || !gmtime_r(&sec, &tm)) {
		snprintf(buf, len, "-");
		return buf;
	}
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
	return buf;
}

int64_t cli_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const char *cli_fmt_time_ms(int64_t ns, char *buf, size_t len)
{
	time_t sec = (time_t)(ns / 1000000000);
	struct tm tm;
	char s[32];

	if (ns <= 0 || !gmtime_r(&sec, &tm)) {
		snprintf(buf, len, "-");
		return buf;
	}
	strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", s, (int)(ns / 1000000 % 1000));
	return buf;
}

const char *cli_fmt_shape(const uint64_t *shape, uint32_t ndim, char *buf,
			  size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(buf + o, len - o, "[");
	for (uint32_t i = 0; i < ndim && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64,
				      i ? ", " : "", shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}

/* ---- JSON helpers (jansson); allocation failures end the process --- */

json_t *cli_jcheck(json_t *v)
{
	if (!v) {
		cli_err("out of memory");
		exit(1);
	}
	return v;
}

json_t *cli_ju64(uint64_t v)
{
	char b[32];

	/* json_int_t is signed 64-bit; larger values travel as strings. */
	if (v <= (uint64_t)INT64_MAX)
		return cli_jcheck(json_integer((json_int_t)v));
	snprintf(b, sizeof(b), "%" PRIu64, v);
	return cli_jcheck(json_string(b));
}

/* A string that may not be valid UTF-8: exact when it is, else escaped. */
json_t *cli_jstr(const char *s)
{
	json_t *v = json_string(s);

	if (!v) {
		static char esc[CLI_ESC_MAX];
		v = cli_jcheck(json_string(st_escape(s, esc, sizeof(esc))));
	}
	return v;
}

json_t *cli_jratio(uint64_t raw, uint64_t stored)
{
	if (stored == 0)
		return json_null();
	return cli_jcheck(json_real((double)raw / (double)stored));
}

void cli_jset(json_t *o, const char *k, json_t *v)
{
	if (json_object_set_new(o, k, v)) {
		cli_err("out of memory");
		exit(1);
	}
}

void cli_jappend(json_t *a, json_t *v)
{
	if (json_array_append_new(a, v)) {
		cli_err("out of memory");
		exit(1);
	}
}

json_t *cli_jshape(const uint64_t *shape, uint32_t ndim)
{
	json_t *a = cli_jcheck(json_array());

	for (uint32_t i = 0; i < ndim; i++)
		cli_jappend(a, cli_ju64(shape[i]));
	return a;
}

void cli_jprint(json_t *v)
{
	json_dumpf(v, stdout, JSON_INDENT(2));
	fputc('\n', stdout);
	json_decref(v);
}

/* ------------------------------------------------------------------ */
/* Locations                                                          */
/* ------------------------------------------------------------------ */

void cli_location_free(cli_location *l)
{
	free(l->path);
	l->path = NULL;
}

/*
 * Parses "ROOT" or "ROOT@STEP". The last '@' followed by one or more digits
 * only is a step; anything else is part of the root, so directories with
 * '@' in their names still work. With allow_step == 0 the whole argument
 * is the root. Returns 0, or CLI_EXIT_USAGE after printing a usage error
 * (a step that does not fit, an empty root).
 */
int cli_parse_location(const char *arg, int allow_step, cli_location *l)
{
	const char *at = allow_step ? strrchr(arg, '@') : NULL;
	size_t rootlen = strlen(arg);

	memset(l, 0, sizeof(*l));
	if (at && at[1] && strspn(at + 1, "0123456789") == strlen(at + 1)) {
		uint64_t v = 0;
		for (const char *p = at + 1; *p; p++) {
			unsigned d = (unsigned)(*p - '0');
			if (v > (UINT64_MAX - 1 - d) /
					10) /* UINT64_MAX means latest */
				return cli_usage("step '%s' is out of range",
						 at + 1);
			v = v * 10 + d;
		}
		l->has_step = 1;
		l->step = v;
		rootlen = (size_t)(at - arg);
	}
	if (rootlen == 0)
		return cli_usage("empty checkpoint directory in '%s'", arg);
	l->path = strndup(arg, rootlen);
	if (!l->path) {
		cli_err("out of memory");
		exit(1);
	}
	if (strncmp(l->path, "gs://", 5) == 0)
		l->kind = CLI_LOC_GCS;
	return 0;
}

/* Checks that the location can be used by this build; prints why not. */
int cli_location_usable(const cli_location *l, int must_exist)
{
	struct stat st;

	if (l->kind == CLI_LOC_GCS)
		return 0; /* the library tells whether anything is there */
	if (must_exist) {
		if (stat(l->path, &st) < 0) {
			cli_err("%s: %s", l->path, strerror(errno));
			return -1;
		}
		if (!S_ISDIR(st.st_mode)) {
			cli_err("%s: not a directory", l->path);
			return -1;
		}
	}
	return 0;
}

/* mkdir -p: import and restore create the destination and its parents. */
int cli_mkdir_p(const char *path)
{
	char *p = strdup(path);
	int rc = 0;

	if (!p)
		return -ENOMEM;
	for (char *q = p + 1;; q++) {
		if (*q == '/' || *q == '\0') {
			char c = *q;
			*q = '\0';
			if (mkdir(p, 0755) < 0 && errno != EEXIST) {
				rc = -errno;
				break;
			}
			*q = c;
			if (c == '\0')
				break;
		}
	}
	free(p);
	return rc;
}

uint64_t cli_location_step(const cli_location *l)
{
	return l->has_step ? l->step : CKPT_LATEST;
}

/* ------------------------------------------------------------------ */
/* Progress                                                           */
/* ------------------------------------------------------------------ */

static double now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void cli_progress_init(cli_progress *p, const char *label)
{
	pthread_mutex_init(&p->mu, NULL);
	p->label = label;
	p->on = isatty(STDERR_FILENO);
	p->shown = 0;
	p->t0 = now_sec();
	p->last = 0;
}

/* ckpt_progress_fn; may be called from library worker threads. */
int cli_progress_fn(void *arg, uint64_t done, uint64_t total)
{
	cli_progress *p = arg;

	if (p->on) {
		double t;
		pthread_mutex_lock(&p->mu);
		t = now_sec();
		if (t - p->last >= 0.1 || done == total) {
			double el = t - p->t0;
			double pct =
				total ? 100.0 * (double)done / (double)total :
					100.0;
			char a[32], b[32];
			fprintf(stderr,
				"\r%s: %5.1f%%  %s of %s  %.1f MB/s\033[K",
				p->label, pct, cli_fmt_size(done, a, sizeof(a)),
				cli_fmt_size(total, b, sizeof(b)),
				el > 0 ? (double)done / 1e6 / el : 0.0);
			p->shown = 1;
			p->last = t;
		}
		pthread_mutex_unlock(&p->mu);
	}
	return cli_interrupted ? 1 : 0;
}

void cli_progress_end(cli_progress *p)
{
	pthread_mutex_lock(&p->mu);
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = 0;
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_destroy(&p->mu);
}

static void on_signal(int sig)
{
	(void)sig;
	cli_interrupted = 1;
}

/* The first SIGINT/SIGTERM cancels the operation cleanly (temporary files
 * removed, nothing committed); a second one kills as usual. */
void cli_install_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* ------------------------------------------------------------------ */
/* Shared bits                                                        */
/* ------------------------------------------------------------------ */

/* Opens a handle for listing/gc (no staging pool). */
int cli_open_root(const cli_location *l, ckpt **out)
{
	ckpt_settings s;
	int rc;

	if (cli_location_usable(l, 1))
		return -1;
	ckpt_settings_default(&s);
	s.staging_bytes = 0;
	rc = ckpt_open(out, l->path, &s);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		return -1;
	}
	return 0;
}

int cli_open_reader(const cli_location *l, uint64_t step, ckpt_reader **out)
{
	int rc;

	if (cli_location_usable(l, 1))
		return -1;
	rc = ckpt_reader_open(out, l->path, step, NULL);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_reader_errmsg(NULL), rc));
		return -1;
	}
	return 0;
}

/* Sum of the sizes of the files the commit record lists. */
void cli_files_total(const ckpt_reader *r, size_t *nfiles, uint64_t *bytes)
{
	ckpt_file_info fi;

	*nfiles = ckpt_reader_file_count(r);
	*bytes = 0;
	for (size_t i = 0; i < *nfiles; i++)
		if (ckpt_reader_file(r, i, &fi) == 0)
			*bytes += fi.size;
}

const char *cli_reason_name(int reason)
{
	const char *n = ckpt_reason_name(reason);

	return n ? n : "unspecified";
}

const char *cli_kind_name(int kind)
{
	switch (kind) {
	case CKPT_FILE_SHARD:
		return "shard";
	case CKPT_FILE_INDEX:
		return "index";
	case CKPT_FILE_COMMIT:
		return "commit";
	default:
		return "?";
	}
}

/* ------------------------------------------------------------------ */
/* A handle for the watcher alone                                     */
/* ------------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *st, int flag,
		    struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int cli_watcher_open(const ckpt_watch_opts *o, ckpt **out, char **tmpdir)
{
	const char *base = getenv("TMPDIR");
	ckpt_settings s;
	char *dir;
	int rc;

	*out = NULL;
	*tmpdir = NULL;
	if (asprintf(&dir, "%s/ckptctl-watch.XXXXXX",
		     base && *base ? base : "/tmp") < 0) {
		cli_err("out of memory");
		return -1;
	}
	if (!mkdtemp(dir)) {
		cli_err("%s: %s", dir, strerror(errno));
		free(dir);
		return -1;
	}
	*tmpdir = dir;
	ckpt_settings_default(&s);
	s.staging_bytes = 0;
	rc = ckpt_open(out, dir, &s);
	if (rc == 0) {
		rc = ckpt_watch_start(*out, o);
		if (rc)
			cli_err("cannot start the watcher: %s",
				cli_libmsg(ckpt_errmsg(NULL), rc));
	} else {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
	}
	if (rc) {
		cli_watcher_close(*out, dir);
		*out = NULL;
		*tmpdir = NULL;
		return -1;
	}
	return 0;
}

void cli_watcher_close(ckpt *c, char *tmpdir)
{
	ckpt_close(c);
	if (tmpdir)
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	free(tmpdir);
}
