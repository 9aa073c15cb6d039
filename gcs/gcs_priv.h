/* gcs_priv.h - structures shared by the gcs_*.c files (not for callers).
 *
 * An operation (gcs_op) is a small state machine: it fills in its one
 * request (gcs_req), the client's loop runs it, and when the attempt ends
 * the loop calls op->step(). step() either finishes the op, issues the next
 * request (e.g. the next upload chunk), or asks for a retry after backoff
 * with op_retry_or_fail(). An op waits in the client's list with `due` set
 * when it wants to (re)issue; at most `streams` requests are on the wire.
 */
#ifndef CKPT_GCS_PRIV_H
#define CKPT_GCS_PRIV_H

#include "gcs.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdatomic.h>

struct gcs_buf {
	char *p;
	size_t len, cap;
};

struct gcs_req {
	CURL *easy;
	struct curl_slist *hdrs;
	struct curl_slist *sent_hdrs; /* the attempt's own list */
	char *url;
	const char *method;
	int auth; /* add the bearer token (storage endpoint only) */
	/* request body: up to three pieces of memory (multipart: head,
	 * the caller's data, tail; no copy), or an upload's segments */
	struct gcs_iov {
		const void *p;
		size_t n;
	} iov[3];
	size_t body_len, body_off; /* total, and bytes read so far */
	int has_body;
	struct gcs_upload *src;
	uint64_t src_start, src_off, src_end;
	struct gcs_seg *cur; /* read cursor in src's segments */
	/* media reply goes to sink (fixed or growing), anything else to resp */
	int media;
	unsigned char *sink;
	size_t sink_cap, sink_len;
	int sink_grow;
	uint64_t sink_max; /* growing sink: 0 = no limit */
	int too_big;
	uint32_t sink_crc;
	int64_t expect_start; /* media must start here (206), -1: any */
	int proto_err;
	int resent; /* curl rewound a body it had sent: sent twice */
	/* reply */
	long status;
	CURLcode cc;
	char errbuf[CURL_ERROR_SIZE];
	struct gcs_buf resp;
	char *location;
	int has_range;
	uint64_t range_end; /* Range: bytes=0-N  ->  N + 1 */
	int has_hash;
	uint32_t hash_crc;
	int hash_bad;
	int64_t x_generation;
	int has_content_range;
	uint64_t cr_start, cr_total;
};

enum gcs_op_kind {
	OP_READ,
	OP_GET,
	OP_STAT,
	OP_PUT,
	OP_DELETE,
	OP_COMPOSE,
	OP_LIST,
	OP_UPLOAD,
	OP_RAW, /* test helpers: one request, reply kept */
};

struct gcs_op {
	struct gcs_client *c;
	enum gcs_op_kind kind;
	void (*step)(struct gcs_op *op);
	int done, rc;
	int waiting; /* wants to issue req at time `due` */
	int in_flight;
	double due, t_start, deadline;
	unsigned attempt; /* attempts of the current request */
	int idempotent;
	char what[400];      /* "gs://bucket/name" for messages */
	char invocation[17]; /* x-goog-api-client invocation id */
	char msg[1024];
	struct gcs_req req;
	struct gcs_op *next, *prev; /* client's list of live ops */
	int owned_by_upload;

	char *bucket, *name;
	/* reads */
	uint64_t off;
	size_t len, *got;
	unsigned char *buf;
	int64_t pin_generation; /* resume a broken read on the same gen */
	size_t mark;            /* download bytes before this attempt */
	int have_hash;
	uint32_t hash_crc;
	/* metadata result */
	struct gcs_object obj;
	int has_obj;
	/* list */
	gcs_list_fn list_fn;
	void *list_arg;
	char *page_token;
	char *prefix, *delimiter;
	unsigned pages;
	/* bodies built by the op (JSON, multipart head and tail) */
	char *body, *body2;
};

struct gcs_seg {
	const unsigned char *p;
	size_t len;
	uint64_t off; /* offset of p[0] in the object */
	gcs_release_fn release;
	void *arg;
	struct gcs_seg *next;
};

struct gcs_upload {
	struct gcs_op op;
	struct gcs_upload_opts opts;
	char *session;
	uint64_t persisted; /* server has [0, persisted) */
	uint64_t appended;  /* bytes queued so far (end offset) */
	uint64_t crc_from;  /* crc covers [crc_from, appended) */
	uint32_t crc;
	int crc_given;
	uint32_t final_crc;
	int finishing;
	int phase; /* UP_* */
	int querying;
	int reattach; /* first status query of a saved session */
	double delay; /* before the next piece (backoff) */
	struct gcs_seg *head, *tail;
};

struct gcs_client {
	struct gcs_config cfg;
	CURLM *multi;
	CURL **pool;
	unsigned n_pool;
	unsigned active;
	struct gcs_op *ops; /* live ops */
	char *base;         /* scheme://host[:port] of the JSON API */
	char *api;          /* {base}/storage/v1 */
	char *upload;       /* {base}/upload/storage/v1 */
	char *origin;       /* scheme://host[:port], for session URIs */
	int anonymous;
	char *token_file;
	char *md_url;        /* metadata server token URL */
	char *token;         /* current bearer token (never logged) */
	double token_expiry; /* metadata: when; token file: mtime seen */
	double token_margin; /* refresh this long before expiry */
	uint64_t rng;
	struct gcs_stats stats;
	atomic_int woken; /* gcs_wakeup() since the last gcs_poll() */
	atomic_int cancelled; /* gcs_cancel(): every op ends */
	char msg[1024];
};

double gcs_now(void);
char *gcs_strdup(const char *s);
char *gcs_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *gcs_escape(const char *s); /* percent-encode a path segment / query */
int gcs_buf_add(struct gcs_buf *b, const void *p, size_t n);

/* op plumbing (gcs_http.c) */
void op_init(struct gcs_client *c, struct gcs_op *op, enum gcs_op_kind kind,
	     const char *bucket, const char *name);
void op_issue(struct gcs_op *op, double delay);
void op_finish(struct gcs_op *op, int rc);
int op_fail(struct gcs_op *op, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int op_http_error(struct gcs_op *op, const char *doing);
int op_retryable(const struct gcs_op *op);
int op_retry_or_fail(struct gcs_op *op, const char *doing);
double op_backoff(struct gcs_op *op);
void req_reset(struct gcs_req *r);
void op_release(struct gcs_op *op);
int req_set(struct gcs_req *r, const char *method, char *url);
int req_header(struct gcs_req *r, const char *h);
void req_body(struct gcs_req *r, const void *head, size_t head_len,
	      const void *mid, size_t mid_len, const void *tail,
	      size_t tail_len);
int req_cond(struct gcs_req *r, struct gcs_cond cond); /* appends query */
int op_parse_object(struct gcs_op *op, json_t *j, struct gcs_object *o);
json_t *op_json_reply(struct gcs_op *op, const char *doing);

/* auth (gcs_auth.c) */
int gcs_auth_setup(struct gcs_client *c);
int gcs_auth_header(struct gcs_client *c, char **hdr, char *err, size_t errlen);
void gcs_auth_free(struct gcs_client *c);

/* upload (gcs_upload.c) */
size_t upload_read_cb(char *dst, size_t size, size_t n, void *arg);

#endif
