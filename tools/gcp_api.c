/*
 * gcp_api.c - the REST client of gcp_api.h: configuration, the token,
 * calls with Google's retry strategy, TPU nodes and operations, Logging.
 *
 * Design note: one libcurl easy handle, reset before each request, used
 * from one thread. The token is held in a->token only (zeroed when
 * dropped) and goes out in the Authorization header; every message built
 * from a reply has it scrubbed, in case a server echoes it back. The
 * metadata server is asked with Metadata-Flavor: Google and a reply
 * without that header is refused (it is not the metadata server).
 *
 *   gcp_call: token? --> request --> 2xx: done
 *                          |-- 408/429/5xx/transport, retry allowed:
 *                          |     sleep (Retry-After, or jittered backoff)
 *                          |-- 401 once with a metadata token: new token
 *                          '-- else: "HTTP n STATUS: message"
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "ckpt.h"
#include "cli.h"
#include "gcp_api.h"

#define MAX_ATTEMPTS 6
#define BACKOFF_MAX_S 32.0
#define TOKEN_MARGIN_NS (60 * (int64_t)1000000000)
#define REQUEST_TIMEOUT_S 120L
#define CONNECT_TIMEOUT_S 15L
#define BODY_MAX (64u << 20)

struct gcp_api {
	char *project;
	char *tpu_base; /* ends in '/' */
	char *log_base; /* ends in '/' */
	char *md_host;
	char *token_file; /* NULL: the metadata server */
	char *token;
	int64_t token_exp_ns; /* 0: no expiry known */
	CURL *curl;
	double backoff_s;
	uint64_t rnd;
};

/* A reply being received. */
struct buf {
	char *p;
	size_t n, cap;
	int too_big;
	double retry_after; /* seconds, -1: none */
	int md_flavor;      /* Metadata-Flavor: Google seen */
};

/* ------------------------------------------------------------------ */
/* Small helpers                                                      */
/* ------------------------------------------------------------------ */

static char *xstrdup(const char *s)
{
	char *d = strdup(s);

	if (!d)
		cli_jcheck(NULL); /* prints and exits */
	return d;
}

/* `s` with a '/' at the end; malloc'd. */
static char *with_slash(const char *s)
{
	size_t n = strlen(s);
	char *d = malloc(n + 2);

	if (!d)
		cli_jcheck(NULL);
	memcpy(d, s, n + 1);
	if (!n || d[n - 1] != '/')
		strcpy(d + n, "/");
	return d;
}

static void drop_token(gcp_api *a)
{
	if (a->token) {
		memset(a->token, 0, strlen(a->token));
		free(a->token);
	}
	a->token = NULL;
	a->token_exp_ns = 0;
}

/* Replaces every copy of the token in `s` (a message) by "[token]". */
static void scrub(const gcp_api *a, char *s)
{
	size_t tl = a->token ? strlen(a->token) : 0;
	char *p;

	if (tl < 4)
		return;
	while ((p = strstr(s, a->token))) {
		memcpy(p, "[token]", 7);
		memmove(p + 7, p + tl, strlen(p + tl) + 1);
	}
}

/* Printable, one line: control bytes become spaces. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < ' ' || *s == 127)
			*s = ' ';
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
	struct buf *b = arg;
	size_t len = size * n;

	if (b->n + len + 1 > BODY_MAX) {
		b->too_big = 1;
		return 0;
	}
	if (b->n + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->n + len + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p)
			return 0;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, data, len);
	b->n += len;
	b->p[b->n] = 0;
	return len;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
	struct buf *b = arg;
	size_t len = size * n;
	char line[256];

	if (len >= sizeof(line))
		return len;
	memcpy(line, data, len);
	line[len] = 0;
	if (!strncasecmp(line, "Retry-After:", 12)) {
		char *end;
		double v = strtod(line + 12, &end);

		/* seconds; an HTTP date leaves it to the backoff */
		if (end != line + 12 && v >= 0)
			b->retry_after = v;
	} else if (!strncasecmp(line, "Metadata-Flavor:", 16) &&
		   strstr(line + 16, "Google"))
		b->md_flavor = 1;
	return len;
}

