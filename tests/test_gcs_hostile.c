/*
 * test_gcs_hostile.c - the Cloud Storage client (gcs/) against servers
 * that lie, scripted byte by byte in a thread (test_gcs_util.c): a wrong
 * crc32c, a truncated body, a 200 with garbage JSON, a session URI on
 * another host, a listing that never ends, sessions that never keep a
 * byte, a create whose reply was lost; and auth: the token from
 * CLOUDSDK_AUTH_ACCESS_TOKEN_FILE and from a metadata server (cached,
 * refreshed, its reply trusted only with Metadata-Flavor: Google), never
 * in a message even when the server echoes it. Needs no Python.
 */
#include "test_gcs_util.h"
#include "testutil.h"

#include "gcs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUCKET "ckpt-test"

/* ---- hostile servers ---- */

enum hmode {
	H_BAD_CRC,
	H_TRUNCATED,
	H_GARBAGE,
	H_LOCATION,
	H_ENDLESS,
	H_SAME_TOKEN,
	H_ECHO_AUTH,
	H_METADATA,
	H_METADATA_NOFLAVOR,
	H_LOST_REPLY,
	H_SPLIT_HASH,
	H_NO_PROGRESS,
	H_CHUNK_503,
};

struct hstate {
	enum hmode mode;
	int page;
	char auth[512];
};

static void reply(int fd, const char *status, const char *extra,
		  const char *body)
{
	char head[1024];

	snprintf(head, sizeof(head),
		 "HTTP/1.1 %s\r\nConnection: close\r\nContent-Length: %zu\r\n"
		 "%s\r\n",
		 status, strlen(body), extra);
	gt_send(fd, head, strlen(head));
	gt_send(fd, body, strlen(body));
}

