/* gcs_ops.c - the one-shot object calls: read, get, stat, put (multipart),
 * delete, compose, list.
 *
 * Each builds its request, and its step() turns the finished attempt into
 * a result, a retry, or the next request (a broken download resumes with
 * Range from the last byte received, pinned to the generation first seen;
 * a list fetches page after page). Idempotency decides retries: reads,
 * stat and list always; put, compose and delete only with a precondition
 * (or, for delete, a generation).
 */
#include "gcs_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRESS_RESET (1u << 20)

static struct gcs_op *op_new(struct gcs_client *c, enum gcs_op_kind kind,
			     const char *bucket, const char *name)
{
	struct gcs_op *op = calloc(1, sizeof(*op));

	if (op)
		op_init(c, op, kind, bucket, name);
	return op;
}

static char *object_url(struct gcs_client *c, const char *bucket,
			const char *name, const char *suffix)
{
	char *b = gcs_escape(bucket), *n = gcs_escape(name), *u = NULL;

	if (b && n)
		u = gcs_printf("%s/b/%s/o/%s%s", c->api, b, n, suffix);
	free(b);
	free(n);
	return u;
}

static int wait_free(struct gcs_op *op)
{
	int rc = gcs_op_wait(op);

	gcs_op_free(op);
	return rc;
}

static int start_or_free(struct gcs_op *op, int rc, struct gcs_op **out)
{
	if (rc) {
		op_release(op);
		free(op);
		return rc;
	}
	op_issue(op, 0);
	*out = op;
	return 0;
}

/* ---- media reads ---- */

static int build_media(struct gcs_op *op, uint64_t done)
{
	struct gcs_req *r = &op->req;
	char hdr[96];
	int rc;

	rc = req_set(r, "GET",
		     object_url(op->c, op->bucket, op->name, "?alt=media"));
	if (!rc && op->pin_generation >= 0)
		rc = req_cond(r, (struct gcs_cond){ op->pin_generation, -1 });
	if (!rc)
		rc = req_header(r, "Cache-Control: no-transform");
	r->media = 1;
	r->expect_start = (int64_t)(op->off + done);
	if (op->kind == OP_READ) {
		snprintf(hdr, sizeof(hdr), "Range: bytes=%llu-%llu",
			 (unsigned long long)(op->off + done),
			 (unsigned long long)(op->off + op->len - 1));
		r->sink = op->buf + done;
		r->sink_cap = op->len - done;
		r->sink_len = 0;
	} else {
		snprintf(hdr, sizeof(hdr), "Range: bytes=%llu-",
			 (unsigned long long)done);
		r->sink_grow = 1;
	}
	if (!rc && (op->kind == OP_READ || done > 0))
		rc = req_header(r, hdr);
	return rc;
}

static void media_step(struct gcs_op *op)
{
	struct gcs_req *r = &op->req;
	const char *doing = op->kind == OP_READ ? "read" : "download";
	uint64_t done, moved;

	if (r->has_hash && !op->have_hash) {
		op->have_hash = 1;
		op->hash_crc = r->hash_crc;
	}
	if (r->x_generation >= 0 && op->pin_generation < 0)
		op->pin_generation = r->x_generation;
	moved = r->sink_len - op->mark;
	if (op->kind == OP_READ) {
		op->off += r->sink_len;
		op->buf += r->sink_len;
		op->len -= r->sink_len;
		*op->got += r->sink_len;
		done = 0;
	} else {
		done = r->sink_len;
		op->mark = done;
	}
	if (r->too_big) {
		op_fail(op, -EFBIG, "download %s: larger than %llu bytes",
			op->what, (unsigned long long)r->sink_max);
		return;
	}
	if (r->proto_err) {
		op_fail(op, GCS_E_PROTOCOL,
			"%s %s: HTTP %ld: the reply is not the byte range asked "
			"for (Content-Range or length)",
			doing, op->what, r->status);
		return;
	}
	if (r->hash_bad) {
		op_fail(op, GCS_E_PROTOCOL, "%s %s: malformed x-goog-hash",
			doing, op->what);
		return;
	}
	if (r->cc == CURLE_OK && (r->status == 200 || r->status == 206)) {
		if (op->kind == OP_READ) {
			op_finish(op, 0);
			return;
		}
		if (!op->have_hash) {
			op_fail(op, GCS_E_PROTOCOL,
				"download %s: HTTP %ld without a crc32c in "
				"x-goog-hash",
				op->what, r->status);
			return;
		}
		if (op->hash_crc != r->sink_crc) {
			op_fail(op, GCS_E_CHECKSUM,
				"download %s: crc32c of the %zu bytes received "
				"is %08x, x-goog-hash says %08x",
				op->what, r->sink_len, r->sink_crc,
				op->hash_crc);
			return;
		}
		op_finish(op, 0);
		return;
	}
	if (r->cc == CURLE_OK && r->status == 416 && op->kind == OP_READ &&
	    *op->got > 0) {
		op_finish(op, 0); /* resumed exactly at the end */
		return;
	}
	/* real progress (not a trickle) starts a new run of failures */
	if (r->cc != CURLE_OK && moved >= PROGRESS_RESET)
		op->attempt = 0;
	if (op_retry_or_fail(op, doing) == 1 && build_media(op, done))
		op_fail(op, -ENOMEM, "%s %s: out of memory", doing, op->what);
}

