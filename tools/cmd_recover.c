/*
 * cmd_recover.c - ckptctl recover: delete and recreate a Cloud TPU node
 * that did not come back, with the same settings (its startup script
 * included, which restores the latest checkpoint and resumes training).
 *
 * Design note. The decision is tpu_judge's (tpu.c), the same as health's:
 *   healthy                  nothing to do, ever (checked again right
 *                            before the delete: a node that came back
 *                            while recover waited is left alone);
 *   PREEMPTED, TERMINATED    recreate now: such a node never comes back;
 *   UNHEALTHY_MAINTENANCE,   give it --timeout from when it became so (the
 *   other health, CREATING,  time in its healthDescription; otherwise from
 *   RESTARTING, ...          now) to come back, polling; then recreate;
 *   STOPPED, HIDDEN, ...     refuse: its owner stopped it (and a node of
 *                            a queued resource: the resource owns it);
 *   DELETING                 wait until it is gone, then create;
 *   no such node             recreate from the settings a previous
 *                            recover journaled, if that recover did not
 *                            finish (a failed create: quota, ...).
 * Without --yes it only says what it would do. With --yes every step is a
 * line of the event journal at --location (source "recover": check,
 * wait, recovered, refuse, delete, delete-failed, deleted, create,
 * create-failed, created, interrupted); "delete", "create" and
 * "create-failed" carry the node's settings (the create body), written
 * BEFORE the call, so a retry can recreate a node whose create failed
 * or whose recover was killed. If that line cannot be written, nothing is
 * deleted. Both operations are waited on with progress and a deadline
 * (--op-timeout); the create carries a requestId, so its retries after
 * a 429 or 5xx are the same create.
 *
 *   GET --judge--> [wait --timeout] --> journal delete(settings) --> GET
 *   (still not healthy) --> DELETE + wait --> gone --> journal create
 *   --> POST create + wait --> journal created | create-failed(settings)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "gcp_api.h"
#include "tpu.h"

#define POLL_S 5.0
/* recover's own journal file (hHOST.jsonl): never a VM's, whose copy in
 * the bucket is replaced whole by the VM's uploads */
#define RECOVER_HOST 65535

static const char help_recover[] =
	"Usage: ckptctl recover --node NAME --zone ZONE [--project P]\n"
	"                       [--timeout T] [--yes --location LOC]\n"
	"\n"
	"Delete and recreate a Cloud TPU node that did not recover, with the\n"
	"same accelerator type, runtime version, network settings and metadata\n"
	"(its startup script included: see examples/startup-script.sh, which\n"
	"restores the latest checkpoint and resumes training).\n"
	"  healthy node              nothing is done, ever\n"
	"  PREEMPTED, TERMINATED     recreated at once\n"
	"  UNHEALTHY_MAINTENANCE or  recreated if still so --timeout after it\n"
	"  another health, or a      became so (the time in its\n"
	"  state in progress         healthDescription, else from now);\n"
	"                            recover polls until then\n"
	"  STOPPED, HIDDEN, ...      refused (stopped by its owner)\n"
	"  a queued resource's node  refused (recreate the queued resource)\n"
	"  no such node              recreated from the settings journaled by a\n"
	"                            recover that did not finish (a failed\n"
	"                            create), if any\n"
	"Without --yes nothing is changed: it prints what it would do and the\n"
	"settings it would recreate the node with. With --yes every action is\n"
	"written to the event journal at LOC (see 'ckptctl events'), the\n"
	"node's settings before the delete and with a failed create, so\n"
	"running the same command again retries. Both long-running operations\n"
	"are waited on with progress, until --op-timeout each.\n"
	"\n"
	"Options:\n"
	"  -n, --node NAME       the node (or projects/P/locations/ZONE/nodes/NAME)\n"
	"  -z, --zone ZONE       its zone (default: CLOUDSDK_COMPUTE_ZONE, else the\n"
	"                        metadata server's)\n"
	"  -p, --project P       default: CLOUDSDK_CORE_PROJECT, else the metadata\n"
	"                        server's project id\n"
	"  -t, --timeout T       how long an unhealthy node may take to come back\n"
	"                        (90s, 15m, 2h; default 10m)\n"
	"  -o, --op-timeout T    deadline of each delete and create (default 30m)\n"
	"  -y, --yes             act (default: a dry run)\n"
	"  -l, --location LOC    the checkpoint location whose journal records\n"
	"                        the actions (default: $CKPT_LOCATION); needed\n"
	"                        with --yes\n"
	"  -H, --host N          the journal file recover writes, hN (default\n"
	"                        65535: a file of its own; a VM's journal copied\n"
	"                        to the same bucket replaces its host's object)\n"
	"  -h, --help            show this help\n"
	"\n"
	"Endpoints and token as for 'ckptctl health' (never printed).\n"
	"\n"
	"Exit status: 0 the node is healthy (now, or already: nothing to do) or,\n"
	"in a dry run, the plan was printed; 1 failure (refused, API error, a\n"
	"failed create, a passed deadline); 2 usage error.\n"
	"\n"
	"Examples:\n"
	"  ckptctl recover --node my-tpu --zone us-central2-b\n"
	"  ckptctl recover -n my-tpu -z us-central2-b --yes -l gs://bkt/run1\n";

