/*
 * cmd_events.c - ckptctl events: list the event journal of a location.
 *
 * Design note: the journal is the library's (ckpt_events_read walks every
 * host's JSON-lines file, hosts in order, oldest line first); this file
 * filters by host and prints each line either as it is (--json, so the
 * output is the journal itself) or as a table row: time, host, source,
 * action and every other field as key=value, in the line's order, so
 * fields added later show up without a change here.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "safetensors.h"

static const char help_events[] =
	"Usage: ckptctl events [OPTIONS] LOCATION\n"
	"\n"
	"List the event journal kept beside the checkpoints at LOCATION (a\n"
	"directory or gs://BUCKET/PREFIX): every notice the maintenance watcher\n"
	"saw (metadata server, SIGTERM, pod save requests), every save a notice\n"
	"asked for with its plan, time to durable, whether the deadline was met\n"
	"and the margin, and every start, exit and restart of 'ckptctl run'.\n"
	"Host by host, oldest first. The table shows time (UTC), host, source\n"
	"and action, then the other fields as key=value.\n"
	"\n"
	"Options:\n"
	"  -H, --host N  only host N's journal\n"
	"  -j, --json    the journal's lines as they are (one JSON object each)\n"
	"  -h, --help    show this help\n"
	"\n"
	"Exit status: 0 listed (also when there is no journal), 1 failure,\n"
	"2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl events /ckpt/run1\n"
	"  ckptctl events --json --host 3 gs://my-bucket/run1\n";

struct ev {
	int json, have_host;
	uint32_t host;
	uint64_t lines;
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

static int on_line(void *arg, uint32_t host, const char *line)
{
	static const char *const shown[] = { "time", "host", "source",
					     "action" };
	struct ev *e = arg;
	char t[64], src[32], act[32];
	const char *k;
	json_t *o, *v;

	if (e->have_host && host != e->host)
		return 0;
	if (e->json) {
		printf("%s\n", line);
		e->lines++;
		return 0;
	}
	if (e->lines++ == 0)
		printf("%-24s %5s  %-8s  %-9s %s\n", "TIME (UTC)", "HOST",
		       "SOURCE", "ACTION", "DETAILS");
	o = json_loads(line, 0, NULL);
	if (!json_is_object(o)) {
		static char esc[CLI_ESC_MAX];

		printf("%-24s %5u  %-8s  %-9s %s\n", "?", host, "?", "?",
		       st_escape(line, esc, sizeof(esc)));
		json_decref(o);
		return 0;
	}
	printf("%-24s %5u  %-8s  %-9s", field(o, "time", t, sizeof(t)), host,
	       field(o, "source", src, sizeof(src)),
	       field(o, "action", act, sizeof(act)));
	json_object_foreach (o, k, v) {
		size_t i;

		for (i = 0; i < sizeof(shown) / sizeof(shown[0]); i++)
			if (!strcmp(k, shown[i]))
				break;
		if (i < sizeof(shown) / sizeof(shown[0]))
			continue;
		printf(" %s=", k);
		print_value(v);
	}
	putchar('\n');
	json_decref(o);
	return 0;
}

static int cmd_events(int argc, char **argv)
{
	static const struct option opts[] = { { "host", required_argument, NULL,
						'H' },
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	struct ev e = { 0 };
	cli_location loc = { 0 };
	uint64_t v;
	int c, st, rc, ret = 1;

	while ((c = cli_getopt(argc, argv, ":H:jh", opts, help_events, &e.json,
			       &st)) != -1) {
		switch (c) {
		case 'H':
			if (cli_parse_u64(optarg, &v, 0) || v > UINT32_MAX)
				return cli_usage("bad --host '%s'", optarg);
			e.host = (uint32_t)v;
			e.have_host = 1;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if ((rc = cli_operands(argc, 1, "missing LOCATION")))
		return rc;
	if ((rc = cli_parse_location(argv[optind], 0, &loc)))
		return rc;
	if (cli_location_usable(&loc, 1))
		goto out;
	rc = ckpt_events_read(loc.path, on_line, &e);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		goto out;
	}
	if (!e.json && e.lines == 0 && e.have_host)
		printf("no events of host %u at %s\n", e.host, loc.path);
	else if (!e.json && e.lines == 0)
		printf("no events at %s\n", loc.path);
	ret = 0;
out:
	cli_location_free(&loc);
	return ret;
}

CLI_DEFINE_COMMAND(events, "list the event journal of a location");