static void hostile(void *arg, int fd, const char *method, const char *target,
		    const char *headers)
{
	struct hstate *h = arg;
	const char *a = strcasestr(headers, "\r\nAuthorization: ");
	char body[1024];

	if (h->mode != H_LOST_REPLY && a && strstr(target, "/storage/v1/"))
		sscanf(a + 2, "%511[^\r]", h->auth);
	switch (h->mode) {
	case H_BAD_CRC:
		reply(fd, "200 OK",
		      "x-goog-hash: crc32c=AAAAAA==,md5=xxxx\r\n"
		      "x-goog-generation: 5\r\n",
		      "hello world");
		break;
	case H_TRUNCATED: {
		/* honours Range, but never sends more than 5 bytes */
		const char *r = strcasestr(headers, "\r\nRange: bytes=");
		long from = r ? strtol(r + 15, NULL, 10) : 0;
		char head[400];

		if (r)
			snprintf(head, sizeof(head),
				 "HTTP/1.1 206 Partial Content\r\n"
				 "Content-Length: %ld\r\nContent-Range: bytes "
				 "%ld-99999/100000\r\nx-goog-hash: "
				 "crc32c=yZRlqg==\r\n\r\nhello",
				 100000 - from, from);
		else
			snprintf(head, sizeof(head),
				 "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n"
				 "x-goog-hash: crc32c=yZRlqg==\r\n\r\nhello");
		gt_send(fd, head, strlen(head));
		break;
	}
	case H_GARBAGE:
		reply(fd, "200 OK", "Content-Type: application/json\r\n",
		      "{\"name\": \"x\", \"generation\": ");
		break;
	case H_LOCATION:
		reply(fd, "200 OK",
		      "Location: http://127.0.0.2:9/upload/storage/v1/b/x/o"
		      "?upload_id=evil\r\n",
		      "");
		break;
	case H_ENDLESS:
	case H_SAME_TOKEN:
		snprintf(body, sizeof(body),
			 "{\"items\": [], \"nextPageToken\": \"t%d\"}",
			 h->mode == H_ENDLESS ? h->page++ : 1);
		reply(fd, "200 OK", "", body);
		break;
	case H_ECHO_AUTH:
		snprintf(body, sizeof(body),
			 "{\"error\": {\"code\": 403, \"message\": \"denied "
			 "for %s\"}}",
			 h->auth);
		reply(fd, "403 Forbidden", "", body);
		break;
	case H_NO_PROGRESS:
	case H_CHUNK_503:
		/* a session on this server that never keeps a byte: 308, or
		 * 503 to pieces and 308 to status queries */
		if (strcmp(method, "POST") == 0) {
			snprintf(
				body, sizeof(body),
				"Location: http://127.0.0.1:%d/upload/s?id=1\r\n",
				h->page);
			reply(fd, "200 OK", body, "");
		} else if (h->mode == H_CHUNK_503 &&
			   !strstr(headers, "Content-Range: bytes */*")) {
			reply(fd, "503 Service Unavailable", "", "{}");
		} else {
			reply(fd, "308 Resume Incomplete", "", "");
		}
		break;
	case H_SPLIT_HASH:
		reply(fd, "200 OK",
		      "x-goog-hash: md5=XrY7u+Ae7tCTyyK7j1rNww==\r\n"
		      "x-goog-hash: crc32c=yZRlqg==\r\n",
		      "hello world");
		break;
	case H_LOST_REPLY:
		/* the first insert "fails" (its object is stored all the
		 * same), the retry meets the object: 412 */
		if (strcmp(method, "POST") == 0 && h->page++ == 0)
			reply(fd, "503 Service Unavailable", "", "{}");
		else if (strcmp(method, "POST") == 0)
			reply(fd, "412 Precondition Failed", "",
			      "{\"error\": {\"code\": 412, \"message\": "
			      "\"conditionNotMet\"}}");
		else
			reply(fd, "200 OK", "", h->auth);
		break;
	case H_METADATA:
	case H_METADATA_NOFLAVOR:
		if (strstr(target, "/computeMetadata/v1/instance/"
				   "service-accounts/default/token")) {
			/* page counts fetches; a short life if page < 0 */
			snprintf(body, sizeof(body),
				 "{\"access_token\": \"md-SECRET-42\", "
				 "\"expires_in\": %d, \"token_type\": "
				 "\"Bearer\"}",
				 h->page < 0 ? 0 : 3599);
			h->page += h->page < 0 ? -1 : 1;
			reply(fd, "200 OK",
			      h->mode == H_METADATA ?
				      "Metadata-Flavor: Google\r\n" :
				      "",
			      body);
		} else
			reply(fd, "404 Not Found", "",
			      "{\"error\": {\"code\": 404, \"message\": "
			      "\"No such object\"}}");
		break;
	}
}

static struct gcs_client *hostile_client(struct gt_hostile *hs)
{
	struct gcs_config cfg = { 0 };
	struct gcs_client *c;

	cfg.endpoint = hs->url;
	cfg.initial_backoff_s = 0.001;
	cfg.max_backoff_s = 0.01;
	cfg.deadline_s = 60;
	cfg.max_attempts = 3;
	cfg.max_list_pages = 50;
	ck_assert_int_eq(gcs_client_new(&c, &cfg), 0);
	return c;
}

