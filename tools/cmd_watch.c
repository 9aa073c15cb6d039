/*
 * cmd_watch.c - ckptctl watch: print what the maintenance watcher sees,
 * one line per change, until SIGINT/SIGTERM.
 *
 * Design note: the watcher is the library's (ckpt_watch_start on a handle
 * that saves nothing, cli_watcher_open). A notice makes ckpt_watch_fd()
 * readable at once; every other change (a value going back to NONE, a key
 * answering 404, the watcher turning degraded or healthy) shows only in
 * ckpt_watch_state(), so the loop waits on the descriptor for at most
 * TICK_MS and compares each snapshot with the previous one. A line
 * carries the time the watcher saw the change, not the time it was
 * printed. The periodic policy is off: only notices are reported.
 *
 *   metadata server -> watcher thread -> eventfd / ckpt_watch_state()
 *                                          -> diff -> one line per change
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"

#define TICK_MS 50

static const char help_watch[] =
	"Usage: ckptctl watch [OPTIONS]\n"
	"\n"
	"Watch the GCE metadata server as the library's maintenance watcher does\n"
	"(instance/maintenance-event and instance/preempted under long-polls,\n"
	"instance/upcoming-maintenance polled about once a minute) and print one\n"
	"line per change as soon as the watcher sees it: the time it was seen\n"
	"(UTC), the key and its new value (for example\n"
	"'instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE'), a key\n"
	"this VM does not get (404), a key that starts failing, the watcher\n"
	"turning degraded or healthy again, and each notice with the reason and\n"
	"deadline a training loop would be given. The first value of each key\n"
	"is printed as a change. The server is GCE_METADATA_HOST (host[:port])\n"
	"or metadata.google.internal. Stops on SIGINT or SIGTERM.\n"
	"\n"
	"Options:\n"
	"  -j, --json    one JSON object per line: \"time\", \"what\" (value,\n"
	"                absent, error, health, notice) and \"key\", \"old\",\n"
	"                \"new\", \"etag\", \"error\", \"healthy\", \"reason\",\n"
	"                \"deadline\", \"event\" as they apply\n"
	"  -h, --help    show this help\n"
	"\n"
	"Exit status: 0 stopped by a signal, 1 the watcher could not start or\n"
	"stopped, 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl watch\n"
	"  GCE_METADATA_HOST=127.0.0.1:8080 ckptctl watch --json\n";

/* Prints one change: a text line or a compact JSON object. */
struct out {
	int json;
};

static void emit(const struct out *o, int64_t ns, const char *what,
		 json_t *fields, const char *text)
{
	char t[48];

	cli_fmt_time_ms(ns, t, sizeof(t));
	if (o->json) {
		json_t *j = cli_jcheck(json_object());
		char *s;

		cli_jset(j, "time", cli_jstr(t));
		cli_jset(j, "what", cli_jstr(what));
		json_object_update(j, fields);
		s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!s)
			cli_jcheck(NULL);
		printf("%s\n", s);
		free(s);
		json_decref(j);
	} else {
		printf("%s  %s\n", t, text);
	}
	json_decref(fields);
	fflush(stdout);
}