struct rec {
	tpu_target t;
	double timeout_s, op_timeout_s;
	int yes;
	const char *location;
	uint32_t host;
};

/* ---- the journal ---- */

/*
 * Appends {source: recover, action, node, ...fields} at the location
 * (with --yes; a dry run writes nothing). Releases `fields`. 0, or -1
 * after printing why.
 */
static int journal(const struct rec *r, const char *action, json_t *fields)
{
	json_t *j;
	char *line;
	int rc;

	if (!r->yes || !r->location) {
		json_decref(fields);
		return 0;
	}
	/* names and actions are ASCII: json_pack takes them as they are */
	j = cli_jcheck(json_pack("{s:s, s:s, s:s}", "source", "recover",
				 "action", action, "node", r->t.name));
	if (fields && json_object_update(j, fields))
		cli_jcheck(NULL);
	json_decref(fields);
	if (!(line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		cli_jcheck(NULL);
	json_decref(j);
	rc = ckpt_event_append(r->location, r->host, line);
	free(line);
	if (rc) {
		cli_err("cannot write the event journal at %s: %s", r->location,
			cli_libmsg(ckpt_errmsg(NULL), rc));
		return -1;
	}
	return 0;
}

/* The fields of a journal line about the node as it is. */
static json_t *node_fields(const tpu_verdict *v)
{
	json_t *f = cli_jcheck(json_object());

	cli_jset(f, "state", cli_jstr(v->state));
	cli_jset(f, "health", cli_jstr(v->health));
	cli_jset(f, "verdict", cli_jstr(v->text));
	return f;
}

/* The last recover line about this node and the last settings it
 * journaled. */
struct found {
	const char *name;
	char action[32], time[40], settings_time[40];
	json_t *settings;
};

static int on_line(void *arg, uint32_t host, const char *line)
{
	struct found *f = arg;
	json_t *o = json_loads(line, 0, NULL), *s;
	const char *src = json_string_value(json_object_get(o, "source"));
	const char *node = json_string_value(json_object_get(o, "node"));
	const char *act = json_string_value(json_object_get(o, "action"));
	const char *t = json_string_value(json_object_get(o, "time"));

	(void)host;
	if (src && node && act && !strcmp(src, "recover") &&
	    !strcmp(node, f->name)) {
		snprintf(f->action, sizeof(f->action), "%s", act);
		snprintf(f->time, sizeof(f->time), "%s", t ? t : "?");
		/* a new recover: settings of an older one do not count */
		if (!strcmp(act, "check")) {
			json_decref(f->settings);
			f->settings = NULL;
		}
		s = json_object_get(o, "settings");
		if (json_is_object(s)) {
			json_decref(f->settings);
			f->settings = json_incref(s);
			snprintf(f->settings_time, sizeof(f->settings_time),
				 "%s", t ? t : "?");
		}
	}
	json_decref(o);
	return 0;
}

/* ---- waiting ---- */

/* Polls the node until it is healthy (0), gone (1), terminal or past
 * `deadline_ns` (2), or on a failure/interrupt (-1). *node is replaced
 * by the latest reply. */
static int wait_healthy(struct rec *r, json_t **node, int64_t deadline_ns)
{
	int tty = isatty(2);
	tpu_verdict v;
	char until[40];

	cli_err("waiting until %s for node %s to come back",
		cli_fmt_time_ms(deadline_ns, until, sizeof(until)), r->t.name);
	for (;;) {
		int64_t left = deadline_ns - cli_now_ns();
		gcp_reply g;

		if (left <= 0)
			break;
		if (tty)
			fprintf(stderr, "\rwaiting: %.0f s left ",
				(double)left / 1e9);
		if (gcp_sleep(left / 1e9 < POLL_S ? left / 1e9 : POLL_S))
			break;
		if (gcp_node_get(r->t.api, r->t.zone, r->t.node, &g)) {
			if (tty)
				fputc('\n', stderr);
			if (g.http == 404) {
				gcp_reply_free(&g);
				return 1;
			}
			tpu_report(&r->t, "read it", &g);
			gcp_reply_free(&g);
			return -1;
		}
		json_decref(*node);
		*node = g.body;
		tpu_judge(*node, &r->t, 0, &v);
		if (v.cls == TPU_HEALTHY || v.cls == TPU_TERMINAL ||
		    v.cls == TPU_STOPPED || v.cls == TPU_DELETING) {
			if (tty)
				fputc('\n', stderr);
			return v.cls == TPU_HEALTHY ? 0 : 2;
		}
	}
	if (tty)
		fputc('\n', stderr);
	if (cli_interrupted) {
		cli_err("interrupted");
		return -1;
	}
	return 2;
}

/* Polls until the node is gone (0), or -1 at the deadline/interrupt or
 * on a failure. */
static int wait_gone(struct rec *r, int64_t deadline_ns)
{
	for (;;) {
		gcp_reply g;
		int rc = gcp_node_get(r->t.api, r->t.zone, r->t.node, &g);

		if (rc && g.http == 404) {
			gcp_reply_free(&g);
			return 0;
		}
		if (rc)
			tpu_report(&r->t, "read it", &g);
		gcp_reply_free(&g);
		if (rc)
			return -1;
		if (cli_now_ns() >= deadline_ns) {
			cli_err("node %s: still there after the delete "
				"(--op-timeout passed)",
				r->t.name);
			return -1;
		}
		if (gcp_sleep(1.0)) {
			cli_err("interrupted");
			return -1;
		}
	}
}

/* ---- acting ---- */

static void print_settings(json_t *settings)
{
	char *s = json_dumps(settings, JSON_INDENT(2) | JSON_PRESERVE_ORDER);

	printf("%s\n", s ? s : "?");
	free(s);
}

static int64_t op_deadline(const struct rec *r)
{
	return cli_now_ns() + (int64_t)(r->op_timeout_s * 1e9);
}

/* Creates the node with `settings`. 0 or 1. */
static int create(struct rec *r, json_t *settings)
{
	char rid[37], what[900];
	json_t *f;
	gcp_reply g, op;
	int rc;

	gcp_uuid(rid);
	f = cli_jcheck(json_object());
	cli_jset(f, "request_id", cli_jstr(rid));
	cli_jset(f, "settings", json_incref(settings));
	if (journal(r, "create", f))
		return 1;
	snprintf(what, sizeof(what), "creating node %s", r->t.name);
	if (gcp_node_create(r->t.api, r->t.zone, r->t.node, settings, rid,
			    &g)) {
		tpu_report(&r->t, "create it", &g);
		op = g;
		rc = 1;
	} else {
		rc = gcp_op_wait(r->t.api, g.body, op_deadline(r), what, &op);
		gcp_reply_free(&g);
		if (rc)
			cli_err("node %s: the create failed: %s", r->t.name,
				op.msg);
	}
	if (rc) {
		f = cli_jcheck(json_object());
		cli_jset(f, "error", cli_jstr(op.msg));
		if (op.status[0])
			cli_jset(f, "status", cli_jstr(op.status));
		cli_jset(f, "settings", json_incref(settings));
		gcp_reply_free(&op);
		if (journal(r, "create-failed", f) == 0)
			cli_err("the node's settings are kept in the journal "
				"at %s; to retry, run again: ckptctl recover "
				"--yes --node %s --location %s",
				r->location, r->t.name, r->location);
		return 1;
	}
	gcp_reply_free(&op);
	if (gcp_node_get(r->t.api, r->t.zone, r->t.node, &g) == 0) {
		tpu_verdict v;

		tpu_judge(g.body, &r->t, 0, &v);
		printf("node %s recreated: state %s, health %s\n", r->t.name,
		       *v.state ? v.state : "?", *v.health ? v.health : "-");
		journal(r, "created", node_fields(&v));
	} else {
		printf("node %s recreated\n", r->t.name);
		journal(r, "created", NULL);
	}
	gcp_reply_free(&g);
	return 0;
}

/* Deletes the unhealthy `node` and recreates it. 0 or 1. */
static int replace(struct rec *r, json_t *node, const tpu_verdict *v)
{
	json_t *settings, *f, *qr = json_object_get(node, "queuedResource");
	gcp_reply g, op;
	tpu_verdict now;
	char what[900];
	int ret = 1, rc;

	/* a queued resource owns its node: a node created beside it would
	 * be another one, outside its capacity */
	if (json_is_string(qr) && *json_string_value(qr)) {
		cli_err("node %s (%s) belongs to the queued resource %s: not "
			"recreating it (recreate the queued resource instead)",
			r->t.name, v->text, json_string_value(qr));
		journal(r, "refuse", node_fields(v));
		return 1;
	}
	settings = tpu_create_body(node);
	if (!r->yes) {
		printf("would %s node %s (%s) and recreate it with:\n",
		       v->cls == TPU_DELETING ? "wait for the deletion of" :
						"delete",
		       r->t.name, v->text);
		print_settings(settings);
		puts("(dry run: nothing was changed; add --yes to act)");
		json_decref(settings);
		return 0;
	}
	f = node_fields(v);
	cli_jset(f, "settings", json_incref(settings));
	if (journal(r, "delete", f)) {
		cli_err("not deleting node %s: its settings could not be "
			"journaled",
			r->t.name);
		goto out;
	}
	/* the last look: never delete a node that is healthy now */
	if (gcp_node_get(r->t.api, r->t.zone, r->t.node, &g) == 0) {
		tpu_judge(g.body, &r->t, 0, &now);
		if (now.cls == TPU_HEALTHY) {
			printf("node %s is healthy now: not deleting it\n",
			       r->t.name);
			journal(r, "refuse", node_fields(&now));
			gcp_reply_free(&g);
			ret = 0;
			goto out;
		}
	} else if (g.http != 404) {
		tpu_report(&r->t, "read it", &g);
		gcp_reply_free(&g);
		goto out;
	}
	gcp_reply_free(&g);
	if (v->cls != TPU_DELETING) {
		snprintf(what, sizeof(what), "deleting node %s", r->t.name);
		if (gcp_node_delete(r->t.api, r->t.zone, r->t.node, &g)) {
			rc = g.http == 404 ? 0 : 1;
			op = g;
			if (rc)
				tpu_report(&r->t, "delete it", &g);
		} else {
			rc = gcp_op_wait(r->t.api, g.body, op_deadline(r), what,
					 &op);
			gcp_reply_free(&g);
			if (rc)
				cli_err("node %s: the delete failed: %s",
					r->t.name, op.msg);
		}
		if (rc) {
			f = cli_jcheck(json_object());
			cli_jset(f, "error", cli_jstr(op.msg));
			gcp_reply_free(&op);
			journal(r,
				!strcmp(op.status, "INTERRUPTED") ?
					"interrupted" :
					"delete-failed",
				f);
			goto out;
		}
		gcp_reply_free(&op);
	}
	if (wait_gone(r, op_deadline(r))) {
		f = cli_jcheck(json_object());
		cli_jset(f, "error", cli_jstr("the node is still there"));
		journal(r, "delete-failed", f);
		goto out;
	}
	if (journal(r, "deleted", NULL))
		goto out;
	ret = create(r, settings);
out:
	json_decref(settings);
	return ret;
}

/* No such node: recreate it from the journal if a recover of it did not
 * finish. */
static int from_journal(struct rec *r, const gcp_reply *g)
{
	struct found f = { .name = r->t.name };
	int rc, ret = 1;

	if (!r->location) {
		tpu_report(&r->t, "read it", g);
		cli_err("give --location to look for its settings in a "
			"journal");
		return 1;
	}
	rc = ckpt_events_read(r->location, on_line, &f);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		goto out;
	}
	if (!f.settings || !f.action[0] || !strcmp(f.action, "created") ||
	    !strcmp(f.action, "refuse") || !strcmp(f.action, "recovered")) {
		tpu_report(&r->t, "read it", g);
		if (f.action[0] && strcmp(f.action, "refuse") &&
		    strcmp(f.action, "recovered"))
			cli_err("the last recover of it ended with '%s' at %s: "
				"it was deleted since; not recreating it",
				f.action, f.time);
		else
			cli_err("no unfinished recover of it in the journal "
				"at %s: nothing to recreate it from",
				r->location);
		goto out;
	}
	printf("node %s does not exist; the recover journaled at %s ended "
	       "with '%s'\n",
	       r->t.name, f.time, f.action);
	if (!r->yes) {
		puts("would create it with the settings journaled by that "
		     "recover:");
		print_settings(f.settings);
		puts("(dry run: nothing was changed; add --yes to act)");
		ret = 0;
		goto out;
	}
	ret = create(r, f.settings);
out:
	json_decref(f.settings);
	return ret;
}

static int recover(struct rec *r)
{
	json_t *node;
	tpu_verdict v;
	gcp_reply g;
	int64_t deadline;
	int rc;

	if (gcp_node_get(r->t.api, r->t.zone, r->t.node, &g)) {
		rc = g.http == 404 ? from_journal(r, &g) : 1;
		if (g.http != 404)
			tpu_report(&r->t, "read it", &g);
		gcp_reply_free(&g);
		return rc;
	}
	node = g.body;
	tpu_judge(node, &r->t, 0, &v);
	if (journal(r, "check", node_fields(&v))) {
		json_decref(node);
		return 1;
	}
	switch (v.cls) {
	case TPU_HEALTHY:
		printf("node %s: %s: nothing to do (recover never deletes a "
		       "healthy node)\n",
		       r->t.name, v.text);
		/* v's strings are the node's: journal before freeing it */
		rc = journal(r, "refuse", node_fields(&v)) ? 1 : 0;
		json_decref(node);
		return rc;
	case TPU_STOPPED:
		cli_err("node %s is %s: stopped by its owner, not recovering "
			"it (start it with gcloud compute tpus tpu-vm start)",
			r->t.name, v.state);
		journal(r, "refuse", node_fields(&v));
		json_decref(node);
		return 1;
	case TPU_TERMINAL:
	case TPU_DELETING:
		break;
	default:
		deadline = (v.since_ns && v.cls != TPU_BUSY ? v.since_ns :
							      cli_now_ns()) +
			   (int64_t)(r->timeout_s * 1e9);
		if (deadline <= cli_now_ns())
			break;
		if (!r->yes) {
			char until[40];

			printf("node %s: %s; it has until %s (--timeout) to "
			       "come back: recover --yes would wait until "
			       "then and, if it is still not healthy:\n",
			       r->t.name, v.text,
			       cli_fmt_time_ms(deadline, until, sizeof(until)));
			break;
		}
		{
			json_t *f = node_fields(&v);
			char until[40];

			cli_jset(f, "until",
				 cli_jstr(cli_fmt_time_ms(deadline, until,
							  sizeof(until))));
			if (journal(r, "wait", f)) {
				json_decref(node);
				return 1;
			}
		}
		rc = wait_healthy(r, &node, deadline);
		/* wait_healthy may have replaced the node v's strings point
		 * into: judge the one we hold now */
		tpu_judge(node, &r->t, 0, &v);
		if (rc == 0) {
			printf("node %s came back by itself: %s\n", r->t.name,
			       v.text);
			rc = journal(r, "recovered", node_fields(&v)) ? 1 : 0;
			json_decref(node);
			return rc;
		}
		if (rc == 1) {
			cli_err("node %s was deleted while recover waited; not "
				"recreating it",
				r->t.name);
			json_decref(node);
			return 1;
		}
		if (rc < 0) {
			journal(r, "interrupted", node_fields(&v));
			json_decref(node);
			return 1;
		}
		if (v.cls == TPU_STOPPED) {
			cli_err("node %s is %s now: stopped by its owner, not "
				"recovering it",
				r->t.name, v.state);
			json_decref(node);
			return 1;
		}
		break;
	}
	rc = replace(r, node, &v);
	json_decref(node);
	return rc;
}

static int cmd_recover(int argc, char **argv)
{
	static const struct option opts[] = {
		TPU_TARGET_OPTS,
		{ "timeout", required_argument, NULL, 't' },
		{ "op-timeout", required_argument, NULL, 'o' },
		{ "yes", no_argument, NULL, 'y' },
		CLI_JOURNAL_OPTS,
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct rec r = { .timeout_s = 600,
			 .op_timeout_s = 1800,
			 .host = RECOVER_HOST };
	const char *env = getenv("CKPT_LOCATION");
	int c, st;

	while ((c = cli_getopt(argc, argv, ":n:z:p:t:o:yl:H:h", opts,
			       help_recover, NULL, &st)) != -1) {
		if (tpu_target_opt(&r.t, c, optarg))
			continue;
		switch (cli_journal_opt(c, optarg, &r.location, &r.host, &st)) {
		case CLI_OPT_EXIT:
			return st;
		case 't':
			if (tpu_parse_duration(optarg, &r.timeout_s))
				return cli_usage("bad --timeout '%s'", optarg);
			break;
		case 'o':
			if (tpu_parse_duration(optarg, &r.op_timeout_s))
				return cli_usage("bad --op-timeout '%s'",
						 optarg);
			break;
		case 'y':
			r.yes = 1;
			break;
		}
	}
	if ((st = cli_operands(argc, 0, NULL)))
		return st;
	if (!r.location && env && *env)
		r.location = env;
	if (r.location && !*r.location)
		return cli_usage("empty --location");
	if (r.yes && !r.location)
		return cli_usage(
			"--yes needs --location LOC (or CKPT_LOCATION): "
			"its event journal records every action and "
			"the node's settings");
	if ((st = tpu_target_finish(&r.t))) {
		tpu_target_free(&r.t);
		return st;
	}
	cli_install_signals();
	st = recover(&r);
	tpu_target_free(&r.t);
	return st;
}

CLI_DEFINE_COMMAND(recover, "delete and recreate a TPU node that did not "
			    "come back");