int gcs_start_read(struct gcs_client *c, const char *bucket, const char *name,
		   uint64_t off, size_t len, void *buf, size_t *got,
		   struct gcs_op **out)
{
	struct gcs_op *op = op_new(c, OP_READ, bucket, name);

	*out = NULL;
	if (!op)
		return -ENOMEM;
	if (!len)
		return start_or_free(op, -EINVAL, out);
	op->off = off;
	op->len = len;
	op->buf = buf;
	op->got = got;
	*got = 0;
	op->idempotent = 1;
	op->step = media_step;
	return start_or_free(op, build_media(op, 0), out);
}

int gcs_read(struct gcs_client *c, const char *bucket, const char *name,
	     uint64_t off, size_t len, void *buf, size_t *got)
{
	struct gcs_op *op;
	int rc = gcs_start_read(c, bucket, name, off, len, buf, got, &op);

	return rc ? rc : wait_free(op);
}

int gcs_get(struct gcs_client *c, const char *bucket, const char *name,
	    uint64_t max_len, void **data, size_t *len, struct gcs_object *meta)
{
	struct gcs_op *op = op_new(c, OP_GET, bucket, name);
	int rc;

	*data = NULL;
	*len = 0;
	if (!op)
		return -ENOMEM;
	op->idempotent = 1;
	op->step = media_step;
	op->req.sink_max = max_len;
	rc = start_or_free(op, build_media(op, 0), &op);
	if (rc)
		return rc;
	rc = gcs_op_wait(op);
	if (rc == 0) {
		*data = op->req.sink ? op->req.sink : malloc(1);
		*len = op->req.sink_len;
		op->req.sink = NULL;
		if (!*data)
			rc = -ENOMEM;
		if (meta) {
			memset(meta, 0, sizeof(*meta));
			meta->name = strdup(name);
			meta->generation = op->pin_generation;
			meta->metageneration = -1;
			meta->size = *len;
			meta->crc32c = op->hash_crc;
			meta->has_crc32c = 1;
		}
	}
	gcs_op_free(op);
	return rc;
}

/* ---- JSON calls ---- */

/* 2xx with an object resource: parse it into op->obj. */
static void object_step(struct gcs_op *op)
{
	struct gcs_req *r = &op->req;
	const char *doing = op->kind == OP_STAT    ? "stat" :
			    op->kind == OP_PUT     ? "upload" :
			    op->kind == OP_COMPOSE ? "compose" :
						     "request";
	json_t *j;

	if (r->cc != CURLE_OK || r->status < 200 || r->status > 299) {
		op_retry_or_fail(op, doing);
		return;
	}
	j = op_json_reply(op, doing);
	if (!j)
		return;
	if (op_parse_object(op, j, &op->obj) == 0) {
		op->has_obj = 1;
		if (op->kind == OP_PUT && op->have_hash &&
		    (!op->obj.has_crc32c || op->obj.crc32c != op->hash_crc))
			op_fail(op, GCS_E_CHECKSUM,
				"upload %s: server stored crc32c %08x, sent "
				"%08x",
				op->what, op->obj.crc32c, op->hash_crc);
		else
			op_finish(op, 0);
	}
	json_decref(j);
}

static int finish_object(struct gcs_op *op, struct gcs_object *meta)
{
	int rc = gcs_op_wait(op);

	if (rc == 0 && meta) {
		*meta = op->obj;
		memset(&op->obj, 0, sizeof(op->obj));
	}
	gcs_op_free(op);
	return rc;
}