/* A value on one line (an upcoming-maintenance document may span lines). */
static void one_line(const char *v, char *buf, size_t len)
{
	size_t i;

	snprintf(buf, len, "%s", *v ? v : "\"\"");
	for (i = 0; buf[i]; i++)
		if (buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')
			buf[i] = ' ';
}

static void key_changes(const struct out *o, const ckpt_watch_key *was,
			const ckpt_watch_key *k)
{
	char text[512], v[300];
	json_t *f;

	if (k->changes != was->changes) {
		f = cli_jcheck(json_object());
		cli_jset(f, "key", cli_jstr(k->key));
		cli_jset(f, "old",
			 was->changes ? cli_jstr(was->value) : json_null());
		cli_jset(f, "new", cli_jstr(k->value));
		cli_jset(f, "etag", cli_jstr(k->etag));
		if (k->changes - was->changes > 1)
			cli_jset(f, "changes",
				 cli_ju64(k->changes - was->changes));
		one_line(k->value, v, sizeof(v));
		snprintf(text, sizeof(text), "%s %s", k->key, v);
		emit(o, k->changed_ns, "value", f, text);
	}
	if (k->state == was->state)
		return;
	if (k->state == CKPT_WKEY_ABSENT) {
		f = cli_jcheck(json_object());
		cli_jset(f, "key", cli_jstr(k->key));
		snprintf(text, sizeof(text), "%s absent (%s)", k->key,
			 k->error);
		emit(o, cli_now_ns(), "absent", f, text);
	} else if (k->state == CKPT_WKEY_ERROR) {
		f = cli_jcheck(json_object());
		cli_jset(f, "key", cli_jstr(k->key));
		cli_jset(f, "error", cli_jstr(k->error));
		snprintf(text, sizeof(text), "%s failing: %s", k->key,
			 k->error);
		emit(o, cli_now_ns(), "error", f, text);
	}
}

/* "key: error" of the first failing key, for the degraded line. */
static const char *first_error(const ckpt_watch_info *in, char *buf, size_t len)
{
	uint32_t i;

	buf[0] = 0;
	for (i = 0; i < in->nkeys && i < CKPT_WATCH_MAX_KEYS; i++)
		if (in->keys[i].state == CKPT_WKEY_ERROR) {
			snprintf(buf, len, "%s: %s", in->keys[i].key,
				 in->keys[i].error);
			break;
		}
	return buf;
}

static void diff(const struct out *o, const ckpt_watch_info *was,
		 const ckpt_watch_info *now)
{
	char text[512], err[256];
	uint32_t i;
	json_t *f;

	for (i = 0; i < now->nkeys && i < CKPT_WATCH_MAX_KEYS; i++)
		key_changes(o, &was->keys[i], &now->keys[i]);
	if (now->healthy != was->healthy) {
		f = cli_jcheck(json_object());
		cli_jset(f, "healthy", json_boolean(now->healthy));
		if (now->healthy) {
			snprintf(text, sizeof(text), "watcher healthy");
		} else {
			first_error(now, err, sizeof(err));
			cli_jset(f, "error", cli_jstr(err));
			snprintf(text, sizeof(text), "watcher degraded (%s)",
				 err);
		}
		emit(o, cli_now_ns(), "health", f, text);
	}
}

static void notice(const struct out *o, const ckpt_save_advice *a)
{
	const char *reason = cli_reason_name(a->reason);
	char text[256], dl[48];
	json_t *f = cli_jcheck(json_object());

	cli_fmt_time_ms(a->deadline_ns, dl, sizeof(dl));
	cli_jset(f, "reason", cli_jstr(reason));
	cli_jset(f, "deadline", a->deadline_ns ? cli_jstr(dl) : json_null());
	cli_jset(f, "event", cli_ju64(a->event));
	snprintf(text, sizeof(text), "notice: %s, save by %s", reason,
		 a->deadline_ns ? dl : "(no deadline)");
	emit(o, a->notice_ns, "notice", f, text);
}

static int cmd_watch(int argc, char **argv)
{
	static const struct option opts[] = { CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	struct out o = { 0 };
	ckpt_watch_opts wo;
	ckpt_watch_info was, now;
	ckpt_save_advice a;
	uint64_t last_event = 0, junk;
	char *tmp = NULL;
	ckpt *c = NULL;
	int c_, st, rc, ret = 1, banner = 0;

	while ((c_ = cli_getopt(argc, argv, ":jh", opts, help_watch, &o.json,
				&st)) != -1)
		if (c_ == CLI_OPT_EXIT)
			return st;
	if ((rc = cli_operands(argc, 0, "")))
		return rc;
	cli_install_signals();
	ckpt_watch_opts_default(&wo);
	wo.every_seconds = 0; /* notices only */
	if (cli_watcher_open(&wo, &c, &tmp))
		return 1;
	/* every key's first value is a change; a healthy start is not */
	memset(&was, 0, sizeof(was));
	was.healthy = 1;
	while (!cli_interrupted) {
		struct pollfd p = { .fd = ckpt_watch_fd(c), .events = POLLIN };

		if (poll(&p, 1, TICK_MS) > 0 &&
		    read(p.fd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
			break;
		if (ckpt_watch_state(c, &now))
			break;
		if (!banner && now.host[0]) {
			fprintf(stderr,
				"ckptctl: watch: watching http://%s/"
				"computeMetadata/v1/ (Ctrl-C to stop)\n",
				now.host);
			banner = 1;
		}
		diff(&o, &was, &now);
		if (ckpt_should_save(c, 0, &a) && a.event > last_event) {
			last_event = a.event;
			notice(&o, &a);
		}
		if (!now.running) {
			cli_err("the watcher stopped");
			goto out;
		}
		was = now;
	}
	ret = cli_interrupted ? 0 : 1;
	if (ret)
		cli_err("watching failed: %s", strerror(errno));
out:
	cli_watcher_close(c, tmp);
	return ret;
}

CLI_DEFINE_COMMAND(watch, "print each change the maintenance watcher sees");
