/* gcs_upload.c - resumable uploads: a streaming sink for one object.
 *
 *   append(p, len, release) -> segment queue [persisted ... appended)
 *   kick(): no request on the wire? then send the next piece:
 *     - status query  PUT session, Content-Range: bytes * / *   (after a
 *       failure, or when reattaching to a saved session)
 *     - chunk         PUT bytes P-Q/ *   (chunk_bytes, a 256 KiB multiple)
 *     - last chunk    PUT bytes P-Q/TOTAL (or bytes * /TOTAL, no body),
 *                     X-Goog-Hash: crc32c=... of the whole object
 *   308 + Range: bytes=0-N -> persisted = N+1, release segments below it;
 *   200/201 -> object resource: check size and crc32c, done.
 *
 * The chunk body is read straight from the caller's buffers by curl's read
 * callback; a buffer is released only once the server has confirmed every
 * byte of it, so after a failure the bytes from `persisted` on are still
 * there to resend. One session has at most one request in flight (the
 * protocol is sequential); parallelism comes from many uploads at once.
 * The initiation is retried only with a precondition (conditionally
 * idempotent); chunks always, since the status query says where to go on.
 */
#include "gcs_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { UP_INIT, UP_DATA };

size_t upload_read_cb(char *dst, size_t size, size_t n, void *arg)
{
	struct gcs_req *r = arg;
	struct gcs_upload *u = r->src;
	size_t want = size * n, out = 0;
	struct gcs_seg *s;

	/* segments are only freed between attempts: the cursor stays valid */
	for (s = r->cur ? r->cur : u->head;
	     s && out < want && r->src_off < r->src_end; s = s->next) {
		r->cur = s;
		uint64_t in, take;

		if (s->off + s->len <= r->src_off)
			continue;
		in = r->src_off - s->off;
		take = s->len - in;
		if (take > want - out)
			take = want - out;
		if (take > r->src_end - r->src_off)
			take = r->src_end - r->src_off;
		memcpy(dst + out, s->p + in, take);
		out += take;
		r->src_off += take;
	}
	return out;
}

static void release_below(struct gcs_upload *u, uint64_t off, int all)
{
	while (u->head && (all || u->head->off + u->head->len <= off)) {
		struct gcs_seg *s = u->head;

		u->head = s->next;
		if (!u->head)
			u->tail = NULL;
		if (s->release)
			s->release(s->arg);
		free(s);
	}
}

static int have_final_crc(struct gcs_upload *u, uint32_t *crc)
{
	if (u->opts.has_crc32c) {
		*crc = u->opts.crc32c;
		return 1;
	}
	if (u->crc_given) {
		*crc = u->final_crc;
		return 1;
	}
	if (u->crc_from == 0) {
		*crc = u->crc;
		return 1;
	}
	return 0;
}

static int build_query(struct gcs_upload *u)
{
	struct gcs_req *r = &u->op.req;
	int rc = req_set(r, "PUT", gcs_strdup(u->session));

	if (!rc)
		rc = req_header(r, "Content-Range: bytes */*");
	r->has_body = 1; /* empty PUT body */
	u->querying = 1;
	return rc;
}

/* Send the next piece if nothing is on the wire and there is one. */
static void kick(struct gcs_upload *u)
{
	struct gcs_op *op = &u->op;
	struct gcs_req *r = &op->req;
	uint64_t avail = u->appended - u->persisted, len;
	size_t chunk = op->c->cfg.chunk_bytes;
	int final, rc;
	char hdr[128];

	if (op->done || op->waiting || op->in_flight || u->phase != UP_DATA)
		return;
	if (u->querying) {
		rc = build_query(u);
	} else {
		if (u->finishing && avail <= chunk) {
			final = 1;
			len = avail;
		} else if (avail >= chunk) {
			final = 0;
			len = chunk;
		} else {
			return; /* wait for more data */
		}
		rc = req_set(r, "PUT", gcs_strdup(u->session));
		if (final && len == 0)
			snprintf(hdr, sizeof(hdr),
				 "Content-Range: bytes */%llu",
				 (unsigned long long)u->appended);
		else if (final)
			snprintf(hdr, sizeof(hdr),
				 "Content-Range: bytes %llu-%llu/%llu",
				 (unsigned long long)u->persisted,
				 (unsigned long long)(u->persisted + len - 1),
				 (unsigned long long)u->appended);
		else
			snprintf(hdr, sizeof(hdr),
				 "Content-Range: bytes %llu-%llu/*",
				 (unsigned long long)u->persisted,
				 (unsigned long long)(u->persisted + len - 1));
		if (!rc)
			rc = req_header(r, hdr);
		if (!rc && final) {
			uint32_t crc;
			char b64[9];

			if (have_final_crc(u, &crc)) {
				gcs_crc32c_b64(crc, b64);
				snprintf(hdr, sizeof(hdr),
					 "X-Goog-Hash: crc32c=%s", b64);
				rc = req_header(r, hdr);
			}
		}
		r->has_body = 1;
		if (len) {
			r->src = u;
			r->src_start = u->persisted;
			r->src_off = u->persisted;
			r->src_end = u->persisted + len;
		}
	}
	if (rc) {
		op_fail(op, -ENOMEM, "upload %s: out of memory", op->what);
		return;
	}
	if (op->attempt == 0) /* a fresh request, not a retry */
		op->deadline = gcs_now() + op->c->cfg.deadline_s;
	op_issue(op, u->delay);
	u->delay = 0;
}

