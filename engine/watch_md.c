/*
 * watch_md.c - the metadata watcher thread: long-polls on
 * instance/maintenance-event and instance/preempted, a poll of
 * instance/upcoming-maintenance about once a minute, over libcurl's multi
 * interface (one thread, one easy handle per key).
 *
 * Design note. Each key cycles through: a plain GET to learn the value and
 * its ETag, then (long-poll keys) GET ?wait_for_change=true&last_etag=E&
 * timeout_sec=S with an HTTP timeout of S s + http_slack_ms, reissued as
 * soon as it returns. A reply counts only with `Metadata-Flavor: Google`,
 * an ETag and a well-formed body (an upper-case token; for
 * upcoming-maintenance JSON or NONE); anything else (503, reset, timeout,
 * garbage, no flavor) marks the key failing and retries after a
 * jittered, doubling backoff, with a plain GET (so a good reply shows
 * the key OK at once; an unchanged ETag would hold a long-poll). A 404 means the VM does
 * not get that notice: the key is asked again only after
 * absent_recheck_ms. upcoming-maintenance: {}, {"error": ...} and NONE
 * are "nothing scheduled"; a 503 there is "unknown" (the last value is
 * kept, the watcher is not degraded). curl_multi_poll() also waits on the
 * handle's wake eventfd (ckpt_close, SIGTERM), so shutdown never waits for
 * a poll to time out.
 *
 *   server --> curl multi --> finish() --> value changed? --> notice()
 *                                            --> eng_watch_raise (watch.c)
 */
#include <ctype.h>
#include <curl/curl.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "watch_internal.h"

#define BODY_MAX 65536

enum { K_MAINT = 0, K_PREEMPT, K_UPCOMING, K_N };

struct mdkey {
	int idx; /* in info.keys and K_* */
	CURL *easy;
	int active;
	int64_t due; /* monotonic ns of the next request */
	unsigned fails;
	int have_etag;
	char etag[40];
	char value[256];
	char noticed[256]; /* upcoming: the window last reported */
	char url[512];
	/* the reply being received */
	char *body;
	size_t len;
	int flavor;
	char rx_etag[40];
};

struct md {
	struct eng_watch *w;
	CURLM *multi;
	struct curl_slist *hdrs;
	char base[256];
	struct mdkey k[K_N];
	unsigned seed;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
	struct mdkey *k = arg;
	size_t len = sz * n;

	if (k->len + len > BODY_MAX)
		return 0; /* abort: no metadata value is that large */
	memcpy(k->body + k->len, p, len);
	k->len += len;
	return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
	struct mdkey *k = arg;
	size_t len = sz * n, i;

	if (len >= 16 && !strncasecmp(p, "Metadata-Flavor:", 16)) {
		const char *v = p + 16;

		while (*v == ' ')
			v++;
		k->flavor = !strncmp(v, "Google", 6) &&
			    (v[6] == '\r' || v[6] == '\n');
	} else if (len >= 5 && !strncasecmp(p, "ETag:", 5)) {
		const char *v = p + 5;

		while (*v == ' ')
			v++;
		for (i = 0; i + 1 < sizeof(k->rx_etag) && isxdigit(v[i]); i++)
			k->rx_etag[i] = v[i];
		k->rx_etag[i] = 0;
	}
	return len;
}

static void key_state(struct md *m, struct mdkey *k, int state, const char *err)
{
	struct eng_watch *w = m->w;
	ckpt_watch_key *ik = &w->info.keys[k->idx];
	int healthy = 1, i;

	pthread_mutex_lock(&w->mu);
	ik->state = state;
	if (err)
		snprintf(ik->error, sizeof(ik->error), "%s", err);
	if (state == CKPT_WKEY_ERROR)
		ik->errors++;
	if (state == CKPT_WKEY_OK)
		ik->ok_ns = eng_unix_ns();
	for (i = 0; i < K_N; i++)
		if (w->info.keys[i].state == CKPT_WKEY_ERROR)
			healthy = 0;
	if (w->info.healthy && !healthy)
		w->info.degraded++;
	w->info.healthy = healthy;
	pthread_mutex_unlock(&w->mu);
}

static int64_t ms_ns(uint32_t ms)
{
	return (int64_t)ms * 1000000;
}

