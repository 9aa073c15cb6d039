/*
 * gcp_api.h - a small REST client for the Cloud TPU API v2 and the Cloud
 * Logging API v2, for ckptctl's health, recover and events --audit.
 *
 * Design note: the tool's own code over libcurl and jansson (tools/ never
 * reach into gcs/). Configuration follows gcloud so a user's setup
 * carries over (see gcp_open). One gcp_api per command; not thread-safe.
 * A call returns 0 for a 2xx reply, else -1 with a message that carries
 * the HTTP status, Google's status name and the API's own words, and
 * never the token. Reads (GET, entries:list) and calls made idempotent
 * (a create with a requestId) are retried on 408, 429, 5xx and transport
 * failures with Google's backoff (doubling, full jitter, Retry-After
 * honoured); others are not.
 *
 *   command --> gcp_call --(Bearer token)--> TPU / Logging REST
 *                  ^-- token: CLOUDSDK_AUTH_ACCESS_TOKEN_FILE | metadata
 */
#ifndef CKPTCTL_GCP_API_H
#define CKPTCTL_GCP_API_H

#include <stdint.h>

#include <jansson.h>

typedef struct gcp_api gcp_api;

/* The outcome of one call (after its retries). */
typedef struct gcp_reply {
	long http;       /* last HTTP status; 0: no reply at all */
	char status[40]; /* Google's status name ("NOT_FOUND"), or "" */
	char msg[1024];  /* failure: "HTTP 404 NOT_FOUND: <the API's words>" */
	json_t *body;    /* the parsed reply (owned by the caller), or NULL */
	int attempts;
} gcp_reply;

/*
 * Reads the configuration, as gcloud does:
 *  project   the argument, else CLOUDSDK_CORE_PROJECT, else the metadata
 *            server's project/project-id;
 *  endpoints CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU / _LOGGING, else
 *            https://tpu.googleapis.com/ and https://logging.googleapis.com/
 *            (paths v2/... are appended);
 *  token     the file CLOUDSDK_AUTH_ACCESS_TOKEN_FILE names, else the
 *            metadata server's default service account (GCE_METADATA_HOST,
 *            else metadata.google.internal), fetched on the first call;
 *  retries   CKPT_API_BACKOFF_S: the first backoff (default 1 s, doubling
 *            to 32 s; 6 attempts).
 * The project is resolved at once (needed for every name); the token on
 * the first call. Prints why and returns NULL on failure.
 */
gcp_api *gcp_open(const char *project);
void gcp_close(gcp_api *a); /* accepts NULL */
const char *gcp_project(const gcp_api *a);

/* The zone from CLOUDSDK_COMPUTE_ZONE or the metadata server's
 * instance/zone (last path element); malloc'd, or NULL. */
char *gcp_default_zone(void);

/*
 * One REST call. `api` is 't' (TPU) or 'l' (Logging); `path` is appended
 * to that endpoint ("v2/projects/..."); `body` (not consumed) is sent as
 * JSON. `retry`: the call may be repeated safely. The reply is in *r
 * (release with gcp_reply_free). 0 for 2xx, else -1 with r->msg set.
 */
int gcp_call(gcp_api *a, char api, const char *method, const char *path,
	     json_t *body, int retry, gcp_reply *r);
void gcp_reply_free(gcp_reply *r);

/* The google.rpc.Code name of code `c` ("RESOURCE_EXHAUSTED"). */
const char *gcp_code_name(long c);

/* Sleeps `seconds` unless SIGINT/SIGTERM arrives first (returns 1). */
int gcp_sleep(double seconds);

/* A random UUID (version 4) for requestId: 37 bytes with the NUL. */
void gcp_uuid(char out[37]);

/* ---- Cloud TPU API: nodes and long-running operations ---- */

/* "projects/P/locations/Z/nodes/N" into buf. */
const char *gcp_node_name(const gcp_api *a, const char *zone, const char *node,
			  char *buf, size_t len);
/* GET the node; 0 with r->body the node, else -1 (r->http 404: none). */
int gcp_node_get(gcp_api *a, const char *zone, const char *node, gcp_reply *r);
/* DELETE the node; 0 with r->body the operation. */
int gcp_node_delete(gcp_api *a, const char *zone, const char *node,
		    gcp_reply *r);
/* POST .../nodes?nodeId=N&requestId=U with `body`; 0 with r->body the
 * operation. */
int gcp_node_create(gcp_api *a, const char *zone, const char *node,
		    json_t *body, const char *request_id, gcp_reply *r);

/*
 * Polls operation `op` (its JSON as returned by a call) until done or
 * until `deadline_ns` (CLOCK_REALTIME), printing `what` with the elapsed
 * time on stderr (an updating line on a terminal). Returns 0 when done
 * without error (r->body the final operation), 1 when done with an error
 * (r->msg "CODE_NAME (n): message", r->status the code name), -1 when a
 * poll failed, the deadline passed (r->status "DEADLINE") or SIGINT/
 * SIGTERM arrived (r->status "INTERRUPTED").
 */
int gcp_op_wait(gcp_api *a, json_t *op, int64_t deadline_ns, const char *what,
		gcp_reply *r);

/* ---- Cloud Logging API ---- */

/* Called per entry, oldest first; non-zero stops the listing. */
typedef int (*gcp_entry_fn)(void *arg, json_t *entry);

/*
 * POST v2/entries:list for resourceNames ["projects/P"], `filter`, in
 * `order` ("timestamp asc" or "timestamp desc"), following nextPageToken
 * until the end or `max` entries (0: no limit). `retry` as for gcp_call.
 * 0, or -1 with r->msg (or what fn returned).
 */
int gcp_log_list(gcp_api *a, const char *filter, const char *order,
		 uint64_t max, int retry, gcp_entry_fn fn, void *arg,
		 gcp_reply *r);

#endif