START_TEST(hostile_replies)
{
	struct hstate h = { 0 };
	struct gt_hostile hs;
	struct gcs_client *c;
	struct gcs_upload *u;
	struct gcs_object o;
	struct gcs_list l;
	void *data;
	size_t len;
	int before;
	char crc[9];

	gt_hostile_start(&hs, hostile, &h);
	c = hostile_client(&hs);
	h.mode = H_BAD_CRC;
	ck_assert_int_eq(gcs_get(c, BUCKET, "h/obj", 0, &data, &len, NULL),
			 GCS_E_CHECKSUM);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "h/obj"));
	h.mode = H_SPLIT_HASH; /* two x-goog-hash headers */
	ck_assert_int_eq(gcs_get(c, BUCKET, "h/obj", 0, &data, &len, NULL), 0);
	ck_assert_uint_eq(len, 11);
	ck_assert_mem_eq(data, "hello world", 11);
	free(data);
	h.mode = H_TRUNCATED;
	ck_assert_int_eq(gcs_get(c, BUCKET, "h/obj", 0, &data, &len, NULL),
			 GCS_E_TRANSPORT);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "h/obj"));
	h.mode = H_GARBAGE;
	ck_assert_int_eq(gcs_stat(c, BUCKET, "h/obj", &o), GCS_E_PROTOCOL);
	h.mode = H_LOCATION;
	ck_assert_int_eq(gcs_upload_start(c, BUCKET, "h/obj", NULL, &u), 0);
	ck_assert_int_eq(gcs_upload_append(u, "abc", 3, NULL, NULL), 0);
	ck_assert_int_eq(gcs_upload_finish(u, NULL), 0);
	before = hs.requests;
	ck_assert_int_eq(gcs_op_wait(gcs_upload_op(u)), GCS_E_PROTOCOL);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "another host"));
	ck_assert_int_le(hs.requests, before + 1);
	gcs_upload_free(u);
	h.mode = H_NO_PROGRESS;
	h.page = hs.port;
	ck_assert_int_eq(gcs_upload_start(c, BUCKET, "h/np", NULL, &u), 0);
	ck_assert_int_eq(gcs_upload_append(u, "abc", 3, NULL, NULL), 0);
	ck_assert_int_eq(gcs_upload_finish(u, NULL), 0);
	ck_assert_int_eq(gcs_op_wait(gcs_upload_op(u)), GCS_E_PROTOCOL);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "keeps none"));
	gcs_upload_free(u);
	h.mode = H_CHUNK_503;
	ck_assert_int_eq(gcs_upload_start(c, BUCKET, "h/np", NULL, &u), 0);
	ck_assert_int_eq(gcs_upload_append(u, "abc", 3, NULL, NULL), 0);
	ck_assert_int_eq(gcs_upload_finish(u, NULL), 0);
	ck_assert_int_eq(gcs_op_wait(gcs_upload_op(u)), GCS_E_HTTP);
	ck_assert_msg(strstr(gcs_errmsg(c), "after 3 attempts"), "%s",
		      gcs_errmsg(c));
	gcs_upload_free(u);
	h.page = 0;
	h.mode = H_ENDLESS;
	ck_assert_int_eq(gcs_list(c, BUCKET, "", NULL, &l), GCS_E_PROTOCOL);
	ck_assert_int_eq(h.page, 50);
	h.mode = H_SAME_TOKEN;
	ck_assert_int_eq(gcs_list(c, BUCKET, "", NULL, &l), GCS_E_PROTOCOL);
	/* create-only, reply lost, retry gets 412: ours if size and crc32c
	 * match (h.auth holds the object resource served to the stat) */
	h.mode = H_LOST_REPLY;
	h.page = 0;
	gcs_crc32c_b64(gcs_crc32c(0, "x", 1), crc);
	snprintf(h.auth, sizeof(h.auth),
		 "{\"name\": \"h/c\", \"generation\": \"7\", "
		 "\"size\": \"1\", \"crc32c\": \"%s\"}",
		 crc);
	ck_assert_int_eq(gcs_put(c, BUCKET, "h/c", "x", 1, GCS_CREATE_ONLY, &o),
			 0);
	ck_assert_int_eq(o.generation, 7);
	gcs_object_clear(&o);
	h.page = 0;
	ck_assert_int_eq(gcs_put(c, BUCKET, "h/c", "y", 1, GCS_CREATE_ONLY, &o),
			 GCS_E_PRECONDITION);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "412"));
	/* without a retry, 412 is 412 */
	h.page = 1;
	ck_assert_int_eq(gcs_put(c, BUCKET, "h/c", "x", 1, GCS_CREATE_ONLY, &o),
			 GCS_E_PRECONDITION);
	/* too big for the caller's limit */
	h.mode = H_BAD_CRC;
	ck_assert_int_eq(gcs_get(c, BUCKET, "h/obj", 4, &data, &len, NULL),
			 -EFBIG);
	gcs_client_free(c);
	gt_hostile_stop(&hs);
}
END_TEST

