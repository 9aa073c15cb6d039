/*
 * cmd_events.c - ckptctl events: list the event journal of a location,
 * and with --audit a TPU node's maintenance history merged into it.
 *
 * Design note: the journal is the library's (ckpt_events_read walks every
 * host's JSON-lines file, hosts in order, oldest line first); this file
 * filters by host and prints each line either as it is (--json, so the
 * output is the journal itself) or as a table row: time, host, source,
 * action and every other field as key=value, in the line's order, so
 * fields added later show up without a change here. With --audit the
 * node's tpu.nodes.terminate and tpu.nodes.restart entries of the
 * system-event audit logs (Cloud Logging, tpu.c) become lines of the same
 * shape (source "audit", action "terminate"/"restart", reason = the
 * terminateReason), and everything is sorted by time (stable: equal times
 * keep the journal's order), so one listing reads "notice, checkpoint
 * durable, terminated, restarted, resumed at step S".
 *
 *   audit entries --> lines --\
 *                              +--> sort by time --> table | JSON lines
 *   journal lines ------------/
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"
#include "tpu.h"

static const char help_events[] =
	"Usage: ckptctl events [OPTIONS] LOCATION\n"
	"       ckptctl events --audit --node NAME --zone ZONE [OPTIONS]\n"
	"                      [LOCATION]\n"
	"\n"
	"List the event journal kept beside the checkpoints at LOCATION (a\n"
	"directory or gs://BUCKET/PREFIX): every notice the maintenance watcher\n"
	"saw (metadata server, SIGTERM, pod save requests), every save a notice\n"
	"asked for with its plan, time to durable, whether the deadline was met\n"
	"and the margin, and every start, exit and restart of 'ckptctl run'.\n"
	"Host by host, oldest first. The table shows time (UTC), host, source\n"
	"and action, then the other fields as key=value.\n"
	"\n"
	"With --audit: the TPU node's maintenance history from the system-event\n"
	"audit logs (Cloud Logging: tpu.nodes.terminate with its terminateReason,\n"
	"tpu.nodes.restart), as lines of source 'audit', merged in time order\n"
	"with the journal at LOCATION when one is given.\n"
	"\n"
	"Options:\n"
	"  -H, --host N        only host N's journal\n"
	"  -s, --since D       only events of the last D (90s, 15m, 2h, 7d;\n"
	"                      with --audit the default is 7d)\n"
	"  -a, --audit         add the node's terminate/restart audit entries\n"
	"  -n, --node NAME     (--audit) the node, or projects/P/locations/Z/\n"
	"                      nodes/NAME\n"
	"  -z, --zone ZONE     (--audit) its zone (default:\n"
	"                      CLOUDSDK_COMPUTE_ZONE, else the metadata server's)\n"
	"  -p, --project P     (--audit) default: CLOUDSDK_CORE_PROJECT, else the\n"
	"                      metadata server's project id\n"
	"  -j, --json          one JSON object per line: the journal's lines as\n"
	"                      they are, audit entries as {time, source, action,\n"
	"                      method, reason, node, zone, insertId}\n"
	"  -h, --help          show this help\n"
	"\n"
	"Exit status: 0 listed (also when there is no journal), 1 failure,\n"
	"2 usage error.\n"
	"\n"
	"Logging is CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING if set (else\n"
	"https://logging.googleapis.com/); the token as for 'ckptctl health'.\n"
	"\n"
	"Examples:\n"
	"  ckptctl events /ckpt/run1\n"
	"  ckptctl events --json --host 3 gs://my-bucket/run1\n"
	"  ckptctl events --audit -n my-tpu -z us-central2-b gs://my-bucket/run1\n";

/* A line kept for sorting (--audit). */
struct item {
	int64_t ns;   /* its time; 0 unknown (sorted first) */
	uint64_t seq; /* arrival order: ties keep it */
	uint32_t host;
	int audit;
	char *line;
};

struct ev {
	int json, have_host, audit;
	uint32_t host;
	int64_t since_ns; /* 0: every line */
	uint64_t lines;
	struct item *items; /* --audit: everything, sorted before printing */
	size_t n, cap;
};