static void fail(struct md *m, struct mdkey *k, const char *why)
{
	uint64_t d = m->w->o.backoff_min_ms;
	unsigned i;

	for (i = 0; i < k->fails && d < m->w->o.backoff_max_ms; i++)
		d *= 2;
	if (d > m->w->o.backoff_max_ms)
		d = m->w->o.backoff_max_ms;
	k->fails++;
	/* full jitter in [d/2, d] */
	d = d / 2 + (uint64_t)rand_r(&m->seed) % (d / 2 + 1);
	k->due = eng_mono_ns() + ms_ns((uint32_t)d);
	key_state(m, k, CKPT_WKEY_ERROR, why);
}

/* A text value: an upper-case token such as TERMINATE_ON_HOST_MAINTENANCE. */
static int token_ok(const char *s)
{
	size_t i;

	for (i = 0; s[i]; i++)
		if (!isupper((unsigned char)s[i]) && s[i] != '_' &&
		    !isdigit((unsigned char)s[i]))
			return 0;
	return i > 0 && i < 64;
}

/* RFC 3339 (2026-12-03T06:00:00Z, fraction and offset allowed) to unix
 * ns; 0 if it does not parse. */
int64_t eng_rfc3339_ns(const char *s)
{
	struct tm tm;
	int n = 0, oh = 0, om = 0;
	char sign;
	time_t t;

	memset(&tm, 0, sizeof(tm));
	if (!s ||
	    sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon,
		   &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6)
		return 0;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	s += n;
	if (*s == '.')
		while (isdigit((unsigned char)*++s))
			;
	t = timegm(&tm);
	if (*s == 'Z' || *s == 'z')
		return (int64_t)t * 1000000000;
	if (sscanf(s, "%c%2d:%2d", &sign, &oh, &om) != 3 ||
	    (sign != '+' && sign != '-'))
		return 0;
	t -= (sign == '+' ? 1 : -1) * (oh * 3600 + om * 60);
	return (int64_t)t * 1000000000;
}

/* upcoming-maintenance: 0 nothing scheduled, 1 a window (its start in
 * *start, 0 if none given), -1 not a valid document. */
static int upcoming_parse(const char *body, int64_t *start)
{
	json_t *doc, *v;
	int r = -1;

	*start = 0;
	/* NONE, as text or (alt=json) as a JSON string */
	if (!strcmp(body, "NONE") || !strcmp(body, "\"NONE\""))
		return 0;
	doc = json_loads(body, JSON_REJECT_DUPLICATES, NULL);
	if (!doc)
		return -1;
	if (json_is_object(doc)) {
		if (json_object_size(doc) == 0 || json_object_get(doc, "error"))
			r = 0;
		else if (json_object_get(doc, "type") ||
			 json_object_get(doc, "window_start_time")) {
			v = json_object_get(doc, "window_start_time");
			if (!json_is_string(v))
				v = json_object_get(doc,
						    "latest_window_start_time");
			if (json_is_string(v))
				*start = eng_rfc3339_ns(json_string_value(v));
			r = 1;
		}
	}
	json_decref(doc);
	return r;
}

/* A good 200 reply of key k with body `val`: record it, raise notices. */
static void accept_value(struct md *m, struct mdkey *k, const char *val)
{
	struct eng_watch *w = m->w;
	ckpt_watch_key *ik = &w->info.keys[k->idx];
	int changed = !k->have_etag || strcmp(k->value, val) != 0;
	int64_t now = eng_unix_ns(), start, deadline = 0;
	char old[sizeof(k->value)];
	int slot = -1;

	snprintf(old, sizeof(old), "%s", k->have_etag ? k->value : "");
	snprintf(k->value, sizeof(k->value), "%s", val);
	snprintf(k->etag, sizeof(k->etag), "%s", k->rx_etag);
	k->have_etag = 1;
	k->fails = 0;
	pthread_mutex_lock(&w->mu);
	snprintf(ik->value, sizeof(ik->value), "%s", val);
	snprintf(ik->etag, sizeof(ik->etag), "%s", k->rx_etag);
	if (changed) {
		ik->changes++;
		ik->changed_ns = now;
	}
	pthread_mutex_unlock(&w->mu);
	key_state(m, k, CKPT_WKEY_OK, NULL);
	if (!changed)
		return;
	if (k->idx == K_MAINT && strcmp(val, "NONE")) {
		slot = W_MAINT;
		deadline = now + ms_ns(w->o.maintenance_window_ms);
	} else if (k->idx == K_PREEMPT && !strcmp(val, "TRUE")) {
		slot = W_PREEMPT;
		deadline = now + ms_ns(w->o.preempted_window_ms);
	} else if (k->idx == K_UPCOMING && upcoming_parse(val, &start) == 1 &&
		   strcmp(k->noticed, val)) {
		snprintf(k->noticed, sizeof(k->noticed), "%s", val);
		slot = W_UPCOMING;
		deadline = start;
	}
	/* the first value a restarted process sees may be a notice it
	 * already answered before the restart (notice.c) */
	if (slot >= 0 && !old[0] &&
	    eng_watch_answered(w, slot, ik->key, k->etag, now)) {
		eng_watch_log_change(w, ik->key, old, val, k->etag, 0, now, 0);
		return;
	}
	/* queued before the notice is raised, so that its line is ahead of
	 * the line of the save that answers it (a restart looks for both, in
	 * that order); the journal thread pays the fsync, not this one */
	eng_watch_log_change(w, ik->key, old, val, k->etag, slot >= 0, now,
			     deadline);
	if (slot >= 0)
		eng_watch_raise(w, slot, now, deadline, 1);
}

