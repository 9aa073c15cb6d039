/*
 * ckptctl.c - command-line tool for ckpt checkpoints.
 *
 * Design note: the tool is a thin client of the public API (ckpt.h) and
 * nothing else, so anything it can do a user's program can do too. Each
 * subcommand is one cmd_* function that parses its own options with
 * getopt_long and returns the process exit status:
 *     0 success, 1 failure (message on stderr), 2 usage error.
 * Checkpoint locations go through parse_location() so that gs:// URLs can
 * be added in one place later; today only local directories are accepted.
 * Every name read from a checkpoint or a safetensors file is escaped before
 * it reaches a terminal (st_escape); JSON output carries the exact bytes.
 */
#include <errno.h>
#include <fcntl.h>
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
#include "safetensors.h"

#define EXIT_USAGE 2

/* Largest piece of a tensor export reads at once; bigger tensors are read
 * in boxes along their outer dimensions so memory stays bounded. */
#define EXPORT_PIECE (64u << 20)
/* Staging pool ceiling for import. */
#define IMPORT_POOL_MAX (256ull << 20)

/* Name of the running subcommand, for "ckptctl: CMD: message". */
static const char *g_cmd = NULL;
/* Sizes in bytes rather than KiB/MiB/GiB in tables (--bytes). */
static int g_bytes = 0;
/* Set by SIGINT/SIGTERM; long operations then cancel cleanly. */
static volatile sig_atomic_t g_interrupted = 0;

/* An escaped name; the worst case is 4 output bytes per input byte. */
#define ESC_MAX (4 * CKPT_MAX_NAME + 8)

/* ------------------------------------------------------------------ */
/* Messages                                                           */
/* ------------------------------------------------------------------ */

static void errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

static void errmsg(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	if (g_cmd)
		fprintf(stderr, "ckptctl: %s: ", g_cmd);
	else
		fputs("ckptctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	if (g_cmd)
		fprintf(stderr, "ckptctl: %s: ", g_cmd);
	else
		fputs("ckptctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (g_cmd)
		fprintf(stderr, "Try 'ckptctl %s --help'.\n", g_cmd);
	else
		fputs("Try 'ckptctl --help'.\n", stderr);
	return EXIT_USAGE;
}

/* The library's message for a failure, falling back to the code's text. */
static const char *lib_msg(const char *m, int rc)
{
	return (m && *m) ? m : ckpt_strerror(rc);
}

/* getopt_long reported '?' or ':'; explain it as a usage error. */
static int bad_option(int c, char **argv)
{
	const char *arg = argv[optind - 1];

	if (c == ':')
		return usage_error("option '%s' requires an argument", arg);
	if (optopt)
		return usage_error("unknown option '-%c'", optopt);
	return usage_error("unknown option '%s'", arg);
}

/* ------------------------------------------------------------------ */
/* Formatting helpers                                                 */
/* ------------------------------------------------------------------ */

static const char *fmt_size(uint64_t v, char *buf, size_t len)
{
	static const char *units[] = {
		"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"
	};
	double d = (double)v;
	int u = -1;

	if (g_bytes || v < 1024) {
		snprintf(buf, len, g_bytes ? "%" PRIu64 : "%" PRIu64 " B", v);
		return buf;
	}
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", d, units[u]);
	return buf;
}

static const char *fmt_ratio(uint64_t raw, uint64_t stored, char *buf,
			     size_t len)
{
	if (stored == 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.2fx", (double)raw / (double)stored);
	return buf;
}

static const char *fmt_time(int64_t ns, char *buf, size_t len)
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

static const char *fmt_shape(const uint64_t *shape, uint32_t ndim, char *buf,
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

static json_t *jcheck(json_t *v)
{
	if (!v) {
		errmsg("out of memory");
		exit(1);
	}
	return v;
}

static json_t *ju64(uint64_t v)
{
	char b[32];

	/* json_int_t is signed 64-bit; larger values travel as strings. */
	if (v <= (uint64_t)INT64_MAX)
		return jcheck(json_integer((json_int_t)v));
	snprintf(b, sizeof(b), "%" PRIu64, v);
	return jcheck(json_string(b));
}

/* A string that may not be valid UTF-8: exact when it is, else escaped. */
static json_t *jstr(const char *s)
{
	json_t *v = json_string(s);

	if (!v) {
		static char esc[ESC_MAX];
		v = jcheck(json_string(st_escape(s, esc, sizeof(esc))));
	}
	return v;
}

static json_t *jratio(uint64_t raw, uint64_t stored)
{
	if (stored == 0)
		return json_null();
	return jcheck(json_real((double)raw / (double)stored));
}

static void jset(json_t *o, const char *k, json_t *v)
{
	if (json_object_set_new(o, k, v)) {
		errmsg("out of memory");
		exit(1);
	}
}

static void jappend(json_t *a, json_t *v)
{
	if (json_array_append_new(a, v)) {
		errmsg("out of memory");
		exit(1);
	}
}

static json_t *jshape(const uint64_t *shape, uint32_t ndim)
{
	json_t *a = jcheck(json_array());

	for (uint32_t i = 0; i < ndim; i++)
		jappend(a, ju64(shape[i]));
	return a;
}

static void jprint(json_t *v)
{
	json_dumpf(v, stdout, JSON_INDENT(2));
	fputc('\n', stdout);
	json_decref(v);
}

/* ------------------------------------------------------------------ */
/* Locations                                                          */
/* ------------------------------------------------------------------ */

enum loc_kind { LOC_LOCAL = 0, LOC_GCS = 1 };

/* Where a checkpoint lives: a root and optionally one step of it. */
typedef struct location {
	enum loc_kind kind;
	char *path; /* local directory, or "gs://bucket/prefix" */
	int has_step;
	uint64_t step;
} location;

static void location_free(location *l)
{
	free(l->path);
	l->path = NULL;
}

/*
 * Parses "ROOT" or "ROOT@STEP". The last '@' followed by one or more digits
 * only is a step; anything else is part of the root, so directories with
 * '@' in their names still work. With allow_step == 0 the whole argument
 * is the root. Returns 0, or EXIT_USAGE after printing a usage error
 * (a step that does not fit, an empty root).
 */
static int parse_location(const char *arg, int allow_step, location *l)
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
				return usage_error("step '%s' is out of range",
						   at + 1);
			v = v * 10 + d;
		}
		l->has_step = 1;
		l->step = v;
		rootlen = (size_t)(at - arg);
	}
	if (rootlen == 0)
		return usage_error("empty checkpoint directory in '%s'", arg);
	l->path = strndup(arg, rootlen);
	if (!l->path) {
		errmsg("out of memory");
		exit(1);
	}
	if (strncmp(l->path, "gs://", 5) == 0)
		l->kind = LOC_GCS;
	return 0;
}

/* Checks that the location can be used by this build; prints why not. */
static int location_usable(const location *l, int must_exist)
{
	struct stat st;

	if (l->kind == LOC_GCS) {
		errmsg("%s: gs:// locations are not supported yet", l->path);
		return -1;
	}
	if (must_exist) {
		if (stat(l->path, &st) < 0) {
			errmsg("%s: %s", l->path, strerror(errno));
			return -1;
		}
		if (!S_ISDIR(st.st_mode)) {
			errmsg("%s: not a directory", l->path);
			return -1;
		}
	}
	return 0;
}

/* mkdir -p: import and restore create the destination and its parents. */
static int mkdir_p(const char *path)
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

static uint64_t location_step(const location *l)
{
	return l->has_step ? l->step : CKPT_LATEST;
}

/* Strict unsigned decimal with optional binary suffix (K, M, G, KiB...). */
static int parse_u64(const char *s, uint64_t *out, int allow_suffix)
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
/* Progress                                                           */
/* ------------------------------------------------------------------ */

typedef struct progress {
	pthread_mutex_t mu;
	const char *label;
	int on;    /* stderr is a terminal */
	int shown; /* a progress line is on screen */
	double t0;
	double last;
} progress;

static double now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void progress_init(progress *p, const char *label)
{
	pthread_mutex_init(&p->mu, NULL);
	p->label = label;
	p->on = isatty(STDERR_FILENO);
	p->shown = 0;
	p->t0 = now_sec();
	p->last = 0;
}

/* ckpt_progress_fn; may be called from library worker threads. */
static int progress_fn(void *arg, uint64_t done, uint64_t total)
{
	progress *p = arg;

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
				p->label, pct, fmt_size(done, a, sizeof(a)),
				fmt_size(total, b, sizeof(b)),
				el > 0 ? (double)done / 1e6 / el : 0.0);
			p->shown = 1;
			p->last = t;
		}
		pthread_mutex_unlock(&p->mu);
	}
	return g_interrupted ? 1 : 0;
}

