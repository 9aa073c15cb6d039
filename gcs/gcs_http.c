/* gcs_http.c - the client: curl multi loop, handle pool, retries, errors.
 *
 * gcs_poll() is the only place that talks to curl_multi: it issues the
 * requests of ops whose `due` time has come (at most cfg.streams at once),
 * lets curl move bytes on every connection, and calls op->step() for each
 * finished attempt. Easy handles come from a pool and go back after each
 * attempt; the multi handle's connection cache keeps HTTP/1.1 connections
 * alive between requests, so a steady stream of chunk PUTs and ranged GETs
 * reuses up to `streams` connections instead of reconnecting.
 * The retry decisions and error messages are in gcs_util.c.
 */
#include "gcs_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define GCS_VERSION "0.1"
#define RESP_MAX (64u << 20) /* JSON replies: list pages are the biggest */

/* ---- client ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

int gcs_client_new(struct gcs_client **out, const struct gcs_config *cfg)
{
	struct gcs_client *c = calloc(1, sizeof(*c));
	struct gcs_config *k;
	int rc;

	*out = NULL;
	if (!c)
		return -ENOMEM;
	if (cfg)
		c->cfg = *cfg;
	k = &c->cfg;
	k->endpoint = NULL;
	k->retry_test_id = NULL;
	if (!k->streams)
		k->streams = 16;
	if (k->initial_backoff_s <= 0)
		k->initial_backoff_s = 1.0;
	if (k->max_backoff_s <= 0)
		k->max_backoff_s = 32.0;
	if (k->backoff_mult < 1)
		k->backoff_mult = 2.0;
	if (k->deadline_s <= 0)
		k->deadline_s = 600.0;
	if (k->connect_timeout_s <= 0)
		k->connect_timeout_s = 10.0;
	if (!k->stall_s)
		k->stall_s = 60;
	if (!k->chunk_bytes)
		k->chunk_bytes = 16u << 20;
	k->chunk_bytes -= k->chunk_bytes % GCS_PIECE;
	if (!k->chunk_bytes)
		k->chunk_bytes = GCS_PIECE;
	if (!k->multipart_max)
		k->multipart_max = 16u << 20;
	if (!k->max_list_pages)
		k->max_list_pages = 100000;
	if (!k->list_page_size || k->list_page_size > 1000)
		k->list_page_size = 1000;
	/* keep our own copies of the strings */
	if (cfg && cfg->endpoint)
		k->endpoint = gcs_strdup(cfg->endpoint);
	if (cfg && cfg->retry_test_id)
		k->retry_test_id = gcs_strdup(cfg->retry_test_id);

	pthread_once(&curl_once, curl_init_once);
	c->multi = curl_multi_init();
	c->pool = calloc(k->streams, sizeof(*c->pool));
	c->rng = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^
		 (uint64_t)(gcs_now() * 1e9);
	if (!c->multi || !c->pool) {
		gcs_client_free(c);
		return -ENOMEM;
	}
	curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)k->streams);
	rc = gcs_auth_setup(c);
	if (rc) {
		gcs_client_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void gcs_client_free(struct gcs_client *c)
{
	unsigned i;

	if (!c)
		return;
	while (c->ops) {
		struct gcs_op *op = c->ops;

		/* an op the caller forgot: detach it from the loop */
		if (op->in_flight) {
			curl_multi_remove_handle(c->multi, op->req.easy);
			curl_easy_cleanup(op->req.easy);
			curl_slist_free_all(op->req.sent_hdrs);
			op->req.sent_hdrs = NULL;
			op->req.easy = NULL;
			op->in_flight = 0;
		}
		c->ops = op->next;
		op->next = op->prev = NULL;
		op->c = NULL;
	}
	for (i = 0; i < c->n_pool; i++)
		curl_easy_cleanup(c->pool[i]);
	free(c->pool);
	if (c->multi)
		curl_multi_cleanup(c->multi);
	gcs_auth_free(c);
	free((char *)c->cfg.endpoint);
	free((char *)c->cfg.retry_test_id);
	free(c);
}

const char *gcs_errmsg(const struct gcs_client *c)
{
	return c->msg;
}

void gcs_get_stats(const struct gcs_client *c, struct gcs_stats *st)
{
	*st = c->stats;
}

/* ---- requests ---- */

void req_reset(struct gcs_req *r)
{
	curl_slist_free_all(r->hdrs);
	r->hdrs = NULL;
	free(r->url);
	r->url = NULL;
	free(r->location);
	r->location = NULL;
	r->resp.len = 0;
	if (r->resp.p)
		r->resp.p[0] = 0;
	memset(r->iov, 0, sizeof(r->iov));
	r->body_len = r->body_off = 0;
	r->resent = 0;
	r->has_body = 0;
	r->src = NULL;
	r->media = 0;
	r->status = 0;
	r->cc = CURLE_OK;
	r->errbuf[0] = 0;
	r->has_range = r->has_hash = r->hash_bad = 0;
	r->has_content_range = 0;
	r->x_generation = -1;
}

int req_set(struct gcs_req *r, const char *method, char *url)
{
	req_reset(r);
	r->method = method;
	r->url = url;
	r->auth = 1;
	return url ? 0 : -ENOMEM;
}

int req_header(struct gcs_req *r, const char *h)
{
	struct curl_slist *n = curl_slist_append(r->hdrs, h);

	if (!n)
		return -ENOMEM;
	r->hdrs = n;
	return 0;
}

int req_cond(struct gcs_req *r, struct gcs_cond cond)
{
	char *u;

	if (cond.if_generation_match >= 0) {
		u = gcs_printf("%s%cifGenerationMatch=%lld", r->url,
			       strchr(r->url, '?') ? '&' : '?',
			       (long long)cond.if_generation_match);
		if (!u)
			return -ENOMEM;
		free(r->url);
		r->url = u;
	}
	if (cond.if_metageneration_match >= 0) {
		u = gcs_printf("%s%cifMetagenerationMatch=%lld", r->url,
			       strchr(r->url, '?') ? '&' : '?',
			       (long long)cond.if_metageneration_match);
		if (!u)
			return -ENOMEM;
		free(r->url);
		r->url = u;
	}
	return 0;
}

static size_t write_cb(char *p, size_t size, size_t n, void *arg)
{
	struct gcs_req *r = arg;
	size_t len = size * n;
	long st = 0;

	curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &st);
	if (r->media && (st == 200 || st == 206)) {
		if (r->expect_start >= 0 &&
		    !(st == 206 && r->has_content_range &&
		      r->cr_start == (uint64_t)r->expect_start) &&
		    !(st == 200 && r->expect_start == 0)) {
			r->proto_err = 1; /* not the bytes we asked for */
			return 0;
		}
		r->expect_start = -1; /* checked once per reply */
		if (r->sink_len + len > r->sink_cap) {
			unsigned char *np;
			size_t cap = r->sink_cap ? r->sink_cap : 65536;

			if (!r->sink_grow) {
				r->proto_err = 1; /* more than asked */
				return 0;
			}
			if (r->sink_max && r->sink_len + len > r->sink_max) {
				r->too_big = 1;
				return 0;
			}
			while (cap < r->sink_len + len)
				cap *= 2;
			np = realloc(r->sink, cap);
			if (!np)
				return 0;
			r->sink = np;
			r->sink_cap = cap;
		}
		memcpy(r->sink + r->sink_len, p, len);
		r->sink_len += len;
		r->sink_crc = gcs_crc32c(r->sink_crc, p, len);
		return len;
	}
	if (r->resp.len + len > RESP_MAX)
		return 0;
	return gcs_buf_add(&r->resp, p, len) ? 0 : len;
}

