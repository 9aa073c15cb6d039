/*
 * tpu.c - the TPU commands' shared parts (see tpu.h): the target node,
 * RFC 3339 times and durations, the judgement of a node, the settings
 * that recreate it, and its maintenance history in the audit logs.
 *
 * Design note, the judgement. The Cloud TPU API says two things about a
 * node: its lifecycle `state` and, for a READY node, its `health`. After
 * a maintenance event a node is READY with health UNHEALTHY_MAINTENANCE
 * and a healthDescription such as "The TPU had a maintenance event at
 * 2022-01-26T03:44:36.265703305Z"; it usually comes back to HEALTHY by
 * itself. A Spot node that was reclaimed is PREEMPTED and stays so; a
 * node may also end TERMINATED. Hence the classes of tpu.h, and:
 *   healthy            READY and health HEALTHY, or no health reported
 *                      (HEALTH_UNSPECIFIED: the API judges nothing bad);
 *   had maintenance    health UNHEALTHY_MAINTENANCE, at the time the
 *                      description names;
 *   unhealthy since T  everything else, T from the description, else from
 *                      the node's latest terminate/restart audit entry.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "tpu.h"

/* ------------------------------------------------------------------ */
/* The target                                                         */
/* ------------------------------------------------------------------ */

int tpu_target_opt(tpu_target *t, int c, const char *arg)
{
	switch (c) {
	case 'n':
		t->node = arg;
		return 1;
	case 'z':
		t->zone = arg;
		return 1;
	case 'p':
		t->project = arg;
		return 1;
	}
	return 0;
}

/* Letters, digits, '-', '_', '.', ':' (domain-scoped projects): what can
 * go into a URL path as it is. */
static int name_ok(const char *s)
{
	if (!s || !*s || strlen(s) > 200)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("-_.:", *s))
			return 0;
	return 1;
}

/* --node projects/P/locations/Z/nodes/N sets all three. */
static int split_full_name(tpu_target *t)
{
	char *d = strdup(t->node), *part[6], *save = NULL, *s;
	int n = 0;

	if (!d)
		cli_jcheck(NULL);
	for (s = strtok_r(d, "/", &save); s && n < 6;
	     s = strtok_r(NULL, "/", &save))
		part[n++] = s;
	if (n != 6 || s || strcmp(part[0], "projects") ||
	    strcmp(part[2], "locations") || strcmp(part[4], "nodes")) {
		free(d);
		return -1;
	}
	if ((t->project && strcmp(t->project, part[1])) ||
	    (t->zone && strcmp(t->zone, part[3]))) {
		free(d);
		return -2;
	}
	t->owned[0] = d;
	t->project = part[1];
	t->zone = part[3];
	t->node = part[5];
	return 0;
}

int tpu_target_finish(tpu_target *t)
{
	if (!t->node)
		return cli_usage("missing --node NAME");
	if (strchr(t->node, '/')) {
		int rc = split_full_name(t);

		if (rc == -1)
			return cli_usage(
				"bad --node '%s' (NAME or "
				"projects/P/locations/ZONE/nodes/NAME)",
				t->node);
		if (rc == -2)
			return cli_usage("--node '%s' names another project or "
					 "zone than --project/--zone",
					 t->node);
	}
	if (!t->zone) {
		t->owned[1] = gcp_default_zone();
		t->zone = t->owned[1];
		if (!t->zone)
			return cli_usage("missing --zone ZONE (or "
					 "CLOUDSDK_COMPUTE_ZONE)");
	}
	if (!name_ok(t->node))
		return cli_usage("bad node name '%s'", t->node);
	if (!name_ok(t->zone))
		return cli_usage("bad zone '%s'", t->zone);
	if (t->project && !name_ok(t->project))
		return cli_usage("bad project '%s'", t->project);
	t->api = gcp_open(t->project);
	if (!t->api)
		return 1;
	if (!name_ok(gcp_project(t->api))) {
		cli_err("bad project id '%s'", gcp_project(t->api));
		return 1;
	}
	gcp_node_name(t->api, t->zone, t->node, t->name, sizeof(t->name));
	return 0;
}

