/* gcs.h - internal Cloud Storage client (JSON API over libcurl).
 *
 * Design: one `struct gcs_client` owns a curl multi handle, a pool of easy
 * handles (connections are kept alive and reused across requests) and the
 * auth state. Every call is an operation (`struct gcs_op`) that may take
 * several HTTP attempts; the client runs up to `streams` attempts at once
 * and drives them all from whichever thread calls gcs_poll()/gcs_op_wait()
 * (the client is not thread-safe: one thread owns it, e.g. the engine's
 * upload thread; others hand it work and call gcs_wakeup()). Parallelism
 * comes from many operations in flight on that one loop, not from
 * threads. The synchronous helpers are start + wait + free.
 *
 *   caller buffers --append--> gcs_upload (segment queue, no copy)
 *        |                       |  chunk PUT read callback walks segments
 *        v                       v
 *   release(arg) <-- confirmed by 308 Range / final 200 -- server
 *
 * Retries follow Google's policy: 408, 429, 5xx, connection errors and
 * timeouts are retried with exponential backoff and full jitter within a
 * per-operation deadline, but only when the request is idempotent (reads,
 * lists; writes with an ifGenerationMatch precondition; resumable chunks,
 * which resume through the `bytes *` status query rather than a blind
 * re-send). Failures come back as 0 / -errno / GCS_E_* with a message
 * naming the object, the last HTTP status and the server's own message.
 * Tokens are only ever put in the Authorization header, never in messages.
 *
 * gcs/ knows nothing of engine/ or format/.
 */
#ifndef CKPT_GCS_H
#define CKPT_GCS_H

#include <stddef.h>
#include <stdint.h>

/* Library codes (negative, outside the errno range). 404 is -ENOENT,
 * 401/403 -EACCES, 416 -ERANGE, an exceeded deadline -ETIMEDOUT. */
#define GCS_E_PRECONDITION (-7001) /* HTTP 412: ifGeneration*Match failed */
#define GCS_E_HTTP (-7002)         /* other error status from the server */
#define GCS_E_CHECKSUM (-7003)     /* crc32c of the bytes does not match */
#define GCS_E_PROTOCOL (-7004)     /* malformed or hostile reply */
#define GCS_E_TRANSPORT (-7005)    /* connection failed (not retried) */
#define GCS_E_SESSION (-7006)      /* resumable session gone (404/410) */

#define GCS_PIECE 262144u /* resumable chunks: multiples of 256 KiB */

struct gcs_config {
	unsigned streams;         /* parallel transfers; 0 = 16 */
	double initial_backoff_s; /* 0 = 1 */
	double max_backoff_s;     /* 0 = 32 */
	double backoff_mult;      /* 0 = 2 */
	double deadline_s;        /* per operation; 0 = 600 */
	unsigned max_attempts;    /* 0 = bounded by the deadline only */
	double connect_timeout_s; /* 0 = 10 */
	unsigned stall_s;        /* no byte moved for this long = error; 0=60 */
	size_t chunk_bytes;      /* resumable piece; 0 = 16 MiB, rounded */
	size_t multipart_max;    /* gcs_put limit; 0 = 16 MiB */
	unsigned max_list_pages; /* 0 = 100000 */
	unsigned list_page_size; /* maxResults; 0 = 1000 */
	/* Tests: endpoint ("host:port" or URL, no credentials) instead of the
	 * environment, and an x-retry-test-id header on every request. */
	const char *endpoint;
	const char *retry_test_id;
};

struct gcs_object {
	char *name; /* malloc'd */
	int64_t generation;
	int64_t metageneration;
	uint64_t size;
	uint32_t crc32c;
	int has_crc32c;
};

struct gcs_list {
	struct gcs_object *items;
	size_t n_items;
	char **prefixes; /* with a delimiter: the "directories" */
	size_t n_prefixes;
};