/* One field's value for the table: strings as they are (escaped), reals
 * with 3 decimals, the rest as JSON. */
static void print_value(json_t *v)
{
	static char esc[CLI_ESC_MAX];
	char *s;

	if (json_is_string(v)) {
		fputs(st_escape(json_string_value(v), esc, sizeof(esc)),
		      stdout);
	} else if (json_is_real(v)) {
		printf("%.3f", json_real_value(v));
	} else {
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		fputs(s ? s : "?", stdout);
		free(s);
	}
}

static const char *field(json_t *o, const char *k, char *buf, size_t len)
{
	json_t *v = json_object_get(o, k);

	if (json_is_string(v))
		snprintf(buf, len, "%s", json_string_value(v));
	else if (json_is_integer(v))
		snprintf(buf, len, "%" JSON_INTEGER_FORMAT,
			 json_integer_value(v));
	else
		snprintf(buf, len, "-");
	return buf;
}

/* One line: as it is (--json) or as a table row; `host` is the column
 * ("-" for an audit entry). */
static void print_line(struct ev *e, const char *host, const char *line)
{
	static const char *const shown[] = { "time", "host", "source",
					     "action" };
	static char esc[CLI_ESC_MAX];
	char t[64], src[32], act[32];
	const char *k;
	json_t *o, *v;

	if (e->json) {
		printf("%s\n", line);
		e->lines++;
		return;
	}
	if (e->lines++ == 0)
		printf("%-24s %5s  %-8s  %-9s %s\n", "TIME (UTC)", "HOST",
		       "SOURCE", "ACTION", "DETAILS");
	o = json_loads(line, 0, NULL);
	if (!json_is_object(o)) {
		printf("%-24s %5s  %-8s  %-9s %s\n", "?", host, "?", "?",
		       st_escape(line, esc, sizeof(esc)));
		json_decref(o);
		return;
	}
	printf("%-24s %5s  %-8s  %-9s",
	       st_escape(field(o, "time", t, sizeof(t)), esc, sizeof(esc)),
	       host, field(o, "source", src, sizeof(src)),
	       field(o, "action", act, sizeof(act)));
	json_object_foreach (o, k, v) {
		size_t i;

		for (i = 0; i < sizeof(shown) / sizeof(shown[0]); i++)
			if (!strcmp(k, shown[i]))
				break;
		if (i < sizeof(shown) / sizeof(shown[0]))
			continue;
		printf(" %s=", st_escape(k, esc, sizeof(esc)));
		print_value(v);
	}
	putchar('\n');
	json_decref(o);
}

/* The line's time (0 if it has none that parses). */
static int64_t line_time(const char *line)
{
	json_t *o = json_loads(line, 0, NULL);
	int64_t ns = 0;

	if (tpu_parse_time(json_string_value(json_object_get(o, "time")), &ns))
		ns = 0;
	json_decref(o);
	return ns;
}

static void keep(struct ev *e, int64_t ns, uint32_t host, int audit,
		 const char *line)
{
	struct item *it;

	if (e->n == e->cap) {
		size_t cap = e->cap ? 2 * e->cap : 64;
		struct item *p = realloc(e->items, cap * sizeof(*p));

		if (!p)
			cli_jcheck(NULL);
		e->items = p;
		e->cap = cap;
	}
	it = &e->items[e->n];
	it->ns = ns;
	it->seq = e->n++;
	it->host = host;
	it->audit = audit;
	if (!(it->line = strdup(line)))
		cli_jcheck(NULL);
}

static int on_line(void *arg, uint32_t host, const char *line)
{
	struct ev *e = arg;
	int64_t ns = 0;
	char h[16];

	if (e->have_host && host != e->host)
		return 0;
	if (e->since_ns || e->audit)
		ns = line_time(line);
	if (e->since_ns && ns && ns < e->since_ns)
		return 0;
	if (e->audit) {
		keep(e, ns, host, 0, line);
		return 0;
	}
	snprintf(h, sizeof(h), "%u", host);
	print_line(e, h, line);
	return 0;
}