static int hdr_is(const char *line, size_t n, const char *name,
		  const char **val, size_t *vlen)
{
	size_t k = strlen(name);

	if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0)
		return 0;
	line += k + 1;
	n -= k + 1;
	while (n && (*line == ' ' || *line == '\t')) {
		line++;
		n--;
	}
	while (n && (line[n - 1] == '\r' || line[n - 1] == '\n' ||
		     line[n - 1] == ' '))
		n--;
	*val = line;
	*vlen = n;
	return 1;
}

static void parse_goog_hash(struct gcs_req *r, const char *v, size_t n)
{
	while (n) {
		const char *comma = memchr(v, ',', n);
		size_t len = comma ? (size_t)(comma - v) : n;
		const char *s = v;
		size_t sl = len;

		while (sl && *s == ' ') {
			s++;
			sl--;
		}
		if (sl > 7 && strncasecmp(s, "crc32c=", 7) == 0) {
			uint32_t crc;

			while (sl && s[sl - 1] == ' ')
				sl--;
			if (gcs_crc32c_from_b64(s + 7, sl - 7, &crc) == 0) {
				r->has_hash = 1;
				r->hash_crc = crc;
			} else {
				r->hash_bad = 1;
			}
		}
		if (!comma)
			break;
		v = comma + 1;
		n -= len + 1;
	}
}