/* Sleeps `s` seconds in slices, unless SIGINT/SIGTERM arrives (1). */
int gcp_sleep(double s)
{
	int64_t end = cli_now_ns() + (int64_t)(s * 1e9);

	while (!cli_interrupted && cli_now_ns() < end) {
		int64_t left = end - cli_now_ns();
		struct timespec ts = { 0, left > 100000000 ? 100000000 : left };

		if (left > 0)
			nanosleep(&ts, NULL);
	}
	return cli_interrupted != 0;
}

static double jitter01(gcp_api *a)
{
	a->rnd ^= a->rnd << 13;
	a->rnd ^= a->rnd >> 7;
	a->rnd ^= a->rnd << 17;
	return (double)(a->rnd >> 11) / (double)(1ull << 53);
}

/* ------------------------------------------------------------------ */
/* The metadata server                                                */
/* ------------------------------------------------------------------ */

/* GET computeMetadata/v1/`key` into a malloc'd string. 0, or -1 with a
 * reason in err. */
static int md_get(CURL *h, const char *host, const char *key, char **out,
		  char *err, size_t errlen)
{
	struct buf b = { .retry_after = -1 };
	struct curl_slist *hd =
		curl_slist_append(NULL, "Metadata-Flavor: Google");
	char url[512];
	long code = 0;
	CURLcode cc;

	*out = NULL;
	snprintf(url, sizeof(url), "http://%s/computeMetadata/v1/%s", host,
		 key);
	curl_easy_reset(h);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, &b);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 3L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
	curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
	cc = curl_easy_perform(h);
	curl_slist_free_all(hd);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	if (cc != CURLE_OK)
		snprintf(err, errlen, "metadata server %s: %s", host,
			 curl_easy_strerror(cc));
	else if (code != 200)
		snprintf(err, errlen, "metadata server %s: HTTP %ld for %s",
			 host, code, key);
	else if (!b.md_flavor)
		snprintf(err, errlen,
			 "%s answered without Metadata-Flavor: Google (not a "
			 "metadata server)",
			 host);
	else if (!b.p)
		b.p = xstrdup("");
	if (cc != CURLE_OK || code != 200 || !b.md_flavor) {
		free(b.p);
		return -1;
	}
	*out = b.p;
	return 0;
}

static const char *md_host(void)
{
	const char *h = getenv("GCE_METADATA_HOST");

	return h && *h ? h : "metadata.google.internal";
}

char *gcp_default_zone(void)
{
	const char *z = getenv("CLOUDSDK_COMPUTE_ZONE");
	char err[256], *v = NULL, *slash;
	CURL *h;

	if (z && *z)
		return xstrdup(z);
	h = curl_easy_init();
	if (!h)
		return NULL;
	if (md_get(h, md_host(), "instance/zone", &v, err, sizeof(err)))
		v = NULL;
	curl_easy_cleanup(h);
	/* projects/NUMBER/zones/ZONE */
	if (v && (slash = strrchr(v, '/')))
		memmove(v, slash + 1, strlen(slash + 1) + 1);
	if (v && !*v) {
		free(v);
		v = NULL;
	}
	return v;
}

/* A token from the metadata server (cached until a minute before it
 * expires). 0, or -1 with err. */
static int md_token(gcp_api *a, char *err, size_t errlen)
{
	json_t *j, *t, *e;
	char *v;

	if (md_get(a->curl, a->md_host,
		   "instance/service-accounts/default/token", &v, err, errlen))
		return -1;
	j = json_loads(v, 0, NULL);
	memset(v, 0, strlen(v));
	free(v);
	t = json_object_get(j, "access_token");
	e = json_object_get(j, "expires_in");
	if (!json_is_string(t) || !*json_string_value(t)) {
		snprintf(err, errlen,
			 "the metadata server's token reply has no "
			 "access_token");
		json_decref(j);
		return -1;
	}
	drop_token(a);
	a->token = xstrdup(json_string_value(t));
	if (json_is_integer(e))
		a->token_exp_ns = cli_now_ns() +
				  json_integer_value(e) * (int64_t)1000000000;
	json_decref(j);
	return 0;
}