/* Preconditions: if_generation_match >= 0 is sent (0 = create only);
 * -1 means none. Likewise if_metageneration_match. */
struct gcs_cond {
	int64_t if_generation_match;
	int64_t if_metageneration_match;
};
#define GCS_NO_COND ((struct gcs_cond){ -1, -1 })
#define GCS_CREATE_ONLY ((struct gcs_cond){ 0, -1 })

struct gcs_client;
struct gcs_op;
struct gcs_upload;

/* Reads the environment (STORAGE_EMULATOR_HOST, CLOUDSDK_* and the metadata
 * server, in that order) unless cfg->endpoint is set. */
int gcs_client_new(struct gcs_client **out, const struct gcs_config *cfg);
void gcs_client_free(struct gcs_client *c);
/* Message of the last failed operation on this client. */
const char *gcs_errmsg(const struct gcs_client *c);
/* Counters since the client was made. */
struct gcs_stats {
	uint64_t requests; /* HTTP attempts */
	uint64_t retries;  /* attempts that repeated a failed one */
	uint64_t connects; /* new connections (the rest reused one) */
	uint64_t bytes_up, bytes_down;
};
void gcs_get_stats(const struct gcs_client *c, struct gcs_stats *st);

/* Drive transfers for at most timeout_ms (0: only what is ready now);
 * returns early when nothing is running, when an operation completed or
 * after gcs_wakeup(). Returns the number of operations still running. */
int gcs_poll(struct gcs_client *c, int timeout_ms);
/* The one call another thread may make: ends the owner's gcs_poll() (or
 * the next one) early, e.g. after queueing data for it to append. */
void gcs_wakeup(struct gcs_client *c);
/* Also callable from another thread: every operation of the client, now
 * and later, ends at once with -ECANCELED ("cancelled"), in flight or
 * not; for a thread that must stop now rather than after its requests'
 * deadline. Wakes the owner. */
void gcs_cancel(struct gcs_client *c);
int gcs_op_done(const struct gcs_op *op);
int gcs_op_wait(struct gcs_op *op); /* result: 0 or error */
const char *gcs_op_errmsg(const struct gcs_op *op);
void gcs_op_free(struct gcs_op *op);

/* Asynchronous ranged read of [off, off+len) into buf (len > 0); *got is
 * set when it completes (less than len at the end of the object). Bytes are not
 * checked: the caller verifies ranges with its own checksums. */
int gcs_start_read(struct gcs_client *c, const char *bucket, const char *name,
		   uint64_t off, size_t len, void *buf, size_t *got,
		   struct gcs_op **out);
int gcs_read(struct gcs_client *c, const char *bucket, const char *name,
	     uint64_t off, size_t len, void *buf, size_t *got);
/* Whole object into a malloc'd buffer, checked against x-goog-hash;
 * -EFBIG when it is larger than max_len (0: no limit). */
int gcs_get(struct gcs_client *c, const char *bucket, const char *name,
	    uint64_t max_len, void **data, size_t *len,
	    struct gcs_object *meta);
int gcs_stat(struct gcs_client *c, const char *bucket, const char *name,
	     struct gcs_object *meta);
/* One request (multipart/related), crc32c in the metadata; for small
 * objects (<= multipart_max). */
int gcs_put(struct gcs_client *c, const char *bucket, const char *name,
	    const void *data, size_t len, struct gcs_cond cond,
	    struct gcs_object *meta);
/* generation > 0 deletes that generation (and makes the call retryable). */
int gcs_delete(struct gcs_client *c, const char *bucket, const char *name,
	       int64_t generation, struct gcs_cond cond);
/* Compose up to 32 sources (generations may be 0 = live) into dest. */
int gcs_compose(struct gcs_client *c, const char *bucket, const char *dest,
		const char *const *srcs, const int64_t *src_generations,
		size_t n, struct gcs_cond cond, struct gcs_object *meta);