static size_t header_cb(char *line, size_t size, size_t n, void *arg)
{
	struct gcs_req *r = arg;
	size_t len = size * n;
	const char *v;
	size_t vl;
	char tmp[128];

	if (len > 5 && strncmp(line, "HTTP/", 5) == 0) {
		/* a new response (after 100 Continue, say): forget headers */
		free(r->location);
		r->location = NULL;
		r->has_range = r->has_hash = r->hash_bad = 0;
		r->has_content_range = 0;
		r->x_generation = -1;
		return len;
	}
	if (hdr_is(line, len, "Location", &v, &vl)) {
		free(r->location);
		r->location = strndup(v, vl);
	} else if (hdr_is(line, len, "Range", &v, &vl)) {
		unsigned long long a, b;

		snprintf(tmp, sizeof(tmp), "%.*s", (int)vl, v);
		if (sscanf(tmp, "bytes=%llu-%llu", &a, &b) == 2 && a == 0) {
			r->has_range = 1;
			r->range_end = b + 1;
		}
	} else if (hdr_is(line, len, "x-goog-hash", &v, &vl)) {
		parse_goog_hash(r, v, vl);
	} else if (hdr_is(line, len, "x-goog-generation", &v, &vl)) {
		snprintf(tmp, sizeof(tmp), "%.*s", (int)vl, v);
		r->x_generation = strtoll(tmp, NULL, 10);
	} else if (hdr_is(line, len, "Content-Range", &v, &vl)) {
		unsigned long long a, b, t;

		snprintf(tmp, sizeof(tmp), "%.*s", (int)vl, v);
		if (sscanf(tmp, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
			r->has_content_range = 1;
			r->cr_start = a;
			r->cr_total = t;
		}
	}
	return len;
}

static size_t mem_read_cb(char *dst, size_t size, size_t n, void *arg)
{
	struct gcs_req *r = arg;
	size_t want = size * n, out = 0, base = 0;
	unsigned i;

	for (i = 0; i < 3 && out < want; i++) {
		size_t end = base + r->iov[i].n;

		if (r->body_off < end) {
			size_t in = r->body_off - base,
			       take = end - r->body_off;

			if (take > want - out)
				take = want - out;
			memcpy(dst + out, (const char *)r->iov[i].p + in, take);
			out += take;
			r->body_off += take;
		}
		base = end;
	}
	return out;
}

void req_body(struct gcs_req *r, const void *head, size_t head_len,
	      const void *mid, size_t mid_len, const void *tail,
	      size_t tail_len)
{
	r->iov[0] = (struct gcs_iov){ head, head_len };
	r->iov[1] = (struct gcs_iov){ mid, mid_len };
	r->iov[2] = (struct gcs_iov){ tail, tail_len };
	r->body_len = head_len + mid_len + tail_len;
	r->has_body = 1;
}

/* curl rewinds a body when it resends a request on a fresh connection
 * (a kept-alive one turned out closed): back to the start of the body. */
static int seek_cb(void *arg, curl_off_t off, int origin)
{
	struct gcs_req *r = arg;

	if (origin != SEEK_SET || off < 0)
		return CURL_SEEKFUNC_CANTSEEK;
	if (r->src) {
		if ((uint64_t)off > r->src_end - r->src_start)
			return CURL_SEEKFUNC_FAIL;
		r->src_off = r->src_start + (uint64_t)off;
		r->cur = NULL;
	} else {
		if ((size_t)off > r->body_len)
			return CURL_SEEKFUNC_FAIL;
		/* curl sends a request again by itself when a reused
		 * connection died before any answer: no retry of ours */
		if (r->body_off > (size_t)off)
			r->resent = 1;
		r->body_off = (size_t)off;
	}
	return CURL_SEEKFUNC_OK;
}

static CURL *pool_get(struct gcs_client *c)
{
	if (c->n_pool)
		return c->pool[--c->n_pool];
	return curl_easy_init();
}

static void pool_put(struct gcs_client *c, CURL *e)
{
	if (c->n_pool < c->cfg.streams) {
		curl_easy_reset(e);
		c->pool[c->n_pool++] = e;
	} else {
		curl_easy_cleanup(e);
	}
}

static int add_header_list(struct curl_slist **l, const char *h)
{
	struct curl_slist *n = curl_slist_append(*l, h);

	if (!n)
		return -ENOMEM;
	*l = n;
	return 0;
}

/* The attempt's own header list: the op's headers plus auth and test id;
 * kept in the handle's private pointer so completion can free it. */
static int start_attempt(struct gcs_op *op)
{
	struct gcs_client *c = op->c;
	struct gcs_req *r = &op->req;
	struct curl_slist *h = NULL, *it;
	CURL *e;
	char *auth = NULL, tmp[256];
	double left = op->deadline - gcs_now();
	int rc = 0;

	for (it = r->hdrs; it && !rc; it = it->next)
		rc = add_header_list(&h, it->data);
	if (!rc)
		rc = add_header_list(&h, "Expect:");
	if (!rc) {
		snprintf(tmp, sizeof(tmp),
			 "x-goog-api-client: gccl-invocation-id/%s "
			 "gccl-attempt-count/%u",
			 op->invocation, op->attempt + 1);
		rc = add_header_list(&h, tmp);
	}
	if (!rc && c->cfg.retry_test_id) {
		snprintf(tmp, sizeof(tmp), "x-retry-test-id: %s",
			 c->cfg.retry_test_id);
		rc = add_header_list(&h, tmp);
	}
	if (!rc && r->auth) {
		char err[256];

		rc = gcs_auth_header(c, &auth, err, sizeof(err));
		if (rc == 0 && auth) {
			rc = add_header_list(&h, auth);
			/* wipe our copy of the token */
			memset(auth, 0, strlen(auth));
			free(auth);
		} else if (rc) {
			curl_slist_free_all(h);
			return op_fail(op, rc, "%s %s: %s", r->method, op->what,
				       err);
		}
	}
	e = rc ? NULL : pool_get(c);
	if (!e) {
		curl_slist_free_all(h);
		return op_fail(op, -ENOMEM, "%s %s: out of memory", r->method,
			       op->what);
	}
	r->easy = e;
	r->status = 0;
	r->cc = CURLE_OK;
	r->errbuf[0] = 0;
	r->resp.len = 0;
	r->proto_err = 0;
	r->too_big = 0;
	r->body_off = 0;
	curl_easy_setopt(e, CURLOPT_URL, r->url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(e, CURLOPT_PRIVATE, op);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "ckpt-gcs/" GCS_VERSION);
	/* bigger socket buffers than curl's defaults for GiB transfers */
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024);
	curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 1024L * 1024);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)(c->cfg.connect_timeout_s * 1000));
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)c->cfg.stall_s);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
			 left > 0.001 ? (long)(left * 1000) : 1L);
	curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, seek_cb);
	curl_easy_setopt(e, CURLOPT_SEEKDATA, r);
	if (r->src) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, upload_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, r);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
				 (curl_off_t)(r->src_end - r->src_off));
	} else if (strcmp(r->method, "PUT") == 0) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, mem_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, r);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
				 (curl_off_t)r->body_len);
	} else if (strcmp(r->method, "POST") == 0) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, mem_read_cb);
		curl_easy_setopt(e, CURLOPT_READDATA, r);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)r->body_len);
	} else if (strcmp(r->method, "GET") != 0) {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
		if (strcmp(r->method, "HEAD") == 0)
			curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	}
	r->sent_hdrs = h;
	r->cur = NULL;
	if (curl_multi_add_handle(c->multi, e) != CURLM_OK) {
		curl_slist_free_all(h);
		pool_put(c, e);
		r->easy = NULL;
		return op_fail(op, GCS_E_TRANSPORT, "%s %s: curl refused it",
			       r->method, op->what);
	}
	op->in_flight = 1;
	op->waiting = 0;
	c->active++;
	c->stats.requests++;
	return 0;
}

