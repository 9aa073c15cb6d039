/*
 * tpu.h - what ckptctl's TPU commands (health, recover, events --audit)
 * share: the node they name, how healthy a node is, the settings that
 * recreate it, and its maintenance entries in the audit logs.
 *
 * Design note: the commands hold their own flow; the judgement of a
 * node (tpu_judge) lives here once, so `health` and `recover` can never
 * disagree on what "healthy" means. Built on gcp_api.h (the REST calls).
 */
#ifndef CKPTCTL_TPU_H
#define CKPTCTL_TPU_H

#include <stdint.h>

#include <jansson.h>

#include "gcp_api.h"

/* Options every TPU command takes; shortopts "n:z:p:". */
/* clang-format off */
#define TPU_TARGET_OPTS \
	{ "node", required_argument, NULL, 'n' }, \
	{ "zone", required_argument, NULL, 'z' }, \
	{ "project", required_argument, NULL, 'p' }
/* clang-format on */

/* The node a command is about. */
typedef struct tpu_target {
	const char *node, *zone, *project; /* from the options */
	char *owned[3];                    /* what tpu_target_finish made */
	gcp_api *api;
	char name[768]; /* projects/P/locations/Z/nodes/N */
} tpu_target;

/* Takes option c ('n', 'z', 'p'); 1 if it was one of them. */
int tpu_target_opt(tpu_target *t, int c, const char *arg);
/*
 * After the options: accepts --node as a full resource name, takes the
 * zone from CLOUDSDK_COMPUTE_ZONE or the metadata server when --zone is
 * absent, checks the names, opens the API (project as gcp_open). Returns
 * 0, CLI_EXIT_USAGE after a usage message, or 1 after printing why.
 */
int tpu_target_finish(tpu_target *t);
void tpu_target_free(tpu_target *t);
/* "ckptctl: CMD: node NAME: cannot WHAT: HTTP n STATUS: the API's words"
 * plus what the status usually means. */
void tpu_report(const tpu_target *t, const char *what, const gcp_reply *r);

/* ---- Times ---- */

/* RFC 3339 ("2026-12-03T08:00:00.123456789Z", offsets allowed) to unix
 * ns; 0, or -1 if malformed. */
int tpu_parse_time(const char *s, int64_t *ns);
/* The first RFC 3339 time inside free text; 0 if found. */
int tpu_find_time(const char *text, int64_t *ns);
/* "90", "90s", "15m", "2h", "7d", "1.5h" to seconds; 0, or -1. */
int tpu_parse_duration(const char *s, double *seconds);

/* ---- Judging a node ---- */

enum tpu_class {
	TPU_HEALTHY = 0, /* READY, health HEALTHY (or not reported) */
	TPU_MAINTENANCE, /* health UNHEALTHY_MAINTENANCE */
	TPU_UNHEALTHY,   /* another health: TIMEOUT, UNHEALTHY_TENSORFLOW */
	TPU_TERMINAL,    /* PREEMPTED, TERMINATED: will not come back */
	TPU_BUSY,        /* CREATING, RESTARTING, REPAIRING, ... */
	TPU_STOPPED,     /* STOPPED, STOPPING, HIDING, HIDDEN: by an owner */
	TPU_DELETING,    /* DELETING */
};

typedef struct tpu_verdict {
	enum tpu_class cls;
	const char *state, *health; /* the node's ("" when absent) */
	int64_t since_ns;           /* 0: unknown */
	const char *since_from;     /* "healthDescription", "audit", NULL */
	char text[600];             /* the one-line verdict */
} tpu_verdict;

/*
 * Judges `node` (the API's JSON). When it is not healthy and its
 * healthDescription has no time, the node's latest terminate/restart
 * audit entry gives "since", if `api` is not NULL and Logging answers
 * (one attempt; a failure only leaves the time unknown).
 */
void tpu_judge(json_t *node, tpu_target *t, int ask_audit, tpu_verdict *v);
const char *tpu_class_name(enum tpu_class c);

/*
 * The body that recreates `node`: its settings (acceleratorType or
 * acceleratorConfig, runtimeVersion, networkConfig(s), cidrBlock,
 * serviceAccount, schedulingConfig, labels, metadata with the startup
 * script, tags, dataDisks, shieldedInstanceConfig, bootDiskConfig,
 * description, autocheckpointEnabled), none of its output-only fields.
 * New reference.
 */
json_t *tpu_create_body(json_t *node);

/* ---- Audit logs ---- */

/*
 * Lists the node's tpu.nodes.terminate and tpu.nodes.restart entries
 * from `since_ns` (0: all), in `order` ("timestamp asc"/"timestamp
 * desc"), at most `max` (0: all); calls fn with each as a journal-like
 * object {time, source "audit", action "terminate"|"restart", method,
 * reason (terminateReason), node, zone, insertId} (borrowed reference).
 * 0, or -1 with r->msg.
 */
int tpu_audit_list(tpu_target *t, int64_t since_ns, const char *order,
		   uint64_t max, int retry, gcp_entry_fn fn, void *arg,
		   gcp_reply *r);

#endif