/* Listing under a prefix, page by page (pageToken), without holding
 * more than a page: fn gets each object (o) or, with a delimiter, each
 * sub-prefix (p); a non-zero return stops the walk and is returned. A
 * server whose pages never end is an error after max_list_pages. */
typedef int (*gcs_list_fn)(void *arg, const struct gcs_object *o,
			   const char *p);
int gcs_list_each(struct gcs_client *c, const char *bucket, const char *prefix,
		  const char *delimiter, gcs_list_fn fn, void *arg);
/* The same, collected into arrays (gcs_list_free). */
int gcs_list(struct gcs_client *c, const char *bucket, const char *prefix,
	     const char *delimiter, struct gcs_list *out);
void gcs_list_free(struct gcs_list *l);
void gcs_object_clear(struct gcs_object *o);

/* Resumable upload: a streaming sink for one object. */
struct gcs_upload_opts {
	struct gcs_cond cond;
	uint64_t size;   /* total if known, else GCS_SIZE_UNKNOWN */
	uint32_t crc32c; /* of the whole object, if has_crc32c */
	int has_crc32c;  /* known up front: sent in the initiation */
};
#define GCS_SIZE_UNKNOWN UINT64_MAX
typedef void (*gcs_release_fn)(void *arg);

/* Start a new session (asynchronous; errors surface in later calls). */
int gcs_upload_start(struct gcs_client *c, const char *bucket, const char *name,
		     const struct gcs_upload_opts *opts,
		     struct gcs_upload **out);
/* Reattach to a session saved by an earlier process: queries the server
 * (blocking) and sets *persisted; append from that offset on. */
int gcs_upload_resume(struct gcs_client *c, const char *bucket,
		      const char *name, const char *session_uri,
		      const struct gcs_upload_opts *opts, uint64_t *persisted,
		      struct gcs_upload **out);
/* The same without waiting: the status query is sent and driven by
 * gcs_poll(); gcs_upload_reattached() returns 0 until it was answered,
 * then 1 with *persisted set (append from there on), or the error. */
int gcs_upload_reattach(struct gcs_client *c, const char *bucket,
			const char *name, const char *session_uri,
			const struct gcs_upload_opts *opts,
			struct gcs_upload **out);
int gcs_upload_reattached(struct gcs_upload *u, uint64_t *persisted);
/* Session URI once known (NULL before); bytes the server confirmed. */
const char *gcs_upload_session(const struct gcs_upload *u);
uint64_t gcs_upload_persisted(const struct gcs_upload *u);
/* Bytes appended but not yet confirmed by the server. */
uint64_t gcs_upload_pending(const struct gcs_upload *u);
/* Queue the next len bytes; p stays valid until release(arg) is called
 * (after the server confirmed them, or at gcs_upload_free). No copy. */
int gcs_upload_append(struct gcs_upload *u, const void *p, size_t len,
		      gcs_release_fn release, void *arg);
/* No more data; crc (may be NULL) is the whole object's crc32c when the
 * upload did not see every byte (resumed) and it was not known up front. */
int gcs_upload_finish(struct gcs_upload *u, const uint32_t *crc);
/* The operation driving the upload, for gcs_op_done/gcs_op_wait. */
struct gcs_op *gcs_upload_op(struct gcs_upload *u);
/* After success: the object resource. */
const struct gcs_object *gcs_upload_object(const struct gcs_upload *u);
void gcs_upload_free(struct gcs_upload *u);

/* CRC32C (Castagnoli) through ISA-L; crc is the running value (0 to
 * start). combine: crc of A||B from crc(A), crc(B) and len(B). */
uint32_t gcs_crc32c(uint32_t crc, const void *p, size_t n);
uint32_t gcs_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* 4 big-endian bytes in base64 (9 chars incl. NUL) and back. */
void gcs_crc32c_b64(uint32_t crc, char out[9]);
int gcs_crc32c_from_b64(const char *s, size_t n, uint32_t *crc);

#endif