static void finish(struct md *m, struct mdkey *k, CURLcode res)
{
	const struct eng_watch *w = m->w;
	char why[160];
	long code = 0;
	int64_t start;

	k->active = 0;
	curl_multi_remove_handle(m->multi, k->easy);
	curl_easy_getinfo(k->easy, CURLINFO_RESPONSE_CODE, &code);
	k->body[k->len] = 0;
	while (k->len && isspace((unsigned char)k->body[k->len - 1]))
		k->body[--k->len] = 0;
	if (res != CURLE_OK) {
		snprintf(why, sizeof(why), "%s", curl_easy_strerror(res));
		fail(m, k, why);
	} else if (!k->flavor) {
		snprintf(why, sizeof(why),
			 "HTTP %ld without Metadata-Flavor: Google", code);
		fail(m, k, why);
	} else if (code == 404) {
		/* this VM does not get this notice: ask again rarely */
		k->have_etag = 0;
		k->fails = 0;
		k->due = eng_mono_ns() + ms_ns(w->o.absent_recheck_ms);
		key_state(m, k, CKPT_WKEY_ABSENT, "404: not offered here");
	} else if (code == 503 && k->idx == K_UPCOMING) {
		k->due = eng_mono_ns() + ms_ns(w->o.upcoming_interval_ms);
		key_state(m, k, CKPT_WKEY_UNKNOWN, "503: unknown");
	} else if (code != 200) {
		snprintf(why, sizeof(why), "HTTP %ld", code);
		fail(m, k, why);
	} else if (!k->rx_etag[0] || memchr(k->body, 0, k->len) ||
		   (k->idx != K_UPCOMING ?
			    !token_ok(k->body) :
			    upcoming_parse(k->body, &start) < 0)) {
		fail(m, k, "malformed reply (no ETag or not a value)");
	} else {
		accept_value(m, k, k->body);
		k->due = k->idx == K_UPCOMING ?
				 eng_mono_ns() +
					 ms_ns(w->o.upcoming_interval_ms) :
				 0;
	}
}

static void send_req(struct md *m, struct mdkey *k)
{
	const struct eng_watch *w = m->w;
	const char *key = w->info.keys[k->idx].key;
	/* after a failure, a plain GET: a good reply shows OK at once, not
	 * when a long-poll on an unchanged value returns (timeout_sec) */
	int lp = k->idx != K_UPCOMING && k->have_etag && !k->fails;
	long tmo;

	if (k->idx == K_UPCOMING)
		snprintf(k->url, sizeof(k->url), "%s%s?alt=json", m->base, key);
	else if (lp)
		snprintf(
			k->url, sizeof(k->url),
			"%s%s?wait_for_change=true&last_etag=%s&timeout_sec=%u",
			m->base, key, k->etag, w->o.timeout_sec);
	else
		snprintf(k->url, sizeof(k->url), "%s%s", m->base, key);
	tmo = (long)w->o.http_slack_ms +
	      (lp ? (long)w->o.timeout_sec * 1000 : 0);
	k->len = 0;
	k->flavor = 0;
	k->rx_etag[0] = 0;
	curl_easy_setopt(k->easy, CURLOPT_URL, k->url);
	curl_easy_setopt(k->easy, CURLOPT_TIMEOUT_MS, tmo);
	if (curl_multi_add_handle(m->multi, k->easy) != CURLM_OK) {
		fail(m, k, "curl_multi_add_handle failed");
		return;
	}
	k->active = 1;
	pthread_mutex_lock(&m->w->mu);
	m->w->info.keys[k->idx].requests++;
	pthread_mutex_unlock(&m->w->mu);
}