static void end_attempt(struct gcs_client *c, struct gcs_op *op)
{
	struct gcs_req *r = &op->req;
	curl_off_t up = 0, down = 0;
	long conns = 0;

	curl_easy_getinfo(r->easy, CURLINFO_NUM_CONNECTS, &conns);
	curl_easy_getinfo(r->easy, CURLINFO_SIZE_UPLOAD_T, &up);
	curl_easy_getinfo(r->easy, CURLINFO_SIZE_DOWNLOAD_T, &down);
	c->stats.connects += (uint64_t)conns;
	c->stats.bytes_up += (uint64_t)up;
	c->stats.bytes_down += (uint64_t)down;
	curl_multi_remove_handle(c->multi, r->easy);
	pool_put(c, r->easy);
	curl_slist_free_all(r->sent_hdrs);
	r->sent_hdrs = NULL;
	r->easy = NULL;
	op->in_flight = 0;
	c->active--;
}

/* ---- ops ---- */

void op_init(struct gcs_client *c, struct gcs_op *op, enum gcs_op_kind kind,
	     const char *bucket, const char *name)
{
	op->c = c;
	op->kind = kind;
	op->t_start = gcs_now();
	op->deadline = op->t_start + c->cfg.deadline_s;
	op->req.x_generation = -1;
	op->pin_generation = -1;
	op->bucket = gcs_strdup(bucket);
	op->name = gcs_strdup(name);
	c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
	snprintf(op->invocation, sizeof(op->invocation), "%016llx",
		 (unsigned long long)(c->rng ^ (c->rng >> 29)));
	snprintf(op->what, sizeof(op->what), "gs://%s/%s", bucket ? bucket : "",
		 name ? name : "");
	op->next = c->ops;
	if (c->ops)
		c->ops->prev = op;
	c->ops = op;
}