int gcs_stat(struct gcs_client *c, const char *bucket, const char *name,
	     struct gcs_object *meta)
{
	struct gcs_op *op = op_new(c, OP_STAT, bucket, name);
	int rc;

	if (!op)
		return -ENOMEM;
	op->idempotent = 1;
	op->step = object_step;
	rc = start_or_free(
		op, req_set(&op->req, "GET", object_url(c, bucket, name, "")),
		&op);
	return rc ? rc : finish_object(op, meta);
}

/* A create-only insert was sent again (retried by us, or resent by curl
 * on a fresh connection) and then hit 412: the reply to an earlier send
 * may have been lost after the object was stored. If the object has our
 * size and crc32c, the create was ours (or an identical one): success.
 * Otherwise the 412 stands. */
static int create_was_ours(struct gcs_op *op, size_t len)
{
	struct gcs_object o = { 0 };
	char keep[sizeof(op->msg)];

	memcpy(keep, op->msg, sizeof(keep));
	if (gcs_stat(op->c, op->bucket, op->name, &o) == 0 && o.size == len &&
	    o.has_crc32c && o.crc32c == op->hash_crc) {
		gcs_object_clear(&op->obj);
		op->obj = o;
		op->has_obj = 1;
		return 0;
	}
	gcs_object_clear(&o);
	snprintf(op->c->msg, sizeof(op->c->msg), "%s", keep);
	return GCS_E_PRECONDITION;
}

int gcs_put(struct gcs_client *c, const char *bucket, const char *name,
	    const void *data, size_t len, struct gcs_cond cond,
	    struct gcs_object *meta)
{
	struct gcs_op *op;
	char boundary[40], crc[9], hdr[96], *b = NULL, *u = NULL, *js = NULL;
	json_t *md;
	int rc;

	if (len > c->cfg.multipart_max)
		return -EFBIG;
	op = op_new(c, OP_PUT, bucket, name);
	if (!op)
		return -ENOMEM;
	op->hash_crc = gcs_crc32c(0, data, len);
	op->have_hash = 1;
	gcs_crc32c_b64(op->hash_crc, crc);
	md = json_pack("{s:s, s:s}", "name", name, "crc32c", crc);
	js = md ? json_dumps(md, JSON_COMPACT) : NULL;
	json_decref(md);
	/* a boundary that does not occur in the data */
	do {
		snprintf(boundary, sizeof(boundary), "ckpt_%016llx",
			 (unsigned long long)(gcs_now() * 1e9) ^
				 (unsigned long long)c->rng++ * 2654435761u);
	} while (len && memmem(data, len, boundary, strlen(boundary)));
	b = js ? gcs_printf("--%s\r\nContent-Type: application/json; "
			    "charset=UTF-8\r\n\r\n%s\r\n--%s\r\nContent-Type: "
			    "application/octet-stream\r\n\r\n",
			    boundary, js, boundary) :
		 NULL;
	free(js);
	/* head and tail are ours; the data is sent from the caller's buffer */
	op->body = b;
	op->body2 = gcs_printf("\r\n--%s--\r\n", boundary);
	if (!op->body || !op->body2)
		return start_or_free(op, -ENOMEM, &op);
	{
		char *bk = gcs_escape(bucket), *nm = gcs_escape(name);

		if (bk && nm)
			u = gcs_printf("%s/b/%s/o?uploadType=multipart&name=%s",
				       c->upload, bk, nm);
		free(bk);
		free(nm);
	}
	rc = req_set(&op->req, "POST", u);
	if (!rc)
		rc = req_cond(&op->req, cond);
	snprintf(hdr, sizeof(hdr),
		 "Content-Type: multipart/related; boundary=%s", boundary);
	if (!rc)
		rc = req_header(&op->req, hdr);
	req_body(&op->req, op->body, strlen(op->body), data, len, op->body2,
		 strlen(op->body2));
	op->idempotent = cond.if_generation_match >= 0;
	op->step = object_step;
	rc = start_or_free(op, rc, &op);
	if (rc)
		return rc;
	rc = gcs_op_wait(op);
	if (rc == GCS_E_PRECONDITION && cond.if_generation_match == 0 &&
	    (op->attempt > 0 || op->req.resent))
		rc = create_was_ours(op, len);
	if (rc == 0 && meta) {
		*meta = op->obj;
		memset(&op->obj, 0, sizeof(op->obj));
	}
	gcs_op_free(op);
	return rc;
}

static void empty_step(struct gcs_op *op)
{
	struct gcs_req *r = &op->req;

	if (r->cc == CURLE_OK && r->status >= 200 && r->status <= 299)
		op_finish(op, 0);
	else
		op_retry_or_fail(op, "delete");
}

