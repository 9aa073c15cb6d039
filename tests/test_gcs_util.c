/*
 * test_gcs_util.c - see test_gcs_util.h. The fake server is a child
 * process started by tu_server_start (testutil.c); the hostile server is
 * a thread with a blocking accept loop, one request per
 * connection (Connection: close), so tests can script every byte.
 */
#include "test_gcs_util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void gt_server_start(tu_server *s, const char *bucket)
{
	gt_server_start_args(s, bucket, NULL);
}

void gt_server_start_args(tu_server *s, const char *bucket,
			  const char *const *extra)
{
	const char *srv = getenv("CKPT_FAKE_GCS");
	const char *args[32] = { "--bucket", bucket };
	int k = 2;

	while (extra && *extra && k < 31)
		args[k++] = *extra++;
	args[k] = NULL;
	tu_server_start(s, srv && *srv ? srv : "fake_gcs.py", args);
}

unsigned char *gt_pattern(size_t n, uint64_t seed)
{
	unsigned char *p = malloc(n ? n : 1);
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	size_t i;

	if (!p)
		abort();
	for (i = 0; i < n; i++) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		p[i] = (unsigned char)((x * 0x2545f4914f6cdd1dull) >> 56);
	}
	return p;
}

static size_t collect(char *p, size_t sz, size_t n, void *arg)
{
	char **out = arg;
	size_t old = *out ? strlen(*out) : 0;
	char *np = realloc(*out, old + sz * n + 1);

	if (!np)
		return 0;
	memcpy(np + old, p, sz * n);
	np[old + sz * n] = 0;
	*out = np;
	return sz * n;
}

long gt_http(const char *method, const char *url, const char *body, char **resp)
{
	CURL *e = curl_easy_init();
	struct curl_slist *h = NULL;
	char *out = NULL;
	long st = -1;

	if (!e)
		return -1;
	h = curl_slist_append(h, "Content-Type: application/json");
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
	if (body) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
	}
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &out);
	if (curl_easy_perform(e) == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
	curl_slist_free_all(h);
	curl_easy_cleanup(e);
	if (resp)
		*resp = out;
	else
		free(out);
	return st;
}

void gt_rule(const char *base, const char *mode, const char *match)
{
	char url[256], body[256];

	snprintf(url, sizeof(url), "%s/_fake/hostile", base);
	snprintf(body, sizeof(body), "{\"mode\": \"%s\", \"match\": \"%s\"}",
		 mode, match);
	ck_assert_int_eq(gt_http("POST", url, body, NULL), 200);
}

long gt_rules_fired(const char *base)
{
	char url[256], *resp = NULL, *p;
	long fired = 0;

	snprintf(url, sizeof(url), "%s/_fake/hostile", base);
	ck_assert_int_eq(gt_http("GET", url, NULL, &resp), 200);
	for (p = resp; p && (p = strstr(p, "\"fired\": ")); p += 9)
		fired += atol(p + 9);
	free(resp);
	return fired;
}

long gt_rules_clear(const char *base)
{
	char url[256];
	long fired = gt_rules_fired(base);

	snprintf(url, sizeof(url), "%s/_fake/hostile", base);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	return fired;
}

const char *gt_retry_test(const char *base, const char *method,
			  const char *const *instr, size_t n)
{
	static char id[128];
	char body[2048], url[256], *resp = NULL;
	json_t *j, *v;
	size_t i, len;
	long st;

	len = (size_t)snprintf(body, sizeof(body),
			       "{\"instructions\": {\"%s\": [", method);
	for (i = 0; i < n; i++)
		len += (size_t)snprintf(body + len, sizeof(body) - len,
					"%s\"%s\"", i ? ", " : "", instr[i]);
	snprintf(body + len, sizeof(body) - len, "]}}");
	snprintf(url, sizeof(url), "%s/retry_test", base);
	st = gt_http("POST", url, body, &resp);
	j = resp ? json_loads(resp, 0, NULL) : NULL;
	v = json_object_get(j, "id");
	if (st != 200 || !json_is_string(v)) {
		fprintf(stderr, "retry_test: HTTP %ld %s\n", st,
			resp ? resp : "");
		json_decref(j);
		free(resp);
		return NULL;
	}
	snprintf(id, sizeof(id), "%s", json_string_value(v));
	json_decref(j);
	free(resp);
	return id;
}

int gt_retry_test_completed(const char *base, const char *id)
{
	char url[256], *resp = NULL;
	long st;
	int rc = -1;

	snprintf(url, sizeof(url), "%s/retry_test/%s", base, id);
	st = gt_http("GET", url, NULL, &resp);
	if (st == 200 && resp) {
		json_t *j = json_loads(resp, 0, NULL);
		json_t *v = json_object_get(j, "completed");

		if (json_is_boolean(v))
			rc = json_is_true(v);
		json_decref(j);
	}
	free(resp);
	return rc;
}

void gt_send(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		if (w <= 0)
			return;
		c += w;
		n -= (size_t)w;
	}
}

static void *hostile_main(void *arg)
{
	struct gt_hostile *h = arg;

	while (!h->stop) {
		char buf[65536], method[16] = "", target[4096] = "";
		size_t len = 0;
		char *end = NULL, *cl;
		long body = 0;
		int fd = accept(h->lfd, NULL, NULL);

		if (fd < 0)
			break;
		if (h->stop) {
			close(fd);
			break;
		}
		while (len < sizeof(buf) - 1) {
			ssize_t r =
				recv(fd, buf + len, sizeof(buf) - 1 - len, 0);

			if (r <= 0)
				break;
			len += (size_t)r;
			buf[len] = 0;
			end = strstr(buf, "\r\n\r\n");
			if (end)
				break;
		}
		if (!end) {
			close(fd);
			continue;
		}
		*end = 0;
		cl = strcasestr(buf, "\r\nContent-Length:");
		if (cl)
			body = strtol(cl + 17, NULL, 10);
		body -= (long)(len - (size_t)(end + 4 - buf));
		while (body > 0) {
			char scratch[4096];
			ssize_t r = recv(fd, scratch, sizeof(scratch), 0);

			if (r <= 0)
				break;
			body -= r;
		}
		sscanf(buf, "%15s %4095s", method, target);
		h->requests++;
		h->fn(h->arg, fd, method, target, buf);
		shutdown(fd, SHUT_RDWR);
		close(fd);
	}
	return NULL;
}

void gt_hostile_start(struct gt_hostile *h, gt_hostile_fn fn, void *arg)
{
	struct sockaddr_in a = { 0 };
	socklen_t al = sizeof(a);
	int one = 1;

	memset(h, 0, sizeof(*h));
	h->fn = fn;
	h->arg = arg;
	h->lfd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(h->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(h->lfd, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(h->lfd, 16) ||
	    getsockname(h->lfd, (struct sockaddr *)&a, &al)) {
		perror("hostile server");
		exit(1);
	}
	h->port = ntohs(a.sin_port);
	snprintf(h->url, sizeof(h->url), "http://127.0.0.1:%d", h->port);
	pthread_create(&h->th, NULL, hostile_main, h);
}

void gt_hostile_stop(struct gt_hostile *h)
{
	h->stop = 1;
	shutdown(h->lfd, SHUT_RDWR);
	close(h->lfd);
	pthread_join(h->th, NULL);
}