void op_issue(struct gcs_op *op, double delay)
{
	op->waiting = 1;
	op->due = gcs_now() + delay;
}

void op_finish(struct gcs_op *op, int rc)
{
	op->done = 1;
	op->waiting = 0;
	op->rc = rc;
	if (rc && op->c)
		snprintf(op->c->msg, sizeof(op->c->msg), "%s", op->msg);
	/* gcs_poll returns once this turn is over: its caller (gcs_op_wait
	 * included) sees the result now, not at the end of its timeout */
	if (op->c)
		atomic_store(&op->c->woken, 1);
}

/* ---- the loop ---- */

static void issue_ready(struct gcs_client *c)
{
	struct gcs_op *op;
	double now = gcs_now();

	for (op = c->ops; op && c->active < c->cfg.streams; op = op->next) {
		if (!op->waiting || op->done || op->due > now)
			continue;
		if (now >= op->deadline && op->attempt > 0) {
			op_http_error(op, op->req.method);
			continue;
		}
		start_attempt(op);
	}
}

static void reap(struct gcs_client *c)
{
	CURLMsg *m;
	int left;

	while ((m = curl_multi_info_read(c->multi, &left))) {
		struct gcs_op *op = NULL;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE,
				  (char **)&op);
		if (!op || !op->in_flight || op->req.easy != m->easy_handle)
			continue;
		op->req.cc = m->data.result;
		curl_easy_getinfo(op->req.easy, CURLINFO_RESPONSE_CODE,
				  &op->req.status);
		end_attempt(c, op);
		op->step(op);
	}
}