static int on_audit(void *arg, json_t *ev)
{
	struct ev *e = arg;
	char *line = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
	int64_t ns = 0;

	if (!line)
		cli_jcheck(NULL);
	tpu_parse_time(json_string_value(json_object_get(ev, "time")), &ns);
	keep(e, ns, 0, 1, line);
	free(line);
	return 0;
}

static int by_time(const void *a, const void *b)
{
	const struct item *x = a, *y = b;

	if (x->ns != y->ns)
		return x->ns < y->ns ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sorts what was kept and prints it. */
static void print_kept(struct ev *e)
{
	char h[16];

	if (e->n)
		qsort(e->items, e->n, sizeof(e->items[0]), by_time);
	for (size_t i = 0; i < e->n; i++) {
		snprintf(h, sizeof(h), "%u", e->items[i].host);
		print_line(e, e->items[i].audit ? "-" : h, e->items[i].line);
		free(e->items[i].line);
	}
	free(e->items);
	e->items = NULL;
	e->n = e->cap = 0;
}

/* The node's audit entries into e->items. 0 or 1. */
static int read_audit(struct ev *e, tpu_target *t)
{
	gcp_reply r;
	int rc = tpu_target_finish(t);

	if (rc)
		return rc;
	if (tpu_audit_list(t, e->since_ns, "timestamp asc", 0, 1, on_audit, e,
			   &r)) {
		cli_err("node %s: cannot read its audit logs: %s", t->name,
			r.msg);
		gcp_reply_free(&r);
		return 1;
	}
	gcp_reply_free(&r);
	return 0;
}

static int cmd_events(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "host", required_argument, NULL, 'H' },
		{ "since", required_argument, NULL, 's' },
		{ "audit", no_argument, NULL, 'a' },
		TPU_TARGET_OPTS,
		CLI_COMMON_OPTS,
		{ NULL, 0, NULL, 0 }
	};
	struct ev e = { 0 };
	cli_location loc = { 0 };
	tpu_target t = { 0 };
	double since_s = -1;
	int c, st, rc, ret = 1;

	while ((c = cli_getopt(argc, argv, ":H:s:an:z:p:jh", opts, help_events,
			       &e.json, &st)) != -1) {
		if (tpu_target_opt(&t, c, optarg))
			continue;
		switch (c) {
		case 'H':
			if ((st = cli_parse_host(optarg, &e.host)))
				return st;
			e.have_host = 1;
			break;
		case 's':
			if (tpu_parse_duration(optarg, &since_s))
				return cli_usage("bad --since '%s'", optarg);
			break;
		case 'a':
			e.audit = 1;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if (!e.audit && (t.node || t.zone || t.project))
		return cli_usage("--node, --zone and --project go with "
				 "--audit");
	if (e.audit && argc - optind == 0)
		; /* the audit logs alone */
	else if ((rc = cli_operands(argc, 1, "missing LOCATION")))
		return rc;
	if (e.audit && since_s < 0)
		since_s = 7 * 86400;
	if (since_s >= 0)
		e.since_ns = cli_now_ns() - (int64_t)(since_s * 1e9);
	if (e.audit && (rc = read_audit(&e, &t))) {
		ret = rc;
		goto out;
	}
	if (optind < argc) {
		if ((rc = cli_parse_location(argv[optind], 0, &loc))) {
			ret = rc;
			goto out;
		}
		if (cli_location_usable(&loc, 1))
			goto out;
		rc = ckpt_events_read(loc.path, on_line, &e);
		if (rc) {
			cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
			goto out;
		}
	}
	print_kept(&e);
	if (!e.json && e.lines == 0 && e.audit && !loc.path)
		printf("no terminate or restart audit entries for node %s\n",
		       t.name);
	else if (!e.json && e.lines == 0 && e.have_host)
		printf("no events of host %u at %s\n", e.host, loc.path);
	else if (!e.json && e.lines == 0)
		printf("no events at %s\n", loc.path);
	ret = 0;
out:
	for (size_t i = 0; i < e.n; i++)
		free(e.items[i].line);
	free(e.items);
	cli_location_free(&loc);
	tpu_target_free(&t);
	return ret;
}

CLI_DEFINE_COMMAND(events, "list the event journal of a location (and a TPU "
			   "node's audit log)");