static void progress_end(progress *p)
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
	g_interrupted = 1;
}

/* The first SIGINT/SIGTERM cancels the operation cleanly (temporary files
 * removed, nothing committed); a second one kills as usual. */
static void install_signals(void)
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
static int open_root(const location *l, ckpt **out)
{
	ckpt_settings s;
	int rc;

	if (location_usable(l, 1))
		return -1;
	ckpt_settings_default(&s);
	s.staging_bytes = 0;
	rc = ckpt_open(out, l->path, &s);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(NULL), rc));
		return -1;
	}
	return 0;
}

static int open_reader(const location *l, uint64_t step, ckpt_reader **out)
{
	int rc;

	if (location_usable(l, 1))
		return -1;
	rc = ckpt_reader_open(out, l->path, step, NULL);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_reader_errmsg(NULL), rc));
		return -1;
	}
	return 0;
}

/* Sum of the sizes of the files the commit record lists. */
static void reader_files_total(const ckpt_reader *r, size_t *nfiles,
			       uint64_t *bytes)
{
	ckpt_file_info fi;

	*nfiles = ckpt_reader_file_count(r);
	*bytes = 0;
	for (size_t i = 0; i < *nfiles; i++)
		if (ckpt_reader_file(r, i, &fi) == 0)
			*bytes += fi.size;
}

static const char *kind_name(int kind)
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

/* Common option handling: returns -1 to go on, else an exit status. */
#define COMMON_OPTS                            \
	{                                      \
		"help", no_argument, NULL, 'h' \
	}

/* ------------------------------------------------------------------ */
/* Help texts                                                         */
/* ------------------------------------------------------------------ */

static const char help_main[] =
	"Usage: ckptctl [--help] [--version] COMMAND [ARGS]\n"
	"\n"
	"Inspect, verify and convert ckpt checkpoints.\n"
	"\n"
	"Commands:\n"
	"  ls       list the committed steps of a checkpoint directory\n"
	"  inspect  show a step's tensors, codec totals and files\n"
	"  verify   check every file and chunk of a step against its checksums\n"
	"  restore  copy a step, verified, to another directory\n"
	"  export   write tensors of a step as a safetensors file\n"
	"  import   save a safetensors file as a step\n"
	"  gc       remove old steps and debris by a retention policy\n"
	"\n"
	"Locations: DIR is a checkpoint root directory; DIR@STEP names one step\n"
	"(the last '@' followed by digits only). Without @STEP the latest step\n"
	"is used.\n"
	"\n"
	"Exit status: 0 success, 1 failure, 2 usage error.\n"
	"Run 'ckptctl COMMAND --help' for a command's options and examples.\n";

static const char help_ls[] =
	"Usage: ckptctl ls [OPTIONS] DIR\n"
	"\n"
	"List the committed steps of checkpoint root DIR, oldest first: step,\n"
	"hosts, tensors, raw size, stored size (all files), ratio and commit time\n"
	"(UTC). The latest step is marked with '*'.\n"
	"\n"
	"Options:\n"
	"  -j, --json    machine-readable output (exact byte counts)\n"
	"  -b, --bytes   print sizes in bytes\n"
	"  -h, --help    show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl ls /ckpt/run1\n"
	"  ckptctl ls --json /ckpt/run1\n";

static const char help_inspect[] =
	"Usage: ckptctl inspect [OPTIONS] DIR[@STEP]\n"
	"\n"
	"Show a step (default: the latest): summary, tensors (name, dtype, shape,\n"
	"slices, raw and stored bytes, ratio), totals per codec and files.\n"
	"Control characters in names are escaped in table output; --json output\n"
	"carries names exactly.\n"
	"\n"
	"Options:\n"
	"  -j, --json    machine-readable output\n"
	"  -b, --bytes   print sizes in bytes\n"
	"  -h, --help    show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl inspect /ckpt/run1\n"
	"  ckptctl inspect --json /ckpt/run1@1000\n";

static const char help_verify[] =
	"Usage: ckptctl verify [OPTIONS] DIR[@STEP]\n"
	"\n"
	"Check a step (default: the latest) against its commit record: every\n"
	"file's size and XXH3, every shard and chunk header, every chunk's\n"
	"content hash. Prints 'OK step N: X files, Y bytes verified' or names the\n"
	"first bad place and exits 1.\n"
	"\n"
	"Options:\n"
	"  -a, --all     verify every committed step\n"
	"  -j, --json    machine-readable output\n"
	"  -h, --help    show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl verify /ckpt/run1\n"
	"  ckptctl verify /ckpt/run1@1000\n"
	"  ckptctl verify --all --json /ckpt/run1\n";

static const char help_restore[] =
	"Usage: ckptctl restore [OPTIONS] DIR[@STEP] --to OUTDIR\n"
	"\n"
	"Copy a step (default: the latest) into checkpoint root OUTDIR, checking\n"
	"every file's size and XXH3 while copying. The step is committed at the\n"
	"destination only if everything matched.\n"
	"\n"
	"Options:\n"
	"  -t, --to OUTDIR   destination root directory (created if needed)\n"
	"  -j, --json        machine-readable output\n"
	"  -h, --help        show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl restore /mnt/backup/run1@1000 --to /ckpt/run1\n";

static const char help_export[] =
	"Usage: ckptctl export [OPTIONS] DIR[@STEP] -o FILE\n"
	"\n"
	"Write the tensors of a step (default: the latest) to a safetensors file,\n"
	"tensors in name order (or in --tensor order), metadata ckpt_step and\n"
	"ckpt_source. The file is written as FILE.tmp and renamed when complete.\n"
	"\n"
	"Options:\n"
	"  -f, --format FMT    output format; only 'safetensors' (default)\n"
	"  -o, --output FILE   file to write (required)\n"
	"  -T, --tensor NAME   export only NAME (repeatable)\n"
	"  -j, --json          print a machine-readable summary\n"
	"  -h, --help          show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl export /ckpt/run1@1000 --format safetensors -o model.safetensors\n"
	"  ckptctl export /ckpt/run1 -o emb.safetensors --tensor embed.weight\n";