int gcs_delete(struct gcs_client *c, const char *bucket, const char *name,
	       int64_t generation, struct gcs_cond cond)
{
	struct gcs_op *op = op_new(c, OP_DELETE, bucket, name);
	char q[48] = "";
	int rc;

	if (!op)
		return -ENOMEM;
	if (generation > 0)
		snprintf(q, sizeof(q), "?generation=%lld",
			 (long long)generation);
	rc = req_set(&op->req, "DELETE", object_url(c, bucket, name, q));
	if (!rc)
		rc = req_cond(&op->req, cond);
	op->idempotent = generation > 0 || cond.if_generation_match >= 0;
	op->step = empty_step;
	rc = start_or_free(op, rc, &op);
	return rc ? rc : wait_free(op);
}

int gcs_compose(struct gcs_client *c, const char *bucket, const char *dest,
		const char *const *srcs, const int64_t *src_generations,
		size_t n, struct gcs_cond cond, struct gcs_object *meta)
{
	struct gcs_op *op;
	json_t *req, *arr;
	size_t i;
	int rc;

	if (n == 0 || n > 32)
		return -EINVAL;
	op = op_new(c, OP_COMPOSE, bucket, dest);
	if (!op)
		return -ENOMEM;
	arr = json_array();
	for (i = 0; arr && i < n; i++) {
		json_t *s = json_pack("{s:s}", "name", srcs[i]);

		if (s && src_generations && src_generations[i] > 0)
			json_object_set_new(
				s, "generation",
				json_sprintf("%lld",
					     (long long)src_generations[i]));
		json_array_append_new(arr, s);
	}
	req = json_pack("{s:s, s:o, s:{s:s}}", "kind", "storage#composeRequest",
			"sourceObjects", arr, "destination", "name", dest);
	op->body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!op->body)
		return start_or_free(op, -ENOMEM, &op);
	rc = req_set(&op->req, "POST", object_url(c, bucket, dest, "/compose"));
	if (!rc)
		rc = req_cond(&op->req, cond);
	if (!rc)
		rc = req_header(
			&op->req,
			"Content-Type: application/json; charset=UTF-8");
	req_body(&op->req, op->body, strlen(op->body), NULL, 0, NULL, 0);
	op->idempotent = cond.if_generation_match >= 0;
	op->step = object_step;
	rc = start_or_free(op, rc, &op);
	return rc ? rc : finish_object(op, meta);
}

/* ---- list ---- */

static int build_list(struct gcs_op *op)
{
	struct gcs_client *c = op->c;
	char *b = gcs_escape(op->bucket), *p = gcs_escape(op->prefix);
	char *d = op->delimiter ? gcs_escape(op->delimiter) : NULL;
	char *t = op->page_token ? gcs_escape(op->page_token) : NULL;
	char *u = NULL;

	if (b && p && (d || !op->delimiter) && (t || !op->page_token))
		u = gcs_printf("%s/b/%s/o?maxResults=%u&prefix=%s%s%s%s%s",
			       c->api, b, c->cfg.list_page_size, p,
			       d ? "&delimiter=" : "", d ? d : "",
			       t ? "&pageToken=" : "", t ? t : "");
	free(b);
	free(p);
	free(d);
	free(t);
	return req_set(&op->req, "GET", u);
}

/* Hands one page to the caller's function; a non-zero return stops. */
static int list_page(struct gcs_op *op, json_t *j)
{
	json_t *items = json_object_get(j, "items");
	json_t *pfx = json_object_get(j, "prefixes");
	struct gcs_object o;
	json_t *v;
	size_t i;
	int rc = 0;

	if ((items && !json_is_array(items)) || (pfx && !json_is_array(pfx)))
		return op_fail(op, GCS_E_PROTOCOL,
			       "list %s: items/prefixes are not arrays",
			       op->what);
	json_array_foreach (items, i, v) {
		if (op_parse_object(op, v, &o))
			return op->rc;
		rc = op->list_fn(op->list_arg, &o, NULL);
		gcs_object_clear(&o);
		if (rc)
			break;
	}
	json_array_foreach (pfx, i, v) {
		if (rc)
			break;
		if (!json_is_string(v))
			return op_fail(op, GCS_E_PROTOCOL,
				       "list %s: a prefix is not a string",
				       op->what);
		rc = op->list_fn(op->list_arg, NULL, json_string_value(v));
	}
	if (rc) {
		/* the caller's own code; its message is its own */
		op->msg[0] = 0;
		op_finish(op, rc);
	}
	return rc;
}