void tpu_target_free(tpu_target *t)
{
	gcp_close(t->api);
	t->api = NULL;
	for (int i = 0; i < 3; i++) {
		free(t->owned[i]);
		t->owned[i] = NULL;
	}
}

void tpu_report(const tpu_target *t, const char *what, const gcp_reply *r)
{
	const char *hint = "";

	if (r->http == 401)
		hint = " (the access token was refused: renew it)";
	else if (r->http == 403)
		hint = " (the account lacks the permission, or the API is "
		       "not enabled in the project)";
	else if (r->http == 404)
		hint = " (no such node in this project and zone)";
	else if (r->http == 409)
		hint = " (a conflict: another operation on the node may be "
		       "running; try again later)";
	else if (r->http == 429)
		hint = " (rate limited: retried, then gave up)";
	else if (r->http >= 500)
		hint = " (the API failed: retried, then gave up)";
	cli_err("node %s: cannot %s: %s%s", t->name[0] ? t->name : t->node,
		what, r->msg, hint);
}

/* ------------------------------------------------------------------ */
/* Times                                                              */
/* ------------------------------------------------------------------ */

/* n digits at s into *v; the end, or NULL. */
static const char *digits(const char *s, int n, int *v)
{
	*v = 0;
	for (int i = 0; i < n; i++, s++) {
		if (!isdigit((unsigned char)*s))
			return NULL;
		*v = *v * 10 + (*s - '0');
	}
	return s;
}

/* Parses the time at s; the end of it, or NULL. */
static const char *parse_time(const char *s, int64_t *ns)
{
	int y, mo, d, h, mi, sec, oh = 0, om = 0;
	int64_t frac = 0, scale = 100000000;
	struct tm tm = { 0 };
	time_t t;

	if (!(s = digits(s, 4, &y)) || *s++ != '-' ||
	    !(s = digits(s, 2, &mo)) || *s++ != '-' ||
	    !(s = digits(s, 2, &d)) || (*s != 'T' && *s != 't') ||
	    !(s = digits(s + 1, 2, &h)) || *s++ != ':' ||
	    !(s = digits(s, 2, &mi)) || *s++ != ':' ||
	    !(s = digits(s, 2, &sec)))
		return NULL;
	if (*s == '.') {
		for (s++; isdigit((unsigned char)*s); s++) {
			frac += (*s - '0') * scale;
			scale /= 10;
		}
	}
	if (*s == 'Z' || *s == 'z') {
		s++;
	} else if (*s == '+' || *s == '-') {
		int sign = *s == '-' ? -1 : 1;

		if (!(s = digits(s + 1, 2, &oh)) || *s++ != ':' ||
		    !(s = digits(s, 2, &om)))
			return NULL;
		oh *= sign;
		om *= sign;
	} else {
		return NULL;
	}
	if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
	    sec > 60)
		return NULL;
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = sec;
	t = timegm(&tm) - (oh * 3600 + om * 60);
	*ns = (int64_t)t * 1000000000 + frac;
	return s;
}

int tpu_parse_time(const char *s, int64_t *ns)
{
	const char *e = s ? parse_time(s, ns) : NULL;

	return e && !*e ? 0 : -1;
}

int tpu_find_time(const char *text, int64_t *ns)
{
	for (const char *p = text; p && *p; p++)
		if (isdigit((unsigned char)*p) && parse_time(p, ns))
			return 0;
	return -1;
}

int tpu_parse_duration(const char *s, double *seconds)
{
	char *end;
	double v, unit = 1;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || !isdigit((unsigned char)*s))
		return -1;
	if (*end) {
		switch (*end++) {
		case 's':
			unit = 1;
			break;
		case 'm':
			unit = 60;
			break;
		case 'h':
			unit = 3600;
			break;
		case 'd':
			unit = 86400;
			break;
		default:
			return -1;
		}
		if (*end)
			return -1;
	}
	v *= unit;
	if (!isfinite(v) || v < 0 || v > 400 * 86400.0)
		return -1;
	*seconds = v;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Judging a node                                                     */
/* ------------------------------------------------------------------ */

const char *tpu_class_name(enum tpu_class c)
{
	static const char *const n[] = { "healthy",  "maintenance", "unhealthy",
					 "terminal", "busy",        "stopped",
					 "deleting" };

	return (unsigned)c < sizeof(n) / sizeof(n[0]) ? n[c] : "?";
}