static void init_step(struct gcs_upload *u)
{
	struct gcs_op *op = &u->op;
	struct gcs_req *r = &op->req;
	struct gcs_client *c = op->c;
	size_t ol = strlen(c->origin);

	if (r->cc != CURLE_OK || r->status < 200 || r->status > 299) {
		op_retry_or_fail(op, "start upload");
		return;
	}
	if (!r->location || !*r->location) {
		op_fail(op, GCS_E_PROTOCOL,
			"start upload %s: HTTP %ld without a session URI "
			"(Location)",
			op->what, r->status);
		return;
	}
	/* the token goes wherever the session URI points: only to us */
	if (strncmp(r->location, c->origin, ol) != 0 ||
	    (r->location[ol] != '/' && r->location[ol] != 0)) {
		op_fail(op, GCS_E_PROTOCOL,
			"start upload %s: session URI points to another host "
			"than %s",
			op->what, c->origin);
		return;
	}
	u->session = r->location;
	r->location = NULL;
	u->phase = UP_DATA;
	op->attempt = 0;
	/* pieces are retried whatever the precondition: the status query
	 * says what the server has, nothing is sent twice blindly */
	op->idempotent = 1;
	kick(u);
}

static void done_step(struct gcs_upload *u)
{
	struct gcs_op *op = &u->op;
	json_t *j = op_json_reply(op, "upload");
	uint32_t crc;

	if (!j)
		return;
	if (op_parse_object(op, j, &op->obj) == 0) {
		op->has_obj = 1;
		if (!u->finishing && !u->querying) {
			op_fail(op, GCS_E_PROTOCOL,
				"upload %s: the server finished the object "
				"before the last chunk",
				op->what);
		} else if (u->finishing && op->obj.size != u->appended) {
			op_fail(op, GCS_E_PROTOCOL,
				"upload %s: server stored %llu bytes, sent %llu",
				op->what, (unsigned long long)op->obj.size,
				(unsigned long long)u->appended);
		} else if (have_final_crc(u, &crc) &&
			   (!op->obj.has_crc32c || op->obj.crc32c != crc)) {
			op_fail(op, GCS_E_CHECKSUM,
				"upload %s: server stored crc32c %08x, sent "
				"%08x",
				op->what, op->obj.crc32c, crc);
		} else {
			u->persisted = op->obj.size;
			release_below(u, 0, 1);
			op_finish(op, 0);
		}
	}
	json_decref(j);
}

/* A piece was answered 308 but the server kept none of it: count it as a
 * failed attempt (backoff, deadline, max_attempts), so a server that
 * never takes bytes ends the upload instead of looping. 1 = failed. */
static int no_progress(struct gcs_upload *u)
{
	struct gcs_op *op = &u->op;
	struct gcs_client *c = op->c;
	double delay;

	op->attempt++;
	delay = op_backoff(op);
	if ((c->cfg.max_attempts && op->attempt >= c->cfg.max_attempts) ||
	    gcs_now() + delay >= op->deadline) {
		op_fail(op, GCS_E_PROTOCOL,
			"upload %s: the server answers 308 but keeps none of "
			"the bytes (%llu persisted, %u attempts)",
			op->what, (unsigned long long)u->persisted,
			op->attempt);
		return 1;
	}
	c->stats.retries++;
	u->delay = delay;
	return 0;
}