static int file_token(gcp_api *a, char *err, size_t errlen)
{
	FILE *f = fopen(a->token_file, "r");
	char tok[8192];
	size_t n;

	if (!f) {
		snprintf(err, errlen, "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE %s: %s",
			 a->token_file, strerror(errno));
		return -1;
	}
	n = fread(tok, 1, sizeof(tok) - 1, f);
	fclose(f);
	tok[n] = 0;
	while (n && isspace((unsigned char)tok[n - 1]))
		tok[--n] = 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)tok[i] <= ' ' ||
		    (unsigned char)tok[i] >= 127)
			n = 0; /* not a bearer token */
	if (!n) {
		snprintf(err, errlen,
			 "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE %s holds no token",
			 a->token_file);
		memset(tok, 0, sizeof(tok));
		return -1;
	}
	drop_token(a);
	a->token = xstrdup(tok);
	memset(tok, 0, sizeof(tok));
	return 0;
}

static int ensure_token(gcp_api *a, char *err, size_t errlen)
{
	if (a->token && (!a->token_exp_ns ||
			 cli_now_ns() + TOKEN_MARGIN_NS < a->token_exp_ns))
		return 0;
	if (a->token_file)
		return file_token(a, err, errlen);
	if (md_token(a, err, errlen) == 0)
		return 0;
	/* say what to do, keeping the reason */
	{
		char why[512];

		snprintf(why, sizeof(why), "%.400s", err);
		snprintf(err, errlen,
			 "no access token: set CLOUDSDK_AUTH_ACCESS_TOKEN_FILE "
			 "(e.g. to a file holding 'gcloud auth "
			 "print-access-token') or run on a Google Cloud VM "
			 "(%.400s)",
			 why);
	}
	return -1;
}

/* ------------------------------------------------------------------ */
/* Opening                                                            */
/* ------------------------------------------------------------------ */

gcp_api *gcp_open(const char *project)
{
	const char *p = getenv("CLOUDSDK_CORE_PROJECT");
	const char *tpu = getenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU");
	const char *log = getenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING");
	const char *tf = getenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE");
	const char *bo = getenv("CKPT_API_BACKOFF_S");
	uint64_t seed = 0;
	gcp_api *a;

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		cli_err("cannot initialise libcurl");
		return NULL;
	}
	a = calloc(1, sizeof(*a));
	if (!a)
		cli_jcheck(NULL);
	a->curl = curl_easy_init();
	if (!a->curl) {
		cli_err("cannot initialise libcurl");
		free(a);
		return NULL;
	}
	a->tpu_base =
		with_slash(tpu && *tpu ? tpu : "https://tpu.googleapis.com/");
	a->log_base = with_slash(
		log && *log ? log : "https://logging.googleapis.com/");
	a->md_host = xstrdup(md_host());
	a->token_file = tf && *tf ? xstrdup(tf) : NULL;
	a->backoff_s = bo && *bo ? strtod(bo, NULL) : 1.0;
	if (!(a->backoff_s >= 0) || a->backoff_s > BACKOFF_MAX_S)
		a->backoff_s = 1.0;
	if (getrandom(&seed, sizeof(seed), 0) < 0)
		seed = (uint64_t)cli_now_ns() ^ (uint64_t)getpid();
	a->rnd = seed | 1;
	if (project && *project) {
		a->project = xstrdup(project);
	} else if (p && *p) {
		a->project = xstrdup(p);
	} else {
		char err[512];

		if (md_get(a->curl, a->md_host, "project/project-id",
			   &a->project, err, sizeof(err))) {
			cli_err("no project: give --project or set "
				"CLOUDSDK_CORE_PROJECT (%s)",
				err);
			gcp_close(a);
			return NULL;
		}
	}
	return a;
}

void gcp_close(gcp_api *a)
{
	if (!a)
		return;
	drop_token(a);
	if (a->curl)
		curl_easy_cleanup(a->curl);
	free(a->project);
	free(a->tpu_base);
	free(a->log_base);
	free(a->md_host);
	free(a->token_file);
	free(a);
}

const char *gcp_project(const gcp_api *a)
{
	return a->project;
}

/* ------------------------------------------------------------------ */
/* Calls                                                              */
/* ------------------------------------------------------------------ */

const char *gcp_code_name(long c)
{
	static const char *const names[] = {
		"OK",
		"CANCELLED",
		"UNKNOWN",
		"INVALID_ARGUMENT",
		"DEADLINE_EXCEEDED",
		"NOT_FOUND",
		"ALREADY_EXISTS",
		"PERMISSION_DENIED",
		"RESOURCE_EXHAUSTED",
		"FAILED_PRECONDITION",
		"ABORTED",
		"OUT_OF_RANGE",
		"UNIMPLEMENTED",
		"INTERNAL",
		"UNAVAILABLE",
		"DATA_LOSS",
		"UNAUTHENTICATED",
	};

	return c >= 0 && c < (long)(sizeof(names) / sizeof(names[0])) ?
		       names[c] :
		       "UNKNOWN";
}