static const char *str(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_string(v) ? json_string_value(v) : "";
}

static int in(const char *s, const char *const *list)
{
	for (; *list; list++)
		if (!strcmp(s, *list))
			return 1;
	return 0;
}

static enum tpu_class classify(const char *state, const char *health)
{
	static const char *const terminal[] = { "PREEMPTED", "TERMINATED",
						NULL };
	static const char *const stopped[] = { "STOPPED", "STOPPING", "HIDING",
					       "HIDDEN", NULL };

	if (!strcmp(state, "DELETING"))
		return TPU_DELETING;
	if (in(state, terminal))
		return TPU_TERMINAL;
	if (in(state, stopped))
		return TPU_STOPPED;
	if (strcmp(state, "READY"))
		return TPU_BUSY; /* CREATING, RESTARTING, REPAIRING, ... */
	if (!strcmp(health, "UNHEALTHY_MAINTENANCE"))
		return TPU_MAINTENANCE;
	if (!*health || !strcmp(health, "HEALTHY") ||
	    !strcmp(health, "HEALTH_UNSPECIFIED"))
		return TPU_HEALTHY;
	return TPU_UNHEALTHY;
}

static int latest_entry(void *arg, json_t *ev)
{
	int64_t *ns = arg;

	tpu_parse_time(str(ev, "time"), ns);
	return 1; /* one is enough */
}

/* "; maintenance announced: SCHEDULED PENDING from T to T" or "". */
static void announced(json_t *node, char *buf, size_t len)
{
	json_t *um = json_object_get(node, "upcomingMaintenance");

	buf[0] = 0;
	if (!json_is_object(um) || !json_object_size(um))
		return;
	snprintf(buf, len, "; maintenance announced: %s%s%s window %s to %s",
		 str(um, "type"), *str(um, "maintenanceStatus") ? " " : "",
		 str(um, "maintenanceStatus"),
		 *str(um, "windowStartTime") ? str(um, "windowStartTime") : "?",
		 *str(um, "windowEndTime") ? str(um, "windowEndTime") : "?");
}

void tpu_judge(json_t *node, tpu_target *t, int ask_audit, tpu_verdict *v)
{
	const char *desc = str(node, "healthDescription");
	char when[40], ann[300], what[120];
	size_t nsym = json_array_size(json_object_get(node, "symptoms"));

	memset(v, 0, sizeof(*v));
	v->state = str(node, "state");
	v->health = str(node, "health");
	v->cls = classify(v->state, v->health);
	announced(node, ann, sizeof(ann));
	if (v->cls != TPU_HEALTHY && tpu_find_time(desc, &v->since_ns) == 0)
		v->since_from = "healthDescription";
	if (v->cls != TPU_HEALTHY && !v->since_ns && ask_audit && t->api) {
		gcp_reply r;

		if (tpu_audit_list(t, 0, "timestamp desc", 1, 0, latest_entry,
				   &v->since_ns, &r) >= 0 &&
		    v->since_ns)
			v->since_from = "audit";
		gcp_reply_free(&r);
	}
	cli_fmt_time_ms(v->since_ns, when, sizeof(when));
	if (v->cls == TPU_HEALTHY) {
		snprintf(v->text, sizeof(v->text), "healthy%s%s", ann,
			 nsym ? " (symptoms reported)" : "");
		return;
	}
	if (v->cls == TPU_MAINTENANCE) {
		snprintf(v->text, sizeof(v->text), "had maintenance at %s%s",
			 v->since_ns ? when : "an unknown time", ann);
		return;
	}
	if (v->cls == TPU_UNHEALTHY)
		snprintf(what, sizeof(what), "health %s", v->health);
	else if (v->cls == TPU_BUSY)
		snprintf(what, sizeof(what), "state %s, in progress",
			 *v->state ? v->state : "STATE_UNSPECIFIED");
	else
		snprintf(what, sizeof(what), "state %s", v->state);
	if (v->since_ns)
		snprintf(v->text, sizeof(v->text), "unhealthy since %s: %s%s",
			 when, what, ann);
	else
		snprintf(v->text, sizeof(v->text), "unhealthy: %s%s", what,
			 ann);
}