static const char help_import[] =
	"Usage: ckptctl import [OPTIONS] FILE.safetensors DIR[@STEP]\n"
	"\n"
	"Save every tensor of a safetensors file as step STEP (default 0) of\n"
	"checkpoint root DIR (created if needed). The file is fully validated\n"
	"first (header, dtypes, shapes, offsets, overlaps).\n"
	"\n"
	"Options:\n"
	"  -c, --codec none|zstd|float   chunk codec (default float)\n"
	"  -l, --level N                 zstd level (default 1)\n"
	"  -C, --chunk BYTES             chunk size, e.g. 4M (64K..64M, multiple\n"
	"                                of 4096; default 4M)\n"
	"  -j, --json                    print a machine-readable summary\n"
	"  -h, --help                    show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl import model.safetensors /ckpt/run1\n"
	"  ckptctl import --codec zstd --level 3 model.safetensors /ckpt/run1@500\n";

static const char help_gc[] =
	"Usage: ckptctl gc [OPTIONS] DIR --keep N\n"
	"\n"
	"Remove committed steps outside the retention policy and uncommitted\n"
	"debris older than the newest committed step. Kept: the newest N steps\n"
	"(0 = all), every step divisible by K (--keep-every) and always the\n"
	"newest step.\n"
	"\n"
	"Options:\n"
	"  -k, --keep N          keep the newest N committed steps (required)\n"
	"  -e, --keep-every K    also keep steps divisible by K\n"
	"  -n, --dry-run         report what would be removed, remove nothing\n"
	"  -j, --json            machine-readable output\n"
	"  -h, --help            show this help\n"
	"\n"
	"Examples:\n"
	"  ckptctl gc /ckpt/run1 --keep 3\n"
	"  ckptctl gc /ckpt/run1 --keep 2 --keep-every 1000 --dry-run\n";

/* ------------------------------------------------------------------ */
/* ls                                                                 */
/* ------------------------------------------------------------------ */