void gcp_uuid(char out[37])
{
	unsigned char u[16];

	if (getrandom(u, sizeof(u), 0) != (ssize_t)sizeof(u))
		for (size_t i = 0; i < sizeof(u); i++)
			u[i] = (unsigned char)(cli_now_ns() >> (i % 8));
	u[6] = (unsigned char)((u[6] & 0x0f) | 0x40);
	u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
		 u[10], u[11], u[12], u[13], u[14], u[15]);
}

void gcp_reply_free(gcp_reply *r)
{
	json_decref(r->body);
	r->body = NULL;
}

static int retryable(long http)
{
	return http == 0 || http == 408 || http == 429 || http >= 500;
}

/* r->msg and r->status from an error reply: Google's JSON error format
 * {"error": {"code", "message", "status"}}, else the start of the text. */
static void error_reply(gcp_api *a, gcp_reply *r, const struct buf *b)
{
	json_t *e = json_object_get(r->body, "error");
	json_t *st = json_object_get(e, "status");
	json_t *m = json_object_get(e, "message");
	char words[700];

	r->status[0] = 0;
	if (json_is_string(st))
		snprintf(r->status, sizeof(r->status), "%s",
			 json_string_value(st));
	if (json_is_string(m))
		snprintf(words, sizeof(words), "%s", json_string_value(m));
	else if (json_is_string(e))
		snprintf(words, sizeof(words), "%s", json_string_value(e));
	else
		snprintf(words, sizeof(words), "%.200s",
			 b->p && *b->p ? b->p : "(no message)");
	one_line(words);
	snprintf(r->msg, sizeof(r->msg), "HTTP %ld%s%s: %s", r->http,
		 r->status[0] ? " " : "", r->status, words);
	scrub(a, r->msg);
}

