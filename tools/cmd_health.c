/*
 * cmd_health.c - ckptctl health: is a Cloud TPU node healthy, and did it
 * have a maintenance event?
 *
 * Design note: one GET of the node (the call behind `gcloud compute tpus
 * tpu-vm describe`), printed the way `describe | grep health` shows it
 * (the API's field names and values, YAML-like, so the same grep works),
 * then the verdict of tpu_judge (tpu.c) on one line. The exit status is
 * the verdict, for scripts: 0 healthy, 3 not healthy; 1 means the
 * question could not be answered (no such node, no permission, ...).
 * --json gives the API's own fields unchanged plus the verdict.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "gcp_api.h"
#include "safetensors.h"
#include "tpu.h"

#define EXIT_UNHEALTHY 3

static const char help_health[] =
	"Usage: ckptctl health --node NAME --zone ZONE [--project P] [--json]\n"
	"\n"
	"Show a Cloud TPU node's state, health, healthDescription, symptoms and\n"
	"upcoming maintenance window (as 'gcloud compute tpus tpu-vm describe\n"
	"NAME --zone ZONE | grep health' would), then a one-line verdict:\n"
	"  healthy                 READY, health HEALTHY (or none reported)\n"
	"  had maintenance at T    health UNHEALTHY_MAINTENANCE (T from the\n"
	"                          healthDescription)\n"
	"  unhealthy since T       any other health or state (PREEMPTED,\n"
	"                          TERMINATED, CREATING, ...); T from the\n"
	"                          healthDescription, else from the node's\n"
	"                          latest terminate/restart audit log entry\n"
	"An announced maintenance window is added to the verdict.\n"
	"\n"
	"Options:\n"
	"  -n, --node NAME     the node (or projects/P/locations/ZONE/nodes/NAME)\n"
	"  -z, --zone ZONE     its zone (default: CLOUDSDK_COMPUTE_ZONE, else\n"
	"                      this VM's zone from the metadata server)\n"
	"  -p, --project P     default: CLOUDSDK_CORE_PROJECT, else the metadata\n"
	"                      server's project id\n"
	"  -j, --json          the API's fields as they are, plus healthy,\n"
	"                      verdict, verdict_text, since, since_from\n"
	"  -h, --help          show this help\n"
	"\n"
	"The Cloud TPU API is CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU if set (else\n"
	"https://tpu.googleapis.com/), Logging CLOUDSDK_API_ENDPOINT_OVERRIDES_\n"
	"LOGGING; the token is read from CLOUDSDK_AUTH_ACCESS_TOKEN_FILE, else\n"
	"from the metadata server, and never printed.\n"
	"\n"
	"Exit status: 0 healthy, 3 not healthy, 1 failure (the node could not\n"
	"be read), 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl health --node my-tpu --zone us-central2-b\n"
	"  ckptctl health -n my-tpu -z us-central2-b --json | jq .health\n";

/* One value, YAML-like: strings escaped for the terminal, others as
 * compact JSON. */
static void put_value(json_t *v)
{
	static char esc[CLI_ESC_MAX];

	if (json_is_string(v)) {
		fputs(st_escape(json_string_value(v), esc, sizeof(esc)),
		      stdout);
	} else {
		char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

		fputs(s ? s : "?", stdout);
		free(s);
	}
}

/* "  key: value" for each field of an object, at `indent`; the first
 * line may start with a list's "- ". */
static void put_object(json_t *o, const char *first, const char *indent)
{
	const char *k;
	json_t *v;
	int n = 0;

	json_object_foreach (o, k, v) {
		printf("%s%s: ", n++ ? indent : first, k);
		put_value(v);
		putchar('\n');
	}
}

static void print_text(json_t *node, const tpu_verdict *v)
{
	json_t *sym = json_object_get(node, "symptoms");
	json_t *um = json_object_get(node, "upcomingMaintenance");
	static const char *const keys[] = { "name", "state", "health",
					    "healthDescription" };
	size_t i;
	json_t *s;

	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		json_t *val = json_object_get(node, keys[i]);

		if (!val)
			continue;
		printf("%s: ", keys[i]);
		put_value(val);
		putchar('\n');
	}
	if (json_array_size(sym)) {
		puts("symptoms:");
		json_array_foreach (sym, i, s)
			put_object(s, "- ", "  ");
	}
	if (json_is_object(um) && json_object_size(um)) {
		puts("upcomingMaintenance:");
		put_object(um, "  ", "  ");
	}
	{
		static char esc[CLI_ESC_MAX];

		printf("verdict: %s\n", st_escape(v->text, esc, sizeof(esc)));
	}
}

static void print_json(json_t *node, const tpu_verdict *v)
{
	static const char *const keys[] = { "name",     "state",
					    "health",   "healthDescription",
					    "symptoms", "upcomingMaintenance" };
	json_t *o = cli_jcheck(json_object());
	char t[40];

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		json_t *val = json_object_get(node, keys[i]);

		if (val)
			cli_jset(o, keys[i], json_incref(val));
	}
	cli_jset(o, "healthy", json_boolean(v->cls == TPU_HEALTHY));
	cli_jset(o, "verdict", cli_jstr(tpu_class_name(v->cls)));
	cli_jset(o, "verdict_text", cli_jstr(v->text));
	cli_jset(o, "since",
		 v->since_ns ?
			 cli_jstr(cli_fmt_time_ms(v->since_ns, t, sizeof(t))) :
			 json_null());
	cli_jset(o, "since_from",
		 v->since_from ? cli_jstr(v->since_from) : json_null());
	cli_jprint(o);
}

static int cmd_health(int argc, char **argv)
{
	static const struct option opts[] = { TPU_TARGET_OPTS,
					      CLI_COMMON_OPTS,
					      { NULL, 0, NULL, 0 } };
	tpu_target t = { 0 };
	tpu_verdict v;
	gcp_reply r;
	int c, st, json = 0, ret = 1;

	while ((c = cli_getopt(argc, argv, ":n:z:p:jh", opts, help_health,
			       &json, &st)) != -1) {
		if (c == CLI_OPT_EXIT)
			return st;
		tpu_target_opt(&t, c, optarg);
	}
	if ((st = cli_operands(argc, 0, NULL)))
		return st;
	if ((st = tpu_target_finish(&t))) {
		tpu_target_free(&t);
		return st;
	}
	if (gcp_node_get(t.api, t.zone, t.node, &r)) {
		tpu_report(&t, "read it", &r);
		goto out;
	}
	tpu_judge(r.body, &t, 1, &v);
	if (json)
		print_json(r.body, &v);
	else
		print_text(r.body, &v);
	ret = v.cls == TPU_HEALTHY ? 0 : EXIT_UNHEALTHY;
out:
	gcp_reply_free(&r);
	tpu_target_free(&t);
	return ret;
}

CLI_DEFINE_COMMAND(health, "show a Cloud TPU node's health and verdict");
