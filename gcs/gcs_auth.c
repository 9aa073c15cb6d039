/* gcs_auth.c - where the JSON API is and which bearer token to send.
 *
 * Order (as Google's tools do it):
 *  1. cfg.endpoint or STORAGE_EMULATOR_HOST ("host:port" or a URL; the
 *     scheme defaults to http): that endpoint, no credentials at all.
 *  2. Endpoint from CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE (gcloud's form,
 *     https://host/storage/v1/: uploads go to the same prefix with
 *     /upload/storage/v1), else https://storage.googleapis.com; token from
 *     the file named by CLOUDSDK_AUTH_ACCESS_TOKEN_FILE (re-read when the
 *     file changes), else the metadata server's service-account token
 *     (GCE_METADATA_HOST overrides metadata.google.internal), cached and
 *     refreshed five minutes before it expires.
 * The token lives only in c->token and in the Authorization header built
 * for each attempt; messages never include it (gcs_http.c also scrubs it
 * from anything a server echoes back). The metadata request is blocking;
 * it happens about once an hour.
 */
#include "gcs_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static char *trim_slashes(const char *s)
{
	char *d = strdup(s);
	size_t n;

	if (!d)
		return NULL;
	n = strlen(d);
	while (n && d[n - 1] == '/')
		d[--n] = 0;
	return d;
}

/* origin = scheme://host[:port] of a URL */
static char *url_origin(const char *url)
{
	const char *p = strstr(url, "://");
	const char *slash = p ? strchr(p + 3, '/') : NULL;

	if (!p)
		return NULL;
	return slash ? strndup(url, (size_t)(slash - url)) : strdup(url);
}

static int set_endpoint(struct gcs_client *c, const char *value, int gcloud)
{
	char *v = trim_slashes(value), *prefix, *cut;

	if (!v)
		return -ENOMEM;
	if (!strstr(v, "://")) {
		char *w = gcs_printf("http://%s", v);

		free(v);
		if (!w)
			return -ENOMEM;
		v = w;
	}
	prefix = v;
	/* gcloud's override names the JSON API root itself */
	cut = gcloud ? strstr(v, "/storage/v1") : NULL;
	if (cut && cut[strlen("/storage/v1")] == 0)
		*cut = 0;
	c->base = prefix;
	c->api = gcs_printf("%s/storage/v1", prefix);
	c->upload = gcs_printf("%s/upload/storage/v1", prefix);
	c->origin = url_origin(prefix);
	if (!c->api || !c->upload || !c->origin)
		return -ENOMEM;
	return 0;
}

int gcs_auth_setup(struct gcs_client *c)
{
	const char *emu = getenv("STORAGE_EMULATOR_HOST");
	const char *ovr = getenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE");
	const char *tf = getenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE");
	const char *md = getenv("GCE_METADATA_HOST");

	if (c->cfg.endpoint || (emu && *emu)) {
		c->anonymous = 1;
		return set_endpoint(c, c->cfg.endpoint ? c->cfg.endpoint : emu,
				    0);
	}
	if (set_endpoint(
		    c, ovr && *ovr ? ovr : "https://storage.googleapis.com", 1))
		return -ENOMEM;
	if (tf && *tf) {
		c->token_file = strdup(tf);
		return c->token_file ? 0 : -ENOMEM;
	}
	c->md_url = gcs_printf("http://%s/computeMetadata/v1/instance/"
			       "service-accounts/default/token",
			       md && *md ? md : "metadata.google.internal");
	return c->md_url ? 0 : -ENOMEM;
}

void gcs_auth_free(struct gcs_client *c)
{
	if (c->token) {
		memset(c->token, 0, strlen(c->token));
		free(c->token);
	}
	free(c->token_file);
	free(c->md_url);
	free(c->base);
	free(c->api);
	free(c->upload);
	free(c->origin);
}

static void set_token(struct gcs_client *c, char *tok)
{
	if (c->token) {
		memset(c->token, 0, strlen(c->token));
		free(c->token);
	}
	c->token = tok;
}

static int token_ok(const char *t)
{
	size_t i;

	/* bearer tokens are printable ASCII with no spaces */
	for (i = 0; t[i]; i++)
		if ((unsigned char)t[i] <= ' ' || (unsigned char)t[i] >= 127)
			return 0;
	return i > 0;
}