/* ------------------------------------------------------------------ */
/* The settings that recreate a node                                  */
/* ------------------------------------------------------------------ */

json_t *tpu_create_body(json_t *node)
{
	/* the Node fields a create accepts; all others are output only
	 * (name, state, health, healthDescription, symptoms, createTime,
	 * networkEndpoints, id, apiVersion, queuedResource,
	 * multisliceNode, upcomingMaintenance) */
	static const char *const keep[] = {
		"description",       "acceleratorType",
		"acceleratorConfig", "runtimeVersion",
		"networkConfig",     "networkConfigs",
		"cidrBlock",         "serviceAccount",
		"schedulingConfig",  "labels",
		"metadata",          "tags",
		"dataDisks",         "shieldedInstanceConfig",
		"bootDiskConfig",    "autocheckpointEnabled",
	};
	json_t *b = cli_jcheck(json_object()), *v;

	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
		v = json_object_get(node, keep[i]);
		if (!v || json_is_null(v))
			continue;
		/* mutually exclusive pairs: the API returns both, a create
		 * takes one */
		if (!strcmp(keep[i], "acceleratorConfig") &&
		    json_object_get(node, "acceleratorType"))
			continue;
		if (!strcmp(keep[i], "networkConfigs") &&
		    json_object_get(node, "networkConfig"))
			continue;
		cli_jset(b, keep[i], cli_jcheck(json_deep_copy(v)));
	}
	return b;
}

/* ------------------------------------------------------------------ */
/* Audit logs                                                         */
/* ------------------------------------------------------------------ */

struct audit_walk {
	tpu_target *t;
	gcp_entry_fn fn;
	void *arg;
};

static int on_entry(void *arg, json_t *e)
{
	struct audit_walk *w = arg;
	json_t *pp = json_object_get(e, "protoPayload");
	json_t *labels =
		json_object_get(json_object_get(e, "resource"), "labels");
	const char *method = str(pp, "methodName");
	const char *zone = str(labels, "zone");
	const char *dot = strrchr(method, '.');
	json_t *reason = json_object_get(json_object_get(pp, "metadata"),
					 "terminateReason");
	json_t *ev;
	int64_t ns;
	char t[40];
	int rc;

	/* the filter names the node; a node of that name in another zone
	 * is not this one */
	if (*zone && strcmp(zone, w->t->zone))
		return 0;
	ev = cli_jcheck(json_object());
	if (tpu_parse_time(str(e, "timestamp"), &ns) == 0)
		cli_jset(ev, "time",
			 cli_jstr(cli_fmt_time_ms(ns, t, sizeof(t))));
	else
		cli_jset(ev, "time", cli_jstr(str(e, "timestamp")));
	cli_jset(ev, "source", cli_jstr("audit"));
	cli_jset(ev, "action", cli_jstr(dot ? dot + 1 : method));
	cli_jset(ev, "method", cli_jstr(method));
	if (json_is_string(reason))
		cli_jset(ev, "reason", json_incref(reason));
	cli_jset(ev, "node", cli_jstr(w->t->node));
	if (*zone)
		cli_jset(ev, "zone", cli_jstr(zone));
	if (*str(e, "insertId"))
		cli_jset(ev, "insertId", cli_jstr(str(e, "insertId")));
	rc = w->fn(w->arg, ev);
	json_decref(ev);
	return rc;
}

int tpu_audit_list(tpu_target *t, int64_t since_ns, const char *order,
		   uint64_t max, int retry, gcp_entry_fn fn, void *arg,
		   gcp_reply *r)
{
	struct audit_walk w = { t, fn, arg };
	char filter[700], since[64] = "";
	int rc;

	if (since_ns > 0) {
		char ts[40];

		snprintf(since, sizeof(since), " AND timestamp>=\"%s\"",
			 cli_fmt_time_ms(since_ns, ts, sizeof(ts)));
	}
	snprintf(filter, sizeof(filter),
		 "protoPayload.methodName=(\"tpu.nodes.terminate\" OR "
		 "\"tpu.nodes.restart\") AND resource.labels.node_id=\"%s\"%s",
		 t->node, since);
	rc = gcp_log_list(t->api, filter, order, max, retry, on_entry, &w, r);
	return rc;
}