/* gcs_cancel: every op not done ends now, its transfer dropped. */
static void cancel_all(struct gcs_client *c)
{
	struct gcs_op *op;

	for (op = c->ops; op; op = op->next) {
		if (op->done)
			continue;
		if (op->in_flight)
			end_attempt(c, op);
		snprintf(op->msg, sizeof(op->msg), "%s: cancelled", op->what);
		op_finish(op, -ECANCELED);
	}
}

int gcs_poll(struct gcs_client *c, int timeout_ms)
{
	double t_end = gcs_now() + timeout_ms / 1000.0;
	int running, live;

	for (;;) {
		struct gcs_op *op;
		double next = t_end, now;
		int wait_ms;

		if (atomic_load(&c->cancelled))
			cancel_all(c);
		issue_ready(c);
		curl_multi_perform(c->multi, &running);
		reap(c);
		issue_ready(c);
		live = 0;
		for (op = c->ops; op; op = op->next) {
			if (op->done)
				continue;
			live++;
			if (op->waiting && op->due < next)
				next = op->due;
		}
		now = gcs_now();
		if (!live || now >= t_end || atomic_exchange(&c->woken, 0))
			break;
		wait_ms = (int)((next - now) * 1000) + 1;
		if (wait_ms > 1000)
			wait_ms = 1000;
		/* sockets, the next retry's time, or gcs_wakeup() */
		curl_multi_poll(c->multi, NULL, 0, wait_ms, NULL);
	}
	return live;
}

void gcs_wakeup(struct gcs_client *c)
{
	atomic_store(&c->woken, 1);
	curl_multi_wakeup(c->multi);
}

void gcs_cancel(struct gcs_client *c)
{
	atomic_store(&c->cancelled, 1);
	gcs_wakeup(c);
}

int gcs_op_done(const struct gcs_op *op)
{
	return op->done;
}

int gcs_op_wait(struct gcs_op *op)
{
	while (!op->done && op->c)
		gcs_poll(op->c, 1000);
	return op->done ? op->rc : GCS_E_TRANSPORT;
}

const char *gcs_op_errmsg(const struct gcs_op *op)
{
	return op->msg;
}

/* Detach an op from its client and free what it holds (not op itself). */
void op_release(struct gcs_op *op)
{
	struct gcs_client *c = op->c;

	if (c) {
		if (op->in_flight)
			end_attempt(c, op);
		if (op->prev)
			op->prev->next = op->next;
		else
			c->ops = op->next;
		if (op->next)
			op->next->prev = op->prev;
	}
	req_reset(&op->req);
	free(op->req.resp.p);
	if (op->req.sink_grow)
		free(op->req.sink);
	free(op->bucket);
	free(op->name);
	free(op->page_token);
	free(op->prefix);
	free(op->delimiter);
	free(op->body);
	free(op->body2);
	gcs_object_clear(&op->obj);
}

void gcs_op_free(struct gcs_op *op)
{
	if (!op)
		return;
	if (op->kind == OP_UPLOAD) {
		gcs_upload_free((struct gcs_upload *)op);
		return;
	}
	op_release(op);
	free(op);
}