static void data_step(struct gcs_upload *u)
{
	struct gcs_op *op = &u->op;
	struct gcs_req *r = &op->req;
	const char *doing = u->querying ? "upload status query" : "upload";
	int progress, was_query;

	if (r->cc == CURLE_OK && r->status == 308) {
		uint64_t n = r->has_range ? r->range_end : 0;

		if (u->reattach) {
			/* a saved session: the server's word is all we have */
			u->reattach = 0;
			u->appended = u->persisted = n;
		}
		if (n > u->appended ||
		    (n < u->persisted && (!u->head || u->head->off > n))) {
			op_fail(op, GCS_E_PROTOCOL,
				"%s %s: server claims %llu bytes persisted; "
				"%llu sent, %llu confirmed before",
				doing, op->what, (unsigned long long)n,
				(unsigned long long)u->appended,
				(unsigned long long)u->persisted);
			return;
		}
		progress = n > u->persisted;
		was_query = u->querying;
		u->persisted = n;
		u->querying = 0;
		release_below(u, n, 0);
		if (progress)
			op->attempt = 0;
		else if (!was_query && no_progress(u))
			return;
		kick(u);
		return;
	}
	if (r->cc == CURLE_OK && (r->status == 200 || r->status == 201)) {
		done_step(u);
		return;
	}
	if (r->cc == CURLE_OK && (r->status == 404 || r->status == 410)) {
		op_http_error(op, doing);
		op->rc = GCS_E_SESSION;
		return;
	}
	/* what happened to the bytes is unknown: ask, after backoff */
	if (op_retry_or_fail(op, doing) == 1 && build_query(u))
		op_fail(op, -ENOMEM, "upload %s: out of memory", op->what);
}

static void upload_step(struct gcs_op *op)
{
	struct gcs_upload *u = (struct gcs_upload *)op;

	if (u->phase == UP_INIT)
		init_step(u);
	else
		data_step(u);
}

static struct gcs_upload *upload_new(struct gcs_client *c, const char *bucket,
				     const char *name,
				     const struct gcs_upload_opts *opts)
{
	struct gcs_upload *u = calloc(1, sizeof(*u));

	if (!u)
		return NULL;
	op_init(c, &u->op, OP_UPLOAD, bucket, name);
	u->op.step = upload_step;
	if (opts) {
		u->opts = *opts;
	} else {
		u->opts.cond = GCS_NO_COND;
		u->opts.size = GCS_SIZE_UNKNOWN;
	}
	return u;
}

int gcs_upload_start(struct gcs_client *c, const char *bucket, const char *name,
		     const struct gcs_upload_opts *opts,
		     struct gcs_upload **out)
{
	struct gcs_upload *u = upload_new(c, bucket, name, opts);
	char *bk = gcs_escape(bucket), *nm = gcs_escape(name), *js = NULL;
	char hdr[96], b64[9];
	json_t *md;
	int rc;

	*out = NULL;
	md = json_pack("{s:s}", "name", name);
	if (md && u && u->opts.has_crc32c) {
		gcs_crc32c_b64(u->opts.crc32c, b64);
		json_object_set_new(md, "crc32c", json_string(b64));
	}
	js = md ? json_dumps(md, JSON_COMPACT) : NULL;
	json_decref(md);
	if (!u || !bk || !nm || !js) {
		free(bk);
		free(nm);
		free(js);
		if (u)
			gcs_upload_free(u);
		return -ENOMEM;
	}
	u->op.body = js;
	rc = req_set(&u->op.req, "POST",
		     gcs_printf("%s/b/%s/o?uploadType=resumable&name=%s",
				c->upload, bk, nm));
	free(bk);
	free(nm);
	if (!rc)
		rc = req_cond(&u->op.req, u->opts.cond);
	if (!rc)
		rc = req_header(
			&u->op.req,
			"Content-Type: application/json; charset=UTF-8");
	if (!rc)
		rc = req_header(
			&u->op.req,
			"X-Upload-Content-Type: application/octet-stream");
	if (!rc && u->opts.size != GCS_SIZE_UNKNOWN) {
		snprintf(hdr, sizeof(hdr), "X-Upload-Content-Length: %llu",
			 (unsigned long long)u->opts.size);
		rc = req_header(&u->op.req, hdr);
	}
	if (rc) {
		gcs_upload_free(u);
		return rc;
	}
	req_body(&u->op.req, js, strlen(js), NULL, 0, NULL, 0);
	u->op.idempotent = u->opts.cond.if_generation_match >= 0;
	u->phase = UP_INIT;
	op_issue(&u->op, 0);
	*out = u;
	return 0;
}