static int md_setup(struct md *m, struct eng_watch *w)
{
	const char *host = getenv("GCE_METADATA_HOST");
	int i;

	memset(m, 0, sizeof(*m));
	m->w = w;
	m->seed = (unsigned)eng_mono_ns() ^ (unsigned)(uintptr_t)w;
	if (!host || !*host)
		host = "metadata.google.internal";
	snprintf(m->base, sizeof(m->base), "http://%s/computeMetadata/v1/",
		 host);
	pthread_mutex_lock(&w->mu);
	snprintf(w->info.host, sizeof(w->info.host), "%s", host);
	pthread_mutex_unlock(&w->mu);
	pthread_once(&curl_once, curl_init_once);
	m->multi = curl_multi_init();
	m->hdrs = curl_slist_append(NULL, "Metadata-Flavor: Google");
	if (!m->multi || !m->hdrs)
		return -1;
	for (i = 0; i < K_N; i++) {
		struct mdkey *k = &m->k[i];

		k->idx = i;
		k->body = malloc(BODY_MAX + 1);
		k->easy = curl_easy_init();
		if (!k->body || !k->easy)
			return -1;
		curl_easy_setopt(k->easy, CURLOPT_HTTPHEADER, m->hdrs);
		curl_easy_setopt(k->easy, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(k->easy, CURLOPT_WRITEDATA, k);
		curl_easy_setopt(k->easy, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(k->easy, CURLOPT_HEADERDATA, k);
		curl_easy_setopt(k->easy, CURLOPT_PRIVATE, k);
		curl_easy_setopt(k->easy, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(k->easy, CURLOPT_NOPROXY, "*");
		curl_easy_setopt(k->easy, CURLOPT_CONNECTTIMEOUT_MS,
				 (long)w->o.http_slack_ms);
		curl_easy_setopt(k->easy, CURLOPT_FOLLOWLOCATION, 0L);
	}
	return 0;
}

static void md_teardown(struct md *m)
{
	int i;

	for (i = 0; i < K_N; i++) {
		if (m->k[i].active)
			curl_multi_remove_handle(m->multi, m->k[i].easy);
		if (m->k[i].easy)
			curl_easy_cleanup(m->k[i].easy);
		free(m->k[i].body);
	}
	if (m->multi)
		curl_multi_cleanup(m->multi);
	curl_slist_free_all(m->hdrs);
}

void *eng_watch_md_main(void *arg)
{
	struct eng_watch *w = arg;
	struct md m;
	int i, running;

	if (md_setup(&m, w) < 0) {
		pthread_mutex_lock(&w->mu);
		w->info.running = 0;
		w->info.healthy = 0;
		pthread_mutex_unlock(&w->mu);
		md_teardown(&m);
		return NULL;
	}
	while (!atomic_load(&w->stop)) {
		struct curl_waitfd wfd = { .fd = w->wake_efd,
					   .events = CURL_WAIT_POLLIN };
		int64_t now = eng_mono_ns(), next;
		struct CURLMsg *msg;
		uint64_t junk;
		int left;

		for (i = 0; i < K_N; i++)
			if (!m.k[i].active && m.k[i].due <= now)
				send_req(&m, &m.k[i]);
		curl_multi_perform(m.multi, &running);
		while ((msg = curl_multi_info_read(m.multi, &left))) {
			struct mdkey *k = NULL;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE,
					  (char **)&k);
			finish(&m, k, msg->data.result);
		}
		/* finish() set new due times: sleep until the first */
		now = eng_mono_ns();
		next = now + 1000000000;
		for (i = 0; i < K_N; i++)
			if (!m.k[i].active && m.k[i].due < next)
				next = m.k[i].due;
		if (next <= now)
			continue;
		next = (next - now + 999999) / 1000000;
		curl_multi_poll(m.multi, &wfd, 1, (int)next, NULL);
		if (wfd.revents && read(w->wake_efd, &junk, sizeof(junk)) > 0)
			eng_watch_sigterm_seen(w);
	}
	md_teardown(&m);
	pthread_mutex_lock(&w->mu);
	w->info.running = 0;
	pthread_mutex_unlock(&w->mu);
	return NULL;
}