/* ---- auth ---- */

START_TEST(auth_token_file)
{
	static const char secret[] = "ya29.SECRET-token-do-not-print";
	struct hstate h = { H_ECHO_AUTH, 0, "" };
	struct gt_hostile hs;
	struct gcs_client *c;
	char *path = tu_path("%s/token", tu_tmpdir()), *ep;
	FILE *f = fopen(path, "w");
	struct gcs_object o;

	fprintf(f, "%s\n", secret);
	fclose(f);
	gt_hostile_start(&hs, hostile, &h);
	ep = tu_path("%s/storage/v1/", hs.url);
	unsetenv("STORAGE_EMULATOR_HOST");
	setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", ep, 1);
	setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", path, 1);
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "a/b", &o), -EACCES);
	ck_assert_str_eq(h.auth, "Authorization: Bearer ya29.SECRET-token-do-"
				 "not-print");
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "gs://" BUCKET "/a/b"));
	ck_assert_ptr_null(strstr(gcs_errmsg(c), "SECRET"));
	gcs_client_free(c);
	/* a missing token file is an error naming the file, not a crash */
	setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "/nonexistent/tok", 1);
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "a/b", &o), -ENOENT);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "/nonexistent/tok"));
	gcs_client_free(c);
	gt_hostile_stop(&hs);
	free(ep);
	free(path);
}
END_TEST

START_TEST(auth_metadata_server)
{
	struct hstate h = { H_METADATA, 0, "" };
	struct gt_hostile hs;
	struct gcs_client *c;
	char *ep, host[64];
	struct gcs_object o;

	gt_hostile_start(&hs, hostile, &h);
	ep = tu_path("%s/storage/v1", hs.url);
	snprintf(host, sizeof(host), "127.0.0.1:%d", hs.port);
	unsetenv("STORAGE_EMULATOR_HOST");
	unsetenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE");
	setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", ep, 1);
	setenv("GCE_METADATA_HOST", host, 1);
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "m/x", &o), -ENOENT);
	ck_assert_str_eq(h.auth, "Authorization: Bearer md-SECRET-42");
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "No such object"));
	ck_assert_ptr_null(strstr(gcs_errmsg(c), "SECRET"));
	/* cached: a second call does not fetch again */
	h.auth[0] = 0;
	ck_assert_int_eq(gcs_stat(c, BUCKET, "m/x", &o), -ENOENT);
	ck_assert_str_eq(h.auth, "Authorization: Bearer md-SECRET-42");
	ck_assert_int_eq(h.page, 1);
	gcs_client_free(c);
	/* a token that expires at once is fetched again for each request */
	h.page = -1;
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "m/x", &o), -ENOENT);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "m/x", &o), -ENOENT);
	ck_assert_int_eq(h.page, -3);
	gcs_client_free(c);
	/* a reply without Metadata-Flavor: Google is not trusted */
	h.mode = H_METADATA_NOFLAVOR;
	h.auth[0] = 0;
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "m/x", &o), -EACCES);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "Metadata-Flavor"));
	ck_assert_str_eq(h.auth, "");
	gcs_client_free(c);
	gt_hostile_stop(&hs);
	free(ep);
}
END_TEST

static Suite *hostile_suite(void)
{
	Suite *s = suite_create("gcs_hostile");
	TCase *tc = tu_tcase("hostile", 120);

	tcase_add_test(tc, hostile_replies);
	tcase_add_test(tc, auth_token_file);
	tcase_add_test(tc, auth_metadata_server);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main(hostile_suite());
}