static int cmd_ls(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "bytes", no_argument, NULL, 'b' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	int c, json = 0, rc, ret = 1, have_latest;
	location loc = { 0 };
	ckpt *h = NULL;
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	uint64_t latest = 0;

	while ((c = getopt_long(argc, argv, ":jbh", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'b':
			g_bytes = 1;
			break;
		case 'h':
			fputs(help_ls, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1)
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR");
	if ((rc = parse_location(argv[optind], 0, &loc)))
		return rc;
	if (open_root(&loc, &h))
		goto out;
	rc = ckpt_list(h, &steps, &n);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
		goto out;
	}
	rc = ckpt_latest(h, &latest);
	if (rc && rc != CKPT_E_NOTFOUND) {
		errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
		goto out;
	}
	have_latest = rc == 0;

	if (json) {
		json_t *root = jcheck(json_object()),
		       *arr = jcheck(json_array());
		jset(root, "root", jstr(loc.path));
		jset(root, "latest", have_latest ? ju64(latest) : json_null());
		for (size_t i = 0; i < n; i++) {
			const ckpt_step_info *s = &steps[i];
			json_t *o = jcheck(json_object());
			char t[64];
			jset(o, "step", ju64(s->step));
			jset(o, "hosts", ju64(s->host_count));
			jset(o, "files", ju64(s->file_count));
			jset(o, "tensors", ju64(s->tensor_count));
			jset(o, "raw_bytes", ju64(s->raw_bytes));
			jset(o, "stored_bytes", ju64(s->stored_bytes));
			jset(o, "ratio", jratio(s->raw_bytes, s->stored_bytes));
			jset(o, "commit_unix_ns",
			     jcheck(json_integer(s->commit_unix_ns)));
			jset(o, "time",
			     jstr(fmt_time(s->commit_unix_ns, t, sizeof(t))));
			jset(o, "latest",
			     json_boolean(have_latest && s->step == latest));
			jappend(arr, o);
		}
		jset(root, "steps", arr);
		jprint(root);
	} else if (n == 0) {
		printf("no committed steps in %s\n", loc.path);
	} else {
		printf("%-22s %5s %8s %11s %11s %8s  %s\n", "STEP", "HOSTS",
		       "TENSORS", "RAW", "STORED", "RATIO", "TIME (UTC)");
		for (size_t i = 0; i < n; i++) {
			const ckpt_step_info *s = &steps[i];
			char st[32], a[32], b[32], r[32], t[64];
			snprintf(st, sizeof(st), "%" PRIu64 "%s", s->step,
				 have_latest && s->step == latest ? " *" : "");
			printf("%-22s %5u %8" PRIu64 " %11s %11s %8s  %s\n", st,
			       s->host_count, s->tensor_count,
			       fmt_size(s->raw_bytes, a, sizeof(a)),
			       fmt_size(s->stored_bytes, b, sizeof(b)),
			       fmt_ratio(s->raw_bytes, s->stored_bytes, r,
					 sizeof(r)),
			       fmt_time(s->commit_unix_ns, t, sizeof(t)));
		}
		printf("%zu committed step%s; * = latest\n", n,
		       n == 1 ? "" : "s");
	}
	ret = 0;
out:
	ckpt_free(steps);
	ckpt_close(h);
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* inspect                                                            */
/* ------------------------------------------------------------------ */

static int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "bytes", no_argument, NULL, 'b' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	int c, json = 0, rc, ret = 1;
	location loc = { 0 };
	ckpt_reader *r = NULL;
	ckpt_stats stats;
	size_t nt, nf, shape_w = 5;
	uint64_t file_bytes;
	static char esc[ESC_MAX];

	while ((c = getopt_long(argc, argv, ":jbh", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'b':
			g_bytes = 1;
			break;
		case 'h':
			fputs(help_inspect, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1)
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR[@STEP]");
	if ((rc = parse_location(argv[optind], 1, &loc)))
		return rc;
	if (open_reader(&loc, location_step(&loc), &r))
		goto out;
	rc = ckpt_reader_stats(r, &stats);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_reader_errmsg(r), rc));
		goto out;
	}
	nt = ckpt_reader_tensor_count(r);
	reader_files_total(r, &nf, &file_bytes);

	if (json) {
		json_t *root = jcheck(json_object()),
		       *ta = jcheck(json_array());
		json_t *codecs = jcheck(json_object()),
		       *fa = jcheck(json_array());
		char t[64];

		jset(root, "root", jstr(loc.path));
		jset(root, "step", ju64(ckpt_reader_step(r)));
		jset(root, "hosts", ju64(ckpt_reader_host_count(r)));
		jset(root, "commit_unix_ns",
		     jcheck(json_integer(ckpt_reader_commit_time(r))));
		jset(root, "time",
		     jstr(fmt_time(ckpt_reader_commit_time(r), t, sizeof(t))));
		jset(root, "tensor_count", ju64(nt));
		jset(root, "raw_bytes", ju64(stats.raw_bytes));
		jset(root, "stored_bytes", ju64(stats.stored_bytes));
		jset(root, "file_bytes", ju64(stats.file_bytes));
		jset(root, "ratio",
		     jratio(stats.raw_bytes, stats.stored_bytes));
		jset(root, "chunks", ju64(stats.chunks));
		for (size_t i = 0; i < nt; i++) {
			ckpt_tensor_info ti;
			json_t *o, *sl;
			if ((rc = ckpt_reader_tensor(r, i, &ti))) {
				errmsg("%s",
				       lib_msg(ckpt_reader_errmsg(r), rc));
				json_decref(root);
				json_decref(ta);
				json_decref(codecs);
				json_decref(fa);
				goto out;
			}
			o = jcheck(json_object());
			sl = jcheck(json_array());
			jset(o, "name", jstr(ti.name));
			jset(o, "dtype",
			     jstr(ckpt_dtype_name(ti.dtype) ?
					  ckpt_dtype_name(ti.dtype) :
					  "?"));
			jset(o, "safetensors_dtype",
			     st_dtype_name(ti.dtype) ?
				     jstr(st_dtype_name(ti.dtype)) :
				     json_null());
			jset(o, "shape", jshape(ti.shape, ti.ndim));
			jset(o, "nbytes", ju64(ti.nbytes));
			jset(o, "stored_bytes", ju64(ti.stored_bytes));
			jset(o, "ratio", jratio(ti.nbytes, ti.stored_bytes));
			jset(o, "slice_count", ju64(ti.slice_count));
			for (uint32_t j = 0; j < ti.slice_count; j++) {
				ckpt_slice_info si;
				json_t *so;
				if (ckpt_reader_slice(r, i, j, &si))
					continue;
				so = jcheck(json_object());
				jset(so, "host", ju64(si.host));
				jset(so, "offset", jshape(si.offset, ti.ndim));
				jset(so, "extent", jshape(si.extent, ti.ndim));
				jset(so, "nbytes", ju64(si.nbytes));
				jappend(sl, so);
			}
			jset(o, "slices", sl);
			jappend(ta, o);
		}
		jset(root, "tensors", ta);
		for (int k = 0; k < CKPT_CODEC_COUNT; k++) {
			json_t *o = jcheck(json_object());
			jset(o, "chunks", ju64(stats.chunks_by_codec[k]));
			jset(o, "raw_bytes", ju64(stats.raw_by_codec[k]));
			jset(o, "stored_bytes", ju64(stats.stored_by_codec[k]));
			jset(o, "ratio",
			     jratio(stats.raw_by_codec[k],
				    stats.stored_by_codec[k]));
			jset(codecs,
			     ckpt_codec_name(k) ? ckpt_codec_name(k) : "?", o);
		}
		jset(root, "codecs", codecs);
		for (size_t i = 0; i < nf; i++) {
			ckpt_file_info fi;
			json_t *o;
			char x[24];
			if (ckpt_reader_file(r, i, &fi))
				continue;
			o = jcheck(json_object());
			snprintf(x, sizeof(x), "%016" PRIx64, fi.xxh3);
			jset(o, "name", jstr(fi.name));
			jset(o, "host", ju64(fi.host));
			jset(o, "kind", jstr(kind_name(fi.kind)));
			jset(o, "size", ju64(fi.size));
			jset(o, "xxh3", jstr(x));
			jappend(fa, o);
		}
		jset(root, "files", fa);
		jprint(root);
		ret = 0;
		goto out;
	}

	{
		char a[32], b[32], q[32], t[64];
		printf("step %" PRIu64 " of %s\n", ckpt_reader_step(r),
		       st_escape(loc.path, esc, sizeof(esc)));
		printf("  committed  %s\n",
		       fmt_time(ckpt_reader_commit_time(r), t, sizeof(t)));
		printf("  hosts      %u\n", ckpt_reader_host_count(r));
		printf("  tensors    %zu\n", nt);
		printf("  raw        %s\n",
		       fmt_size(stats.raw_bytes, a, sizeof(a)));
		printf("  stored     %s in %" PRIu64 " chunks (ratio %s)\n",
		       fmt_size(stats.stored_bytes, b, sizeof(b)), stats.chunks,
		       fmt_ratio(stats.raw_bytes, stats.stored_bytes, q,
				 sizeof(q)));
		printf("  files      %zu, %s\n", nf,
		       fmt_size(file_bytes, a, sizeof(a)));
	}

	/* Shapes vary in width; size that column, keep the name last. */
	for (size_t i = 0; i < nt; i++) {
		ckpt_tensor_info ti;
		char sh[512];
		if (ckpt_reader_tensor(r, i, &ti) == 0) {
			size_t w = strlen(
				fmt_shape(ti.shape, ti.ndim, sh, sizeof(sh)));
			if (w > shape_w)
				shape_w = w;
		}
	}
	printf("\nTENSORS\n%-7s %-*s %6s %11s %11s %8s  %s\n", "DTYPE",
	       (int)shape_w, "SHAPE", "SLICES", "RAW", "STORED", "RATIO",
	       "NAME");
	for (size_t i = 0; i < nt; i++) {
		ckpt_tensor_info ti;
		char sh[512], a[32], b[32], q[32];
		const char *dn;
		if ((rc = ckpt_reader_tensor(r, i, &ti))) {
			errmsg("%s", lib_msg(ckpt_reader_errmsg(r), rc));
			goto out;
		}
		dn = ckpt_dtype_name(ti.dtype);
		printf("%-7s %-*s %6u %11s %11s %8s  %s\n", dn ? dn : "?",
		       (int)shape_w,
		       fmt_shape(ti.shape, ti.ndim, sh, sizeof(sh)),
		       ti.slice_count, fmt_size(ti.nbytes, a, sizeof(a)),
		       fmt_size(ti.stored_bytes, b, sizeof(b)),
		       fmt_ratio(ti.nbytes, ti.stored_bytes, q, sizeof(q)),
		       st_escape(ti.name, esc, sizeof(esc)));
	}
	printf("\nCODECS\n%-7s %8s %11s %11s %8s\n", "CODEC", "CHUNKS", "RAW",
	       "STORED", "RATIO");
	for (int k = 0; k < CKPT_CODEC_COUNT; k++) {
		char a[32], b[32], q[32];
		const char *cn = ckpt_codec_name(k);
		if (stats.chunks_by_codec[k] == 0)
			continue;
		printf("%-7s %8" PRIu64 " %11s %11s %8s\n", cn ? cn : "?",
		       stats.chunks_by_codec[k],
		       fmt_size(stats.raw_by_codec[k], a, sizeof(a)),
		       fmt_size(stats.stored_by_codec[k], b, sizeof(b)),
		       fmt_ratio(stats.raw_by_codec[k],
				 stats.stored_by_codec[k], q, sizeof(q)));
	}
	printf("\nFILES\n%-6s %5s %11s %-16s  %s\n", "KIND", "HOST", "SIZE",
	       "XXH3", "NAME");
	for (size_t i = 0; i < nf; i++) {
		ckpt_file_info fi;
		char a[32];
		if (ckpt_reader_file(r, i, &fi))
			continue;
		printf("%-6s %5u %11s %016" PRIx64 "  %s\n", kind_name(fi.kind),
		       fi.host, fmt_size(fi.size, a, sizeof(a)), fi.xxh3,
		       st_escape(fi.name, esc, sizeof(esc)));
	}
	ret = 0;
out:
	ckpt_reader_close(r);
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* verify                                                             */
/* ------------------------------------------------------------------ */

/* Verifies one step; fills a JSON result when res != NULL. 0 = OK. */
static int verify_one(const location *loc, uint64_t step, json_t *res,
		      int quiet_ok)
{
	ckpt_reader *r = NULL;
	progress p;
	size_t nf = 0;
	uint64_t bytes = 0;
	int rc;
	char label[64];

	if (location_usable(loc, 1))
		return -1;
	rc = ckpt_reader_open(&r, loc->path, step, NULL);
	if (rc) {
		const char *m = lib_msg(ckpt_reader_errmsg(NULL), rc);
		if (res) {
			if (step != CKPT_LATEST)
				jset(res, "step", ju64(step));
			jset(res, "ok", json_false());
			jset(res, "error", jstr(m));
		}
		errmsg("%s", m);
		return -1;
	}
	step = ckpt_reader_step(r);
	reader_files_total(r, &nf, &bytes);
	snprintf(label, sizeof(label), "verify step %" PRIu64, step);
	progress_init(&p, label);
	rc = ckpt_reader_verify(r, progress_fn, &p);
	progress_end(&p);
	if (res) {
		jset(res, "step", ju64(step));
		jset(res, "ok", json_boolean(rc == 0));
		jset(res, "files", ju64(nf));
		jset(res, "bytes", ju64(bytes));
		if (rc)
			jset(res, "error",
			     jstr(lib_msg(ckpt_reader_errmsg(r), rc)));
	}
	if (rc)
		errmsg("%s", lib_msg(ckpt_reader_errmsg(r), rc));
	else if (!quiet_ok)
		printf("OK step %" PRIu64 ": %zu files, %" PRIu64
		       " bytes verified\n",
		       step, nf, bytes);
	ckpt_reader_close(r);
	return rc ? -1 : 0;
}

static int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = { { "json", no_argument, NULL,
						'j' },
					      { "all", no_argument, NULL, 'a' },
					      COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	int c, json = 0, all = 0, rc, ret = 1;
	location loc = { 0 };

	while ((c = getopt_long(argc, argv, ":jah", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'a':
			all = 1;
			break;
		case 'h':
			fputs(help_verify, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1)
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR[@STEP]");
	if ((rc = parse_location(argv[optind], 1, &loc)))
		return rc;
	if (all && loc.has_step) {
		location_free(&loc);
		return usage_error(
			"--all verifies every step; do not name one");
	}
	install_signals();

	if (!all) {
		json_t *res = json ? jcheck(json_object()) : NULL;
		ret = verify_one(&loc, location_step(&loc), res, json) ? 1 : 0;
		if (res)
			jprint(res);
	} else {
		ckpt *h = NULL;
		ckpt_step_info *steps = NULL;
		size_t n = 0, bad = 0;
		json_t *root = NULL, *arr = NULL;

		if (open_root(&loc, &h))
			goto out;
		rc = ckpt_list(h, &steps, &n);
		if (rc) {
			errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
			ckpt_close(h);
			goto out;
		}
		ckpt_close(h);
		if (json) {
			root = jcheck(json_object());
			arr = jcheck(json_array());
		}
		for (size_t i = 0; i < n && !g_interrupted; i++) {
			json_t *res = json ? jcheck(json_object()) : NULL;
			if (verify_one(&loc, steps[i].step, res, json))
				bad++;
			if (res)
				jappend(arr, res);
		}
		if (json) {
			jset(root, "ok", json_boolean(bad == 0 && n > 0));
			jset(root, "steps_verified", ju64(n));
			jset(root, "steps_failed", ju64(bad));
			jset(root, "results", arr);
			jprint(root);
		} else if (n > 0) {
			printf("%zu of %zu steps OK\n", n - bad, n);
		}
		if (n == 0)
			errmsg("%s: no committed steps", loc.path);
		ckpt_free(steps);
		ret = (bad == 0 && n > 0) ? 0 : 1;
	}
out:
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* restore                                                            */
/* ------------------------------------------------------------------ */

static int cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "to", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	int c, json = 0, rc, ret = 1;
	const char *to = NULL;
	location loc = { 0 }, dst = { 0 };
	ckpt_reader *r = NULL;
	progress p;
	size_t nf;
	uint64_t bytes, step;
	char label[64];

	while ((c = getopt_long(argc, argv, ":t:jh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			to = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			fputs(help_restore, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1)
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR[@STEP]");
	if (!to)
		return usage_error("missing --to OUTDIR");
	if ((rc = parse_location(argv[optind], 1, &loc)))
		return rc;
	if ((rc = parse_location(to, 0, &dst))) {
		location_free(&loc);
		return rc;
	}
	if (location_usable(&dst, 0))
		goto out;
	{
		/* Copying a step onto itself would truncate what it reads. */
		char *a = realpath(loc.path, NULL),
		     *b = realpath(dst.path, NULL);
		int same = a && b && strcmp(a, b) == 0;
		free(a);
		free(b);
		if (same) {
			errmsg("source and destination are the same directory");
			goto out;
		}
	}
	install_signals();
	if (open_reader(&loc, location_step(&loc), &r))
		goto out;
	if ((rc = mkdir_p(dst.path))) {
		errmsg("%s: %s", dst.path, strerror(-rc));
		goto out;
	}
	step = ckpt_reader_step(r);
	reader_files_total(r, &nf, &bytes);
	snprintf(label, sizeof(label), "restore step %" PRIu64, step);
	progress_init(&p, label);
	rc = ckpt_reader_copy(r, dst.path, progress_fn, &p);
	progress_end(&p);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_reader_errmsg(r), rc));
		goto out;
	}
	if (json) {
		json_t *o = jcheck(json_object());
		jset(o, "step", ju64(step));
		jset(o, "source", jstr(loc.path));
		jset(o, "destination", jstr(dst.path));
		jset(o, "files", ju64(nf));
		jset(o, "bytes", ju64(bytes));
		jprint(o);
	} else {
		static char esc[ESC_MAX];
		printf("restored step %" PRIu64 " to %s: %zu files, %" PRIu64
		       " bytes verified\n",
		       step, st_escape(dst.path, esc, sizeof(esc)), nf, bytes);
	}
	ret = 0;
out:
	ckpt_reader_close(r);
	location_free(&loc);
	location_free(&dst);
	return ret;
}

/* ------------------------------------------------------------------ */
/* export                                                             */
/* ------------------------------------------------------------------ */

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

typedef struct export_ctx {
	ckpt_reader *r;
	int fd;
	const char *tmp;
	uint8_t *buf;
	size_t cap;
	uint64_t done, total;
	uint64_t piece; /* largest read; EXPORT_PIECE unless testing */
	progress *p;
} export_ctx;

static int ensure_cap(export_ctx *x, uint64_t n)
{
	void *nb;

	if (n <= x->cap)
		return 0;
	nb = realloc(x->buf, n);
	if (!nb) {
		errmsg("out of memory (%" PRIu64 " bytes)", n);
		return -1;
	}
	x->buf = nb;
	x->cap = n;
	return 0;
}

static int export_write(export_ctx *x, uint64_t n)
{
	int rc = write_all(x->fd, x->buf, n);

	if (rc) {
		errmsg("%s: %s", x->tmp, strerror(-rc));
		return -1;
	}
	x->done += n;
	if (progress_fn(x->p, x->done, x->total)) {
		errmsg("interrupted");
		return -1;
	}
	return 0;
}

/*
 * Streams one tensor in row-major order. Tensors up to EXPORT_PIECE are
 * read whole; larger ones as boxes: the innermost dimensions that fit in a
 * piece are taken whole, the next one in blocks, the outer ones one index
 * at a time, so the concatenation of the boxes is the row-major array.
 */
static int export_tensor(export_ctx *x, const ckpt_tensor_info *ti)
{
	uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM], inner, k;
	uint32_t d;
	int rc;

	if (ti->nbytes == 0)
		return 0;
	if (ti->nbytes <= x->piece || ti->ndim == 0) {
		if (ensure_cap(x, ti->nbytes))
			return -1;
		rc = ckpt_read(x->r, ti->name, x->buf, ti->nbytes);
		if (rc)
			goto fail;
		return export_write(x, ti->nbytes);
	}
	inner = ckpt_dtype_size(ti->dtype);
	d = ti->ndim - 1;
	while (d > 0 && ti->shape[d] <= x->piece / inner) {
		inner *= ti->shape[d];
		d--;
	}
	k = x->piece / inner;
	if (k == 0)
		k = 1;
	for (uint32_t i = 0; i < ti->ndim; i++) {
		off[i] = 0;
		ext[i] = i < d ? 1 : ti->shape[i];
	}
	if (ensure_cap(x, (k < ti->shape[d] ? k : ti->shape[d]) * inner))
		return -1;
	for (;;) {
		int i;
		for (uint64_t j = 0; j < ti->shape[d]; j += k) {
			uint64_t n;
			off[d] = j;
			ext[d] = ti->shape[d] - j < k ? ti->shape[d] - j : k;
			n = ext[d] * inner;
			rc = ckpt_read_slice(x->r, ti->name, off, ext, x->buf,
					     n);
			if (rc)
				goto fail;
			if (export_write(x, n))
				return -1;
		}
		off[d] = 0;
		for (i = (int)d - 1; i >= 0; i--) {
			if (++off[i] < ti->shape[i])
				break;
			off[i] = 0;
		}
		if (i < 0)
			break;
	}
	return 0;
fail:
	errmsg("%s", lib_msg(ckpt_reader_errmsg(x->r), rc));
	return -1;
}

static int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' },
		{ "output", required_argument, NULL, 'o' },
		{ "tensor", required_argument, NULL, 'T' },
		{ "json", no_argument, NULL, 'j' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	static char esc[ESC_MAX];
	int c, json = 0, rc, ret = 1;
	const char *out_path = NULL;
	const char **names = NULL;
	size_t nnames = 0, count = 0;
	location loc = { 0 };
	ckpt_reader *r = NULL;
	size_t *idx = NULL;
	st_entry *ent = NULL;
	ckpt_tensor_info *infos = NULL;
	char *hdr = NULL, *tmp = NULL, *src = NULL;
	size_t hdrlen = 0;
	char stepbuf[32], err[1024];
	export_ctx x = { 0 };
	progress p;
	int have_progress = 0;
	const char *piece_env = getenv("CKPTCTL_EXPORT_PIECE");

	x.fd = -1;
	x.piece = EXPORT_PIECE;
	/* Test hook: tiny pieces exercise the huge-tensor path on small data. */
	if (piece_env && (parse_u64(piece_env, &x.piece, 1) || x.piece == 0))
		x.piece = EXPORT_PIECE;
	names = calloc((size_t)argc, sizeof(*names));
	if (!names) {
		errmsg("out of memory");
		return 1;
	}
	while ((c = getopt_long(argc, argv, ":f:o:T:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			if (strcmp(optarg, "safetensors") != 0) {
				free(names);
				return usage_error(
					"unsupported format '%s' (only 'safetensors')",
					optarg);
			}
			break;
		case 'o':
			out_path = optarg;
			break;
		case 'T':
			names[nnames++] = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			fputs(help_export, stdout);
			free(names);
			return 0;
		default:
			free(names);
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1) {
		free(names);
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR[@STEP]");
	}
	if (!out_path || !*out_path) {
		free(names);
		return usage_error("missing -o FILE");
	}
	if ((rc = parse_location(argv[optind], 1, &loc))) {
		free(names);
		return rc;
	}
	install_signals();
	if (open_reader(&loc, location_step(&loc), &r))
		goto out;

	/* Which tensors, in which order. */
	if (nnames) {
		count = nnames;
		idx = calloc(count, sizeof(*idx));
		if (!idx)
			goto oom;
		for (size_t i = 0; i < nnames; i++) {
			rc = ckpt_reader_find(r, names[i], &idx[i]);
			if (rc) {
				errmsg("tensor \"%s\" not found in step %" PRIu64,
				       st_escape(names[i], esc, sizeof(esc)),
				       ckpt_reader_step(r));
				goto out;
			}
			for (size_t j = 0; j < i; j++) {
				if (idx[j] == idx[i]) {
					errmsg("tensor \"%s\" named twice",
					       st_escape(names[i], esc,
							 sizeof(esc)));
					goto out;
				}
			}
		}
	} else {
		count = ckpt_reader_tensor_count(r);
		idx = calloc(count ? count : 1, sizeof(*idx));
		if (!idx)
			goto oom;
		for (size_t i = 0; i < count; i++)
			idx[i] = i;
	}
	ent = calloc(count ? count : 1, sizeof(*ent));
	infos = calloc(count ? count : 1, sizeof(*infos));
	if (!ent || !infos)
		goto oom;
	for (size_t i = 0; i < count; i++) {
		rc = ckpt_reader_tensor(r, idx[i], &infos[i]);
		if (rc) {
			errmsg("%s", lib_msg(ckpt_reader_errmsg(r), rc));
			goto out;
		}
		ent[i].name = infos[i].name;
		ent[i].dtype = infos[i].dtype;
		ent[i].ndim = infos[i].ndim;
		ent[i].shape = infos[i].shape;
		ent[i].nbytes = infos[i].nbytes;
		x.total += infos[i].nbytes;
	}
	snprintf(stepbuf, sizeof(stepbuf), "%" PRIu64, ckpt_reader_step(r));
	src = realpath(loc.path, NULL);
	{
		const char *meta[] = { "ckpt_step", stepbuf, "ckpt_source",
				       src ? src : loc.path };
		if (st_header_build(ent, count, meta, 2, &hdr, &hdrlen, err,
				    sizeof(err))) {
			errmsg("%s", err);
			goto out;
		}
	}

	if (asprintf(&tmp, "%s.tmp", out_path) < 0) {
		tmp = NULL;
		goto oom;
	}
	x.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (x.fd < 0) {
		errmsg("%s: %s", tmp, strerror(errno));
		goto out;
	}
	x.r = r;
	x.tmp = tmp;
	rc = write_all(x.fd, hdr, hdrlen);
	if (rc) {
		errmsg("%s: %s", tmp, strerror(-rc));
		goto out;
	}
	progress_init(&p, "export");
	have_progress = 1;
	x.p = &p;
	for (size_t i = 0; i < count; i++)
		if (export_tensor(&x, &infos[i]))
			goto out;
	progress_end(&p);
	have_progress = 0;
	if (fsync(x.fd) < 0 || close(x.fd) < 0) {
		x.fd = -1;
		errmsg("%s: %s", tmp, strerror(errno));
		goto out;
	}
	x.fd = -1;
	if (rename(tmp, out_path) < 0) {
		errmsg("rename %s -> %s: %s", tmp, out_path, strerror(errno));
		goto out;
	}
	if (json) {
		json_t *o = jcheck(json_object());
		jset(o, "step", ju64(ckpt_reader_step(r)));
		jset(o, "file", jstr(out_path));
		jset(o, "tensors", ju64(count));
		jset(o, "data_bytes", ju64(x.total));
		jset(o, "file_bytes", ju64(hdrlen + x.total));
		jprint(o);
	} else {
		printf("exported %zu tensor%s (%" PRIu64
		       " bytes) of step %" PRIu64 " to %s\n",
		       count, count == 1 ? "" : "s", x.total,
		       ckpt_reader_step(r),
		       st_escape(out_path, esc, sizeof(esc)));
	}
	ret = 0;
	goto out;
oom:
	errmsg("out of memory");
out:
	if (have_progress)
		progress_end(&p);
	if (x.fd >= 0)
		close(x.fd);
	if (ret && tmp)
		unlink(tmp);
	free(x.buf);
	free(tmp);
	free(hdr);
	free(src);
	free(ent);
	free(infos);
	free(idx);
	free(names);
	ckpt_reader_close(r);
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* import                                                             */
/* ------------------------------------------------------------------ */

typedef struct poll_ctx {
	ckpt *h;
	progress *p;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
	int status; /* a failure ckpt_poll collected (then ckpt_wait won't) */
} poll_ctx;

static void *poll_thread(void *arg)
{
	poll_ctx *pc = arg;

	pthread_mutex_lock(&pc->mu);
	while (!pc->stop) {
		struct timespec ts;
		ckpt_progress pr;
		int rc;

		pthread_mutex_unlock(&pc->mu);
		memset(&pr, 0, sizeof(pr));
		rc = ckpt_poll(pc->h, &pr);
		if (rc < 0 && pc->status == 0)
			pc->status = rc;
		if (pr.bytes_total)
			progress_fn(pc->p, pr.bytes_written, pr.bytes_total);
		pthread_mutex_lock(&pc->mu);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (!pc->stop)
			pthread_cond_timedwait(&pc->cv, &pc->mu, &ts);
	}
	pthread_mutex_unlock(&pc->mu);
	return NULL;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static int cmd_import(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "codec", required_argument, NULL, 'c' },
		{ "level", required_argument, NULL, 'l' },
		{ "chunk", required_argument, NULL, 'C' },
		{ "json", no_argument, NULL, 'j' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	static char esc[ESC_MAX];
	int c, json = 0, rc, ret = 1, codec = -1, have_level = 0,
	       thread_started = 0;
	int64_t level = 0;
	uint64_t chunk = 0, stream = 0, total = 0, step;
	location loc = { 0 };
	st_file f;
	int f_open = 0;
	ckpt_tensor *ts = NULL;
	ckpt_settings s;
	ckpt *h = NULL;
	char err[1024];
	progress p;
	poll_ctx pc;
	pthread_t th;

	while ((c = getopt_long(argc, argv, ":c:l:C:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			codec = ckpt_codec_from_name(optarg);
			if (codec < 0)
				return usage_error(
					"unknown codec '%s' (none, zstd or float)",
					optarg);
			break;
		case 'l': {
			char *end;
			errno = 0;
			level = strtoll(optarg, &end, 10);
			if (errno || !*optarg || *end || level < INT32_MIN ||
			    level > INT32_MAX)
				return usage_error("bad --level '%s'", optarg);
			have_level = 1;
			break;
		}
		case 'C':
			if (parse_u64(optarg, &chunk, 1) || chunk == 0 ||
			    chunk > UINT32_MAX)
				return usage_error("bad --chunk '%s'", optarg);
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			fputs(help_import, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 2)
		return usage_error(
			argc - optind > 2 ?
				"too many arguments" :
				"expected FILE.safetensors DIR[@STEP]");
	if ((rc = parse_location(argv[optind + 1], 1, &loc)))
		return rc;
	if (location_usable(&loc, 0))
		goto out;
	step = loc.has_step ? loc.step : 0;

	if (st_open(&f, argv[optind], err, sizeof(err))) {
		errmsg("%s", err);
		goto out;
	}
	f_open = 1;
	ts = calloc(f.count ? f.count : 1, sizeof(*ts));
	if (!ts) {
		errmsg("out of memory");
		goto out;
	}
	for (size_t i = 0; i < f.count; i++) {
		const st_tensor *t = &f.tensors[i];
		ts[i].name = t->name;
		ts[i].dtype = t->dtype;
		ts[i].ndim = t->ndim;
		ts[i].shape = t->shape;
		ts[i].data = f.data + t->begin;
		ts[i].nbytes = t->end - t->begin;
		stream += round_up(ts[i].nbytes, 64);
		total += ts[i].nbytes;
	}

	ckpt_settings_default(&s);
	if (codec >= 0)
		s.codec = codec;
	if (have_level)
		s.level = (int32_t)level;
	if (chunk)
		s.chunk_bytes = (uint32_t)chunk;
	/* A pool as big as the data (up to IMPORT_POOL_MAX) lets the copy run
	 * ahead of the writer; small files do not need the default 512 MiB. */
	{
		uint64_t cb = s.chunk_bytes ? s.chunk_bytes : (4u << 20);
		uint64_t pool = round_up(stream, cb) + cb;
		if (pool < 4 * cb)
			pool = 4 * cb;
		if (pool > IMPORT_POOL_MAX)
			pool = IMPORT_POOL_MAX > 4 * cb ? IMPORT_POOL_MAX :
							  4 * cb;
		s.staging_bytes = pool;
	}
	if ((rc = mkdir_p(loc.path))) {
		errmsg("%s: %s", loc.path, strerror(-rc));
		goto out;
	}
	rc = ckpt_open(&h, loc.path, &s);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(NULL), rc));
		goto out;
	}

	/* No SIGINT handler here: a save cannot be cancelled, and an
	 * interrupted import leaves only uncommitted debris for gc. */
	progress_init(&p, "import");
	memset(&pc, 0, sizeof(pc));
	memset(&th, 0, sizeof(th));
	pc.h = h;
	pc.p = &p;
	if (p.on) {
		pthread_mutex_init(&pc.mu, NULL);
		pthread_cond_init(&pc.cv, NULL);
		thread_started = pthread_create(&th, NULL, poll_thread, &pc) ==
				 0;
	}
	rc = ckpt_save(h, step, ts, f.count);
	if (rc == 0) {
		rc = ckpt_wait(h);
		if (thread_started) {
			pthread_mutex_lock(&pc.mu);
			pc.stop = 1;
			pthread_cond_signal(&pc.cv);
			pthread_mutex_unlock(&pc.mu);
			pthread_join(th, NULL);
			thread_started = 0;
			if (rc == 0 && pc.status)
				rc = pc.status;
		}
	}
	if (thread_started) {
		pthread_mutex_lock(&pc.mu);
		pc.stop = 1;
		pthread_cond_signal(&pc.cv);
		pthread_mutex_unlock(&pc.mu);
		pthread_join(th, NULL);
	}
	if (p.on) {
		pthread_mutex_destroy(&pc.mu);
		pthread_cond_destroy(&pc.cv);
	}
	progress_end(&p);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
		goto out;
	}
	rc = ckpt_close(h);
	h = NULL;
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(NULL), rc));
		goto out;
	}
	if (json) {
		json_t *o = jcheck(json_object());
		jset(o, "file", jstr(argv[optind]));
		jset(o, "root", jstr(loc.path));
		jset(o, "step", ju64(step));
		jset(o, "tensors", ju64(f.count));
		jset(o, "bytes", ju64(total));
		jprint(o);
	} else {
		static char esc2[ESC_MAX];
		printf("imported %zu tensor%s (%" PRIu64
		       " bytes) from %s into %s as step %" PRIu64 "\n",
		       f.count, f.count == 1 ? "" : "s", total,
		       st_escape(argv[optind], esc, sizeof(esc)),
		       st_escape(loc.path, esc2, sizeof(esc2)), step);
	}
	ret = 0;
out:
	ckpt_close(h);
	free(ts);
	if (f_open)
		st_close(&f);
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* gc                                                                 */
/* ------------------------------------------------------------------ */

/* What ckpt_gc reports step by step: printed as it comes, or collected
 * for --json. */
typedef struct gc_out {
	int json, dry;
	json_t *removed; /* committed steps removed by retention */
	json_t *debris;  /* uncommitted step directories removed */
} gc_out;

static void gc_step(void *arg, uint64_t step, int committed, uint64_t bytes)
{
	gc_out *o = arg;

	(void)bytes;
	if (o->json) {
		jappend(committed ? o->removed : o->debris, ju64(step));
		return;
	}
	printf("%s %sstep %" PRIu64 "\n", o->dry ? "would remove" : "removed",
	       committed ? "" : "uncommitted ", step);
	fflush(stdout);
}

static int cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "keep", required_argument, NULL, 'k' },
		{ "keep-every", required_argument, NULL, 'e' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	int c, json = 0, dry = 0, have_keep = 0, rc, ret = 1;
	uint64_t keep = 0, every = 0;
	location loc = { 0 };
	ckpt *h = NULL;
	ckpt_step_info *before = NULL;
	size_t nb = 0;
	ckpt_gc_report rep;
	gc_out go = { 0 };

	while ((c = getopt_long(argc, argv, ":k:e:njh", opts, NULL)) != -1) {
		switch (c) {
		case 'k':
			if (parse_u64(optarg, &keep, 0) || keep > UINT32_MAX)
				return usage_error("bad --keep '%s'", optarg);
			have_keep = 1;
			break;
		case 'e':
			if (parse_u64(optarg, &every, 0) || every > UINT32_MAX)
				return usage_error("bad --keep-every '%s'",
						   optarg);
			break;
		case 'n':
			dry = 1;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			fputs(help_gc, stdout);
			return 0;
		default:
			return bad_option(c, argv);
		}
	}
	if (argc - optind != 1)
		return usage_error(argc - optind ? "too many arguments" :
						   "missing DIR");
	if (!have_keep)
		return usage_error("missing --keep N");
	if ((rc = parse_location(argv[optind], 0, &loc)))
		return rc;
	if (open_root(&loc, &h))
		goto out;
	go.json = json;
	go.dry = dry;
	if (json) {
		/* only to name the kept steps */
		rc = ckpt_list(h, &before, &nb);
		if (rc) {
			errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
			goto out;
		}
		go.removed = jcheck(json_array());
		go.debris = jcheck(json_array());
	}
	memset(&rep, 0, sizeof(rep));
	rc = ckpt_gc(h, (uint32_t)keep, (uint32_t)every,
		     dry ? CKPT_GC_DRY_RUN : 0, gc_step, &go, &rep);
	if (rc) {
		errmsg("%s", lib_msg(ckpt_errmsg(h), rc));
		goto out;
	}
	if (json) {
		json_t *o = jcheck(json_object()), *kept = jcheck(json_array());

		for (size_t i = 0; i < nb; i++) {
			json_t *sv = ju64(before[i].step);
			int gone = 0;

			for (size_t k = 0; k < json_array_size(go.removed);
			     k++)
				if (json_equal(sv, json_array_get(go.removed,
								  k)))
					gone = 1;
			if (gone)
				json_decref(sv);
			else
				jappend(kept, sv);
		}
		jset(o, "dry_run", json_boolean(dry));
		jset(o, "removed_steps", json_incref(go.removed));
		jset(o, "removed_debris_steps", json_incref(go.debris));
		jset(o, "kept_steps", kept);
		jset(o, "steps_removed", ju64(rep.steps_removed));
		jset(o, "debris_removed", ju64(rep.debris_removed));
		jset(o, "bytes_freed", ju64(rep.bytes_freed));
		jprint(o);
	} else {
		char a[32];
		printf("%s%" PRIu64 " step%s, %" PRIu64
		       " debris item%s, %s %s\n",
		       dry ? "dry run: would remove " : "removed ",
		       rep.steps_removed, rep.steps_removed == 1 ? "" : "s",
		       rep.debris_removed, rep.debris_removed == 1 ? "" : "s",
		       fmt_size(rep.bytes_freed, a, sizeof(a)),
		       dry ? "would be freed" : "freed");
	}
	ret = 0;
out:
	json_decref(go.removed);
	json_decref(go.debris);
	ckpt_free(before);
	ckpt_close(h);
	location_free(&loc);
	return ret;
}

/* ------------------------------------------------------------------ */
/* main                                                               */
/* ------------------------------------------------------------------ */

static const struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
} commands[] = {
	{ "ls", cmd_ls, help_ls },
	{ "inspect", cmd_inspect, help_inspect },
	{ "verify", cmd_verify, help_verify },
	{ "restore", cmd_restore, help_restore },
	{ "export", cmd_export, help_export },
	{ "import", cmd_import, help_import },
	{ "gc", cmd_gc, help_gc },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

int main(int argc, char **argv)
{
	const struct command *cmd;
	int ret;

	if (argc < 2)
		return usage_error("missing command");
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(help_main, stdout);
		return 0;
	}
	if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
		printf("ckptctl %d.%d.%d (libckpt %s, format version %d)\n",
		       CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
		       CKPT_VERSION_PATCH, ckpt_version_string(),
		       CKPT_FORMAT_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "help")) {
		if (argc == 2) {
			fputs(help_main, stdout);
			return 0;
		}
		cmd = find_command(argv[2]);
		if (!cmd)
			return usage_error("unknown command '%s'", argv[2]);
		fputs(cmd->help, stdout);
		return 0;
	}
	if (argv[1][0] == '-')
		return usage_error("unknown option '%s'", argv[1]);
	cmd = find_command(argv[1]);
	if (!cmd)
		return usage_error("unknown command '%s'", argv[1]);

	g_cmd = cmd->name;
	opterr = 0;
	optind = 1;
	ret = cmd->fn(argc - 1, argv + 1);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		errmsg("error writing output: %s", strerror(errno));
		if (ret == 0)
			ret = 1;
	}
	return ret;
}