/* One attempt. 0 when a reply came (r->http set), -1 transport error. */
static int attempt(gcp_api *a, const char *method, const char *url,
		   const char *body, struct buf *b, gcp_reply *r)
{
	struct curl_slist *hd = NULL;
	char auth[8300], ua[64];
	CURLcode cc;

	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", a->token);
	snprintf(ua, sizeof(ua), "User-Agent: ckptctl/%s",
		 ckpt_version_string());
	hd = curl_slist_append(hd, auth);
	hd = curl_slist_append(hd, ua);
	hd = curl_slist_append(hd, "Accept: application/json");
	if (body)
		hd = curl_slist_append(hd, "Content-Type: application/json");
	memset(auth, 0, sizeof(auth));
	curl_easy_reset(a->curl);
	curl_easy_setopt(a->curl, CURLOPT_URL, url);
	curl_easy_setopt(a->curl, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(a->curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(a->curl, CURLOPT_POSTFIELDSIZE,
				 (long)strlen(body));
	} else if (!strcmp(method, "GET")) {
		curl_easy_setopt(a->curl, CURLOPT_HTTPGET, 1L);
	}
	curl_easy_setopt(a->curl, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(a->curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(a->curl, CURLOPT_WRITEDATA, b);
	curl_easy_setopt(a->curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(a->curl, CURLOPT_HEADERDATA, b);
	curl_easy_setopt(a->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(a->curl, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
	curl_easy_setopt(a->curl, CURLOPT_TIMEOUT, REQUEST_TIMEOUT_S);
	cc = curl_easy_perform(a->curl);
	/* the header list holds the token: wipe it before freeing */
	for (struct curl_slist *s = hd; s; s = s->next)
		if (!strncmp(s->data, "Authorization:", 14))
			memset(s->data, 0, strlen(s->data));
	curl_slist_free_all(hd);
	if (cc != CURLE_OK) {
		r->http = 0;
		snprintf(r->status, sizeof(r->status), "UNAVAILABLE");
		snprintf(r->msg, sizeof(r->msg), "cannot reach %s: %s", url,
			 b->too_big ? "reply too large" :
				      curl_easy_strerror(cc));
		scrub(a, r->msg);
		return -1;
	}
	curl_easy_getinfo(a->curl, CURLINFO_RESPONSE_CODE, &r->http);
	return 0;
}

int gcp_call(gcp_api *a, char api, const char *method, const char *path,
	     json_t *body, int retry, gcp_reply *r)
{
	char *url, *text = NULL;
	int renewed = 0, rc = -1;
	double backoff = a->backoff_s;

	memset(r, 0, sizeof(*r));
	if (asprintf(&url, "%s%s", api == 'l' ? a->log_base : a->tpu_base,
		     path) < 0)
		cli_jcheck(NULL);
	if (body &&
	    !(text = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		cli_jcheck(NULL);
	for (;;) {
		struct buf b = { .retry_after = -1 };
		double wait;

		r->attempts++;
		gcp_reply_free(r);
		if (ensure_token(a, r->msg, sizeof(r->msg))) {
			snprintf(r->status, sizeof(r->status),
				 "UNAUTHENTICATED");
			break;
		}
		if (attempt(a, method, url, text, &b, r) == 0) {
			r->body = b.p ? json_loads(b.p, 0, NULL) : NULL;
			if (r->http >= 200 && r->http < 300) {
				free(b.p);
				rc = 0;
				break;
			}
			error_reply(a, r, &b);
		}
		free(b.p);
		if (r->http == 401 && !a->token_file && !renewed) {
			renewed = 1; /* a metadata token revoked early */
			drop_token(a);
			continue;
		}
		if (!retry || !retryable(r->http) ||
		    r->attempts >= MAX_ATTEMPTS)
			break;
		wait = b.retry_after >= 0 && b.retry_after <= 3600 ?
			       b.retry_after :
			       backoff * jitter01(a);
		backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S :
							backoff * 2;
		if (gcp_sleep(wait)) {
			snprintf(r->status, sizeof(r->status), "INTERRUPTED");
			break;
		}
	}
	if (rc && r->attempts > 1) {
		size_t n = strlen(r->msg);

		snprintf(r->msg + n, sizeof(r->msg) - n, " (after %d attempts)",
			 r->attempts);
	}
	free(url);
	free(text);
	return rc;
}

/* ------------------------------------------------------------------ */
/* TPU nodes and operations                                           */
/* ------------------------------------------------------------------ */

const char *gcp_node_name(const gcp_api *a, const char *zone, const char *node,
			  char *buf, size_t len)
{
	snprintf(buf, len, "projects/%s/locations/%s/nodes/%s", a->project,
		 zone, node);
	return buf;
}

static char *node_path(const gcp_api *a, const char *zone, const char *node)
{
	char name[768], *p;

	if (asprintf(&p, "v2/%s",
		     gcp_node_name(a, zone, node, name, sizeof(name))) < 0)
		cli_jcheck(NULL);
	return p;
}

int gcp_node_get(gcp_api *a, const char *zone, const char *node, gcp_reply *r)
{
	char *p = node_path(a, zone, node);
	int rc = gcp_call(a, 't', "GET", p, NULL, 1, r);

	free(p);
	return rc;
}

int gcp_node_delete(gcp_api *a, const char *zone, const char *node,
		    gcp_reply *r)
{
	char *p = node_path(a, zone, node);
	/* a repeated delete fails harmlessly (the node is going or gone) */
	int rc = gcp_call(a, 't', "DELETE", p, NULL, 1, r);

	free(p);
	return rc;
}

int gcp_node_create(gcp_api *a, const char *zone, const char *node,
		    json_t *body, const char *request_id, gcp_reply *r)
{
	char *p;
	int rc;

	if (asprintf(&p,
		     "v2/projects/%s/locations/%s/nodes?nodeId=%s"
		     "&requestId=%s",
		     a->project, zone, node, request_id) < 0)
		cli_jcheck(NULL);
	/* the requestId makes a repeated create the same create */
	rc = gcp_call(a, 't', "POST", p, body, 1, r);
	free(p);
	return rc;
}

/* The elapsed time on the progress line (a terminal) or, elsewhere, a
 * line every 30 s. */
static void op_progress(const char *what, double t, int tty, double *said)
{
	if (tty) {
		fprintf(stderr, "\r%s: %.0f s ", what, t);
	} else if (t - *said >= 30) {
		cli_err("%s: still running after %.0f s", what, t);
		*said = t;
	}
}

int gcp_op_wait(gcp_api *a, json_t *op, int64_t deadline_ns, const char *what,
		gcp_reply *r)
{
	json_t *name = json_object_get(op, "name");
	int tty = isatty(2), rc = -1;
	int64_t t0 = cli_now_ns();
	double interval = 0.2, said = 0;
	char *path = NULL;

	memset(r, 0, sizeof(*r));
	r->body = json_incref(op);
	if (!json_is_string(name)) {
		snprintf(r->msg, sizeof(r->msg),
			 "the API returned an operation without a name");
		return -1;
	}
	if (asprintf(&path, "v2/%s", json_string_value(name)) < 0)
		cli_jcheck(NULL);
	if (!tty)
		cli_err("%s: operation %s", what, json_string_value(name));
	for (;;) {
		double t = (double)(cli_now_ns() - t0) / 1e9;
		json_t *err;

		if (json_is_true(json_object_get(r->body, "done"))) {
			err = json_object_get(r->body, "error");
			if (!err) {
				rc = 0;
			} else {
				json_t *c = json_object_get(err, "code");
				json_t *m = json_object_get(err, "message");
				long code =
					json_is_integer(c) ?
						(long)json_integer_value(c) :
						2;

				snprintf(r->status, sizeof(r->status), "%s",
					 gcp_code_name(code));
				snprintf(r->msg, sizeof(r->msg), "%s (%ld): %s",
					 r->status, code,
					 json_is_string(m) ?
						 json_string_value(m) :
						 "(no message)");
				one_line(r->msg);
				rc = 1;
			}
			if (tty)
				fputc('\n', stderr);
			cli_err("%s: %s after %.1f s", what,
				rc ? "failed" : "done", t);
			break;
		}
		if (cli_now_ns() >= deadline_ns || cli_interrupted) {
			if (tty)
				fputc('\n', stderr);
			snprintf(r->status, sizeof(r->status), "%s",
				 cli_interrupted ? "INTERRUPTED" : "DEADLINE");
			snprintf(r->msg, sizeof(r->msg),
				 "operation %s not done after %.0f s (%s)",
				 json_string_value(name), t,
				 cli_interrupted ? "interrupted" :
						   "deadline passed");
			break;
		}
		op_progress(what, t, tty, &said);
		if (gcp_sleep(interval))
			continue; /* reported at the top */
		interval = interval * 1.5 > 5 ? 5 : interval * 1.5;
		{
			gcp_reply p;

			if (gcp_call(a, 't', "GET", path, NULL, 1, &p)) {
				if (tty)
					fputc('\n', stderr);
				gcp_reply_free(r);
				*r = p;
				break;
			}
			gcp_reply_free(r);
			r->body = p.body;
		}
	}
	free(path);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Logging                                                            */
/* ------------------------------------------------------------------ */

int gcp_log_list(gcp_api *a, const char *filter, const char *order,
		 uint64_t max, int retry, gcp_entry_fn fn, void *arg,
		 gcp_reply *r)
{
	char *token = NULL, proj[300];
	uint64_t seen = 0;
	int rc = 0;

	snprintf(proj, sizeof(proj), "projects/%s", a->project);
	do {
		json_t *q = cli_jcheck(json_object()), *e, *next;
		uint64_t page = max && max - seen < 1000 ? max - seen : 1000;
		size_t i;

		cli_jset(q, "resourceNames",
			 cli_jcheck(json_pack("[s]", proj)));
		cli_jset(q, "filter", cli_jstr(filter));
		cli_jset(q, "orderBy", cli_jstr(order));
		cli_jset(q, "pageSize", cli_ju64(page));
		if (token)
			cli_jset(q, "pageToken", cli_jstr(token));
		free(token);
		token = NULL;
		rc = gcp_call(a, 'l', "POST", "v2/entries:list", q, retry, r);
		json_decref(q);
		if (rc)
			break;
		json_array_foreach (json_object_get(r->body, "entries"), i, e) {
			if (max && seen >= max)
				break;
			seen++;
			if ((rc = fn(arg, e)))
				break;
		}
		next = json_object_get(r->body, "nextPageToken");
		if (!rc && json_is_string(next) && *json_string_value(next) &&
		    (!max || seen < max))
			token = xstrdup(json_string_value(next));
		gcp_reply_free(r);
	} while (!rc && token);
	free(token);
	return rc;
}