int gcs_upload_reattach(struct gcs_client *c, const char *bucket,
			const char *name, const char *session_uri,
			const struct gcs_upload_opts *opts,
			struct gcs_upload **out)
{
	struct gcs_upload *u = upload_new(c, bucket, name, opts);

	*out = NULL;
	if (!u)
		return -ENOMEM;
	u->session = strdup(session_uri);
	u->phase = UP_DATA;
	u->op.idempotent = 1;
	u->querying = 1;
	u->crc_from = UINT64_MAX; /* the crc of earlier bytes is unknown */
	u->reattach = 1;
	if (!u->session) {
		gcs_upload_free(u);
		return -ENOMEM;
	}
	kick(u);
	*out = u;
	return 0;
}

int gcs_upload_reattached(struct gcs_upload *u, uint64_t *persisted)
{
	if (u->op.done && u->op.rc)
		return u->op.rc;
	if (!u->op.done && u->reattach)
		return 0;
	if (u->crc_from == UINT64_MAX) {
		/* the server's word; data and crc continue from here */
		u->appended = u->persisted;
		u->crc_from = u->persisted;
		if (u->op.done)
			u->finishing = 1; /* it was already complete */
	}
	*persisted = u->persisted;
	return 1;
}

int gcs_upload_resume(struct gcs_client *c, const char *bucket,
		      const char *name, const char *session_uri,
		      const struct gcs_upload_opts *opts, uint64_t *persisted,
		      struct gcs_upload **out)
{
	struct gcs_upload *u;
	int rc = gcs_upload_reattach(c, bucket, name, session_uri, opts, &u);

	*out = NULL;
	if (rc < 0)
		return rc;
	while ((rc = gcs_upload_reattached(u, persisted)) == 0)
		gcs_poll(c, 1000);
	if (rc < 0) {
		gcs_upload_free(u);
		return rc;
	}
	*out = u;
	return 0;
}

const char *gcs_upload_session(const struct gcs_upload *u)
{
	return u->session;
}

uint64_t gcs_upload_persisted(const struct gcs_upload *u)
{
	return u->persisted;
}

uint64_t gcs_upload_pending(const struct gcs_upload *u)
{
	return u->appended - u->persisted;
}

int gcs_upload_append(struct gcs_upload *u, const void *p, size_t len,
		      gcs_release_fn release, void *arg)
{
	struct gcs_seg *s;

	if (u->op.done)
		return u->op.rc ? u->op.rc : -EINVAL;
	if (u->finishing)
		return -EINVAL;
	if (!len) {
		if (release)
			release(arg);
		return 0;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->p = p;
	s->len = len;
	s->off = u->appended;
	s->release = release;
	s->arg = arg;
	if (u->tail)
		u->tail->next = s;
	else
		u->head = s;
	u->tail = s;
	u->appended += len;
	u->crc = gcs_crc32c(u->crc, p, len);
	kick(u);
	return 0;
}

int gcs_upload_finish(struct gcs_upload *u, const uint32_t *crc)
{
	if (u->op.done)
		return u->op.rc;
	if (u->finishing)
		return -EINVAL;
	if (u->opts.size != GCS_SIZE_UNKNOWN && u->opts.size != u->appended)
		return op_fail(&u->op, -EINVAL,
			       "upload %s: %llu bytes appended, %llu announced",
			       u->op.what, (unsigned long long)u->appended,
			       (unsigned long long)u->opts.size);
	if (crc) {
		u->crc_given = 1;
		u->final_crc = *crc;
	}
	u->finishing = 1;
	kick(u);
	return 0;
}

struct gcs_op *gcs_upload_op(struct gcs_upload *u)
{
	return &u->op;
}

const struct gcs_object *gcs_upload_object(const struct gcs_upload *u)
{
	return u->op.has_obj ? &u->op.obj : NULL;
}

void gcs_upload_free(struct gcs_upload *u)
{
	if (!u)
		return;
	op_release(&u->op);
	release_below(u, 0, 1);
	free(u->session);
	free(u);
}