static void list_step(struct gcs_op *op)
{
	struct gcs_req *r = &op->req;
	json_t *j, *tok;

	if (r->cc != CURLE_OK || r->status < 200 || r->status > 299) {
		if (op_retry_or_fail(op, "list") == 1 && build_list(op))
			op_fail(op, -ENOMEM, "list: out of memory");
		return;
	}
	j = op_json_reply(op, "list");
	if (!j)
		return;
	if (list_page(op, j)) {
		json_decref(j);
		return;
	}
	tok = json_object_get(j, "nextPageToken");
	op->pages++;
	if (!json_is_string(tok) || !json_string_length(tok)) {
		json_decref(j);
		op_finish(op, 0);
		return;
	}
	if (op->page_token &&
	    strcmp(op->page_token, json_string_value(tok)) == 0)
		op_fail(op, GCS_E_PROTOCOL,
			"list %s: the server sent the same nextPageToken twice",
			op->what);
	else if (op->pages >= op->c->cfg.max_list_pages)
		op_fail(op, GCS_E_PROTOCOL,
			"list %s: still not finished after %u pages", op->what,
			op->pages);
	if (op->done) {
		json_decref(j);
		return;
	}
	free(op->page_token);
	op->page_token = strdup(json_string_value(tok));
	json_decref(j);
	/* a new request: fresh attempts and deadline */
	op->attempt = 0;
	op->deadline = gcs_now() + op->c->cfg.deadline_s;
	if (!op->page_token || build_list(op))
		op_fail(op, -ENOMEM, "list: out of memory");
	else
		op_issue(op, 0);
}

int gcs_list_each(struct gcs_client *c, const char *bucket, const char *prefix,
		  const char *delimiter, gcs_list_fn fn, void *arg)
{
	struct gcs_op *op = op_new(c, OP_LIST, bucket, prefix ? prefix : "");
	int rc;

	if (!op)
		return -ENOMEM;
	op->list_fn = fn;
	op->list_arg = arg;
	op->prefix = strdup(prefix ? prefix : "");
	op->delimiter = gcs_strdup(delimiter);
	op->idempotent = 1;
	op->step = list_step;
	rc = start_or_free(op, op->prefix ? build_list(op) : -ENOMEM, &op);
	return rc ? rc : wait_free(op);
}

/* grows an array to the next power of two when n reaches one */
static int grow(void **arr, size_t n, size_t size)
{
	void *np;

	if (n & (n - 1))
		return 0;
	np = realloc(*arr, (n ? 2 * n : 16) * size);
	if (!np)
		return -ENOMEM;
	*arr = np;
	return 0;
}

static int collect(void *arg, const struct gcs_object *o, const char *p)
{
	struct gcs_list *l = arg;

	if (o) {
		if (grow((void **)&l->items, l->n_items, sizeof(*o)))
			return -ENOMEM;
		l->items[l->n_items] = *o;
		l->items[l->n_items].name = strdup(o->name);
		if (!l->items[l->n_items].name)
			return -ENOMEM;
		l->n_items++;
	} else {
		if (grow((void **)&l->prefixes, l->n_prefixes, sizeof(char *)))
			return -ENOMEM;
		l->prefixes[l->n_prefixes] = strdup(p);
		if (!l->prefixes[l->n_prefixes])
			return -ENOMEM;
		l->n_prefixes++;
	}
	return 0;
}

int gcs_list(struct gcs_client *c, const char *bucket, const char *prefix,
	     const char *delimiter, struct gcs_list *out)
{
	int rc;

	memset(out, 0, sizeof(*out));
	rc = gcs_list_each(c, bucket, prefix, delimiter, collect, out);
	if (rc == -ENOMEM && !c->msg[0])
		snprintf(c->msg, sizeof(c->msg),
			 "gcs: list gs://%s/%s: out "
			 "of memory",
			 bucket, prefix ? prefix : "");
	if (rc)
		gcs_list_free(out);
	return rc;
}

void gcs_list_free(struct gcs_list *l)
{
	size_t i;

	for (i = 0; i < l->n_items; i++)
		gcs_object_clear(&l->items[i]);
	for (i = 0; i < l->n_prefixes; i++)
		free(l->prefixes[i]);
	free(l->items);
	free(l->prefixes);
	memset(l, 0, sizeof(*l));
}
