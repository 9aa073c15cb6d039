/* gcs_util.c - helpers of the client: time, strings, URL escaping, the
 * growable buffer; error messages (object, last HTTP status, the server's
 * own message, never the token) and the retry decision with its backoff;
 * object resources parsed from JSON.
 *
 * Retry policy (Google's): retry 408, 429, 5xx and transport failures
 * (reset, refused, broken stream, timeout) when the op is idempotent;
 * delay = uniform(0, min(max, initial * mult^(n-1))) (full jitter); stop
 * at the op's deadline or max_attempts. Everything else fails at once.
 */
#include "gcs_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double gcs_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *gcs_strdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

char *gcs_printf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

char *gcs_escape(const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(s), i, j = 0;
	char *out = malloc(3 * n + 1);

	if (!out)
		return NULL;
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		/* RFC 3986 unreserved characters pass; '/' does not */
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' ||
		    ch == '_' || ch == '~') {
			out[j++] = (char)ch;
		} else {
			out[j++] = '%';
			out[j++] = hex[ch >> 4];
			out[j++] = hex[ch & 15];
		}
	}
	out[j] = 0;
	return out;
}

int gcs_buf_add(struct gcs_buf *b, const void *p, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *np;

		while (cap < b->len + n + 1)
			cap *= 2;
		np = realloc(b->p, cap);
		if (!np)
			return -ENOMEM;
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

/* Replace any occurrence of the bearer token in a message (a hostile
 * server could echo it back). */
static void scrub_token(struct gcs_client *c, char *msg)
{
	size_t tl;
	char *p;

	if (!c || !c->token || !(tl = strlen(c->token)))
		return;
	while ((p = strstr(msg, c->token))) {
		memset(p, '*', tl);
	}
}

int op_fail(struct gcs_op *op, int rc, const char *fmt, ...)
{
	va_list ap;
	int n;

	n = snprintf(op->msg, sizeof(op->msg), "gcs: ");
	va_start(ap, fmt);
	vsnprintf(op->msg + n, sizeof(op->msg) - (size_t)n, fmt, ap);
	va_end(ap);
	scrub_token(op->c, op->msg);
	op_finish(op, rc);
	return rc;
}

static int status_rc(long st)
{
	switch (st) {
	case 404:
		return -ENOENT;
	case 401:
	case 403:
		return -EACCES;
	case 412:
		return GCS_E_PRECONDITION;
	case 416:
		return -ERANGE;
	default:
		return GCS_E_HTTP;
	}
}

/* The server's own words: error.message of a JSON error body, else the
 * start of the body with control characters blanked. */
static void server_message(const struct gcs_req *r, char *out, size_t n)
{
	json_t *j, *m;
	size_t i;

	out[0] = 0;
	if (!r->resp.len)
		return;
	j = json_loadb(r->resp.p, r->resp.len, 0, NULL);
	m = j ? json_object_get(json_object_get(j, "error"), "message") : NULL;
	if (json_is_string(m)) {
		snprintf(out, n, "%s", json_string_value(m));
	} else {
		snprintf(out, n, "%.*s",
			 (int)(r->resp.len < 200 ? r->resp.len : 200),
			 r->resp.p);
		for (i = 0; out[i]; i++)
			if ((unsigned char)out[i] < 32)
				out[i] = ' ';
	}
	json_decref(j);
}

static int transport_retryable(CURLcode cc)
{
	switch (cc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_PARTIAL_FILE:
	case CURLE_GOT_NOTHING:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return 1;
	default:
		return 0;
	}
}

int op_retryable(const struct gcs_op *op)
{
	const struct gcs_req *r = &op->req;

	if (r->cc != CURLE_OK)
		return transport_retryable(r->cc);
	return r->status == 408 || r->status == 429 ||
	       (r->status >= 500 && r->status <= 599);
}

int op_http_error(struct gcs_op *op, const char *doing)
{
	struct gcs_req *r = &op->req;
	char smsg[300];
	char tries[64] = "";

	if (op->attempt > 0)
		snprintf(tries, sizeof(tries), " (after %u attempts)",
			 op->attempt + 1);
	if (r->cc != CURLE_OK) {
		const char *why = r->errbuf[0] ? r->errbuf :
						 curl_easy_strerror(r->cc);

		if (r->status)
			return op_fail(op, GCS_E_TRANSPORT,
				       "%s %s: HTTP %ld, then %s%s", doing,
				       op->what, r->status, why, tries);
		return op_fail(op,
			       r->cc == CURLE_OPERATION_TIMEDOUT ?
				       -ETIMEDOUT :
				       GCS_E_TRANSPORT,
			       "%s %s: no HTTP status: %s%s", doing, op->what,
			       why, tries);
	}
	server_message(r, smsg, sizeof(smsg));
	return op_fail(op, status_rc(r->status), "%s %s: HTTP %ld: %s%s", doing,
		       op->what, r->status, smsg[0] ? smsg : "(no message)",
		       tries);
}

double op_backoff(struct gcs_op *op)
{
	struct gcs_client *c = op->c;
	double cap = c->cfg.initial_backoff_s;
	unsigned i;

	for (i = 1; i < op->attempt && cap < c->cfg.max_backoff_s; i++)
		cap *= c->cfg.backoff_mult;
	if (cap > c->cfg.max_backoff_s)
		cap = c->cfg.max_backoff_s;
	/* xorshift64* : full jitter in [0, cap] */
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return cap * (double)((c->rng * 0x2545f4914f6cdd1dull) >> 11) /
	       (double)(1ull << 53);
}

/* After a failed attempt: schedule a retry (1) or fail the op (<0). */
int op_retry_or_fail(struct gcs_op *op, const char *doing)
{
	struct gcs_client *c = op->c;
	double delay;

	if (!op_retryable(op) || !op->idempotent)
		return op_http_error(op, doing);
	op->attempt++;
	delay = op_backoff(op);
	if ((c->cfg.max_attempts && op->attempt >= c->cfg.max_attempts) ||
	    gcs_now() + delay >= op->deadline) {
		op->attempt--;
		return op_http_error(op, doing);
	}
	c->stats.retries++;
	op_issue(op, delay);
	return 1;
}

json_t *op_json_reply(struct gcs_op *op, const char *doing)
{
	json_error_t err;
	json_t *j = json_loadb(op->req.resp.p ? op->req.resp.p : "",
			       op->req.resp.len, 0, &err);

	if (!j || !json_is_object(j)) {
		json_decref(j);
		op_fail(op, GCS_E_PROTOCOL,
			"%s %s: HTTP %ld with a reply that is not a JSON "
			"object (%s)",
			doing, op->what, op->req.status, err.text);
		return NULL;
	}
	return j;
}

static int64_t json_int64(json_t *v, int *ok)
{
	/* the JSON API sends int64 fields as strings */
	if (json_is_string(v)) {
		char *end;
		long long x = strtoll(json_string_value(v), &end, 10);

		if (*end || end == json_string_value(v))
			*ok = 0;
		return x;
	}
	if (json_is_integer(v))
		return json_integer_value(v);
	*ok = 0;
	return 0;
}

int op_parse_object(struct gcs_op *op, json_t *j, struct gcs_object *o)
{
	json_t *name = json_object_get(j, "name");
	json_t *crc = json_object_get(j, "crc32c");
	int ok = 1;

	memset(o, 0, sizeof(*o));
	o->generation = json_int64(json_object_get(j, "generation"), &ok);
	o->metageneration = -1;
	if (json_object_get(j, "metageneration"))
		o->metageneration =
			json_int64(json_object_get(j, "metageneration"), &ok);
	o->size = (uint64_t)json_int64(json_object_get(j, "size"), &ok);
	if (!json_is_string(name))
		ok = 0;
	if (ok && json_is_string(crc)) {
		if (gcs_crc32c_from_b64(json_string_value(crc),
					json_string_length(crc),
					&o->crc32c) == 0)
			o->has_crc32c = 1;
		else
			ok = 0;
	}
	if (!ok)
		return op_fail(op, GCS_E_PROTOCOL,
			       "%s: object resource lacks name, generation or "
			       "size, or has a bad crc32c",
			       op->what);
	o->name = strdup(json_string_value(name));
	return o->name ? 0 :
			 op_fail(op, -ENOMEM, "%s: out of memory", op->what);
}

void gcs_object_clear(struct gcs_object *o)
{
	free(o->name);
	memset(o, 0, sizeof(*o));
}