static int read_token_file(struct gcs_client *c, char *err, size_t errlen)
{
	static const size_t max = 16384;
	struct stat st = { 0 };
	char *buf;
	FILE *f;
	size_t n;

	if (stat(c->token_file, &st) == 0 && c->token &&
	    c->token_expiry == (double)st.st_mtim.tv_sec * 1e9 +
				       (double)st.st_mtim.tv_nsec)
		return 0;
	f = fopen(c->token_file, "r");
	if (!f) {
		int e = errno;

		snprintf(err, errlen, "cannot read access token file %s: %s",
			 c->token_file, strerror(e));
		return -e;
	}
	buf = calloc(1, max + 1);
	n = buf ? fread(buf, 1, max, f) : 0;
	fclose(f);
	if (!buf)
		return -ENOMEM;
	while (n &&
	       (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
		buf[--n] = 0;
	if (!token_ok(buf)) {
		memset(buf, 0, max);
		free(buf);
		snprintf(err, errlen, "access token file %s holds no token",
			 c->token_file);
		return -EACCES;
	}
	set_token(c, buf);
	c->token_expiry = (double)st.st_mtim.tv_sec * 1e9 +
			  (double)st.st_mtim.tv_nsec; /* the mtime seen */
	return 0;
}

struct md_reply {
	struct gcs_buf body;
	int flavor;
};

static size_t md_write(char *p, size_t s, size_t n, void *arg)
{
	struct md_reply *m = arg;

	if (m->body.len + s * n > 65536)
		return 0;
	return gcs_buf_add(&m->body, p, s * n) ? 0 : s * n;
}

static size_t md_header(char *p, size_t s, size_t n, void *arg)
{
	struct md_reply *m = arg;
	size_t len = s * n;

	if (len >= 22 && strncasecmp(p, "Metadata-Flavor:", 16) == 0) {
		const char *v = p + 16;

		while (*v == ' ')
			v++;
		if (strncmp(v, "Google", 6) == 0)
			m->flavor = 1;
	}
	return len;
}

static int fetch_md_token(struct gcs_client *c, char *err, size_t errlen)
{
	struct curl_slist *h =
		curl_slist_append(NULL, "Metadata-Flavor: Google");
	int attempt, rc = -EACCES;

	for (attempt = 0; attempt < 5; attempt++) {
		struct md_reply m = { { 0 }, 0 };
		CURL *e = curl_easy_init();
		CURLcode cc;
		long st = 0;

		if (!e || !h) {
			curl_easy_cleanup(e);
			rc = -ENOMEM;
			break;
		}
		curl_easy_setopt(e, CURLOPT_URL, c->md_url);
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_PROXY, "");
		curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, md_write);
		curl_easy_setopt(e, CURLOPT_WRITEDATA, &m);
		curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, md_header);
		curl_easy_setopt(e, CURLOPT_HEADERDATA, &m);
		cc = curl_easy_perform(e);
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
		curl_easy_cleanup(e);
		if (cc == CURLE_OK && st == 200 && m.flavor) {
			json_t *j = json_loadb(m.body.p ? m.body.p : "",
					       m.body.len, 0, NULL);
			json_t *t = json_object_get(j, "access_token");
			json_t *x = json_object_get(j, "expires_in");

			if (json_is_string(t) &&
			    token_ok(json_string_value(t))) {
				double life = 300.0;

				if (json_is_integer(x))
					life = (double)json_integer_value(x);
				set_token(c, strdup(json_string_value(t)));
				c->token_expiry = gcs_now() + life;
				/* five minutes early, or at half-life */
				c->token_margin = life > 600 ? 300 : life / 2;
				rc = c->token ? 0 : -ENOMEM;
			} else {
				snprintf(err, errlen,
					 "metadata server token reply has no "
					 "access_token");
				rc = -EACCES;
			}
			json_decref(j);
			if (m.body.p)
				memset(m.body.p, 0, m.body.len);
			free(m.body.p);
			break;
		}
		free(m.body.p);
		if (cc == CURLE_OK && st == 200)
			snprintf(err, errlen,
				 "metadata server reply lacks Metadata-Flavor: "
				 "Google");
		else if (cc == CURLE_OK)
			snprintf(err, errlen, "metadata server token: HTTP %ld",
				 st);
		else
			snprintf(err, errlen, "metadata server token: %s",
				 curl_easy_strerror(cc));
		/* only 503 (maintenance) and connection trouble are retried */
		if (cc == CURLE_OK && st != 503)
			break;
		usleep(200000u << attempt);
	}
	curl_slist_free_all(h);
	return rc;
}

int gcs_auth_header(struct gcs_client *c, char **hdr, char *err, size_t errlen)
{
	int rc = 0;

	*hdr = NULL;
	if (c->anonymous)
		return 0;
	if (c->token_file)
		rc = read_token_file(c, err, errlen);
	else if (!c->token || gcs_now() > c->token_expiry - c->token_margin)
		rc = fetch_md_token(c, err, errlen);
	if (rc)
		return rc;
	*hdr = gcs_printf("Authorization: Bearer %s", c->token);
	return *hdr ? 0 : -ENOMEM;
}
