/*
 * test_gcs_client.c - the Cloud Storage client (gcs/) against the loopback
 * fake server (tests/servers/fake_gcs.py, started once by main) and against
 * hand-written hostile servers (test_gcs_util.c).
 *
 * What is checked: every call (put, get, read, stat, list with pages and
 * prefixes, compose, delete), preconditions and their 412 code, resumable
 * uploads fed segment by segment (buffers released only once confirmed),
 * resumed after faults injected through the retry-test interface and after
 * a "restart" from a saved session URI, downloads resumed after broken
 * streams, the retry rules for non-idempotent calls, crc32c on both ways,
 * many transfers at once, a soak with random faults, the emulator
 * variable. Hostile servers and auth: test_gcs_hostile.c. Backoff is
 * compressed (1 ms initial) so retries cost nothing; no test times itself.
 */
#include "test_gcs_util.h"
#include "testutil.h"

#include "gcs.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUCKET "ckpt-test"

static tu_server srv;

static struct gcs_config fast_cfg(void)
{
	struct gcs_config cfg = { 0 };

	cfg.initial_backoff_s = 0.001;
	cfg.max_backoff_s = 0.01;
	cfg.deadline_s = 60;
	cfg.chunk_bytes = GCS_PIECE;
	cfg.streams = 8;
	return cfg;
}

static struct gcs_client *client_with(struct gcs_config cfg)
{
	struct gcs_client *c;

	if (!cfg.endpoint)
		cfg.endpoint = srv.url;
	ck_assert_int_eq(gcs_client_new(&c, &cfg), 0);
	return c;
}

static struct gcs_client *client(void)
{
	return client_with(fast_cfg());
}

static void check_object(struct gcs_client *c, const char *name,
			 const unsigned char *want, size_t n)
{
	void *data;
	size_t len;
	struct gcs_object o;

	ck_assert_msg(gcs_get(c, BUCKET, name, 0, &data, &len, &o) == 0, "%s",
		      gcs_errmsg(c));
	ck_assert_uint_eq(len, n);
	ck_assert_msg(memcmp(data, want, n) == 0, "bytes of %s differ", name);
	ck_assert_uint_eq(o.crc32c, gcs_crc32c(0, want, n));
	free(data);
	gcs_object_clear(&o);
}

/* ---- crc32c ---- */

START_TEST(crc_vectors)
{
	static const char fox[] = "The quick brown fox jumps over the lazy dog";
	unsigned char *d = gt_pattern(100000, 7);
	char b64[9];
	uint32_t crc, whole;
	size_t cut;

	gcs_crc32c_b64(gcs_crc32c(0, "", 0), b64);
	ck_assert_str_eq(b64, "AAAAAA==");
	ck_assert_uint_eq(gcs_crc32c(0, fox, strlen(fox)), 0x22620404);
	gcs_crc32c_b64(0x22620404, b64);
	ck_assert_str_eq(b64, "ImIEBA==");
	gcs_crc32c_b64(gcs_crc32c(0, "hello world", 11), b64);
	ck_assert_str_eq(b64, "yZRlqg==");
	ck_assert_int_eq(gcs_crc32c_from_b64("yZRlqg==", 8, &crc), 0);
	ck_assert_uint_eq(crc, gcs_crc32c(0, "hello world", 11));
	ck_assert_int_ne(gcs_crc32c_from_b64("yZRlqg=", 7, &crc), 0);
	ck_assert_int_ne(gcs_crc32c_from_b64("yZR!qg==", 8, &crc), 0);
	ck_assert_int_ne(gcs_crc32c_from_b64("yZRlqh==", 8, &crc), 0);
	whole = gcs_crc32c(0, d, 100000);
	for (cut = 0; cut <= 100000; cut += 9999) {
		uint32_t a = gcs_crc32c(0, d, cut);
		uint32_t b = gcs_crc32c(0, d + cut, 100000 - cut);

		ck_assert_uint_eq(gcs_crc32c(a, d + cut, 100000 - cut), whole);
		ck_assert_uint_eq(gcs_crc32c_combine(a, b, 100000 - cut),
				  whole);
	}
	free(d);
}
END_TEST

/* ---- one-shot calls ---- */

START_TEST(put_get_stat_delete)
{
	struct gcs_client *c = client();
	unsigned char *d = gt_pattern(300000, 1), buf[1000];
	struct gcs_object o, s;
	size_t got;

	ck_assert_msg(gcs_put(c, BUCKET, "pgsd/a b+c", d, 300000, GCS_NO_COND,
			      &o) == 0,
		      "%s", gcs_errmsg(c));
	ck_assert_str_eq(o.name, "pgsd/a b+c");
	ck_assert_uint_eq(o.size, 300000);
	ck_assert_uint_eq(o.crc32c, gcs_crc32c(0, d, 300000));
	ck_assert_int_eq(gcs_stat(c, BUCKET, "pgsd/a b+c", &s), 0);
	ck_assert_int_eq(s.generation, o.generation);
	ck_assert_uint_eq(s.size, 300000);
	check_object(c, "pgsd/a b+c", d, 300000);
	/* ranges: inside, across the end, past the end */
	ck_assert_int_eq(
		gcs_read(c, BUCKET, "pgsd/a b+c", 12345, 1000, buf, &got), 0);
	ck_assert_uint_eq(got, 1000);
	ck_assert_mem_eq(buf, d + 12345, 1000);
	ck_assert_int_eq(
		gcs_read(c, BUCKET, "pgsd/a b+c", 299500, 1000, buf, &got), 0);
	ck_assert_uint_eq(got, 500);
	ck_assert_mem_eq(buf, d + 299500, 500);
	ck_assert_int_eq(gcs_read(c, BUCKET, "pgsd/a b+c", 400000, 10, buf,
				  &got),
			 -ERANGE);
	/* delete with the wrong generation: 412; right one: gone */
	ck_assert_int_eq(gcs_delete(c, BUCKET, "pgsd/a b+c", 0,
				    (struct gcs_cond){ o.generation + 1, -1 }),
			 GCS_E_PRECONDITION);
	ck_assert_int_eq(gcs_delete(c, BUCKET, "pgsd/a b+c", o.generation,
				    GCS_NO_COND),
			 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "pgsd/a b+c", &s), -ENOENT);
	ck_assert_ptr_nonnull(
		strstr(gcs_errmsg(c), "gs://" BUCKET "/pgsd/a b+c"));
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "HTTP 404"));
	ck_assert_int_eq(gcs_delete(c, BUCKET, "pgsd/a b+c", 0, GCS_NO_COND),
			 -ENOENT);
	gcs_object_clear(&o);
	gcs_object_clear(&s);
	free(d);
	gcs_client_free(c);
}
END_TEST

START_TEST(create_only_and_replace)
{
	struct gcs_client *c = client();
	struct gcs_object o1, o2;

	ck_assert_int_eq(gcs_put(c, BUCKET, "co/latest", "1", 1,
				 GCS_CREATE_ONLY, &o1),
			 0);
	ck_assert_int_eq(gcs_put(c, BUCKET, "co/latest", "2", 1,
				 GCS_CREATE_ONLY, NULL),
			 GCS_E_PRECONDITION);
	ck_assert_ptr_nonnull(strstr(gcs_errmsg(c), "412"));
	/* replace under the generation seen: once, not twice */
	ck_assert_int_eq(gcs_put(c, BUCKET, "co/latest", "3", 1,
				 (struct gcs_cond){ o1.generation, -1 }, &o2),
			 0);
	ck_assert_int_eq(gcs_put(c, BUCKET, "co/latest", "4", 1,
				 (struct gcs_cond){ o1.generation, -1 }, NULL),
			 GCS_E_PRECONDITION);
	ck_assert_int_eq(gcs_put(c, BUCKET, "co/latest", "5", 1,
				 (struct gcs_cond){ -1, o2.metageneration + 7 },
				 NULL),
			 GCS_E_PRECONDITION);
	check_object(c, "co/latest", (const unsigned char *)"3", 1);
	gcs_object_clear(&o1);
	gcs_object_clear(&o2);
	gcs_client_free(c);
}
END_TEST

/* A create whose reply is lost after the server stored it (fake_gcs's
 * lost-reply rule: store, then reset) is ours when sent again: by the
 * client on a fresh connection, or by curl itself when the connection
 * was a reused one (no retry of ours counted then). */
static void lose_reply(const char *name)
{
	char url[128], body[256];

	snprintf(url, sizeof(url), "%s/_fake/lost_reply", srv.url);
	snprintf(body, sizeof(body),
		 "{\"bucket\":\"%s\",\"name\":\"%s\",\"times\":1}", BUCKET,
		 name);
	ck_assert_int_eq(gt_http("POST", url, body, NULL), 200);
}

START_TEST(create_lost_reply)
{
	static const char *const names[] = { "lr/fresh", "lr/reused" };
	char url[128], *resp = NULL;
	json_t *j;

	for (int reuse = 0; reuse < 2; reuse++) {
		struct gcs_client *c = client();
		struct gcs_object o;

		if (reuse) /* leaves a connection in curl's cache */
			ck_assert_int_eq(gcs_stat(c, BUCKET, names[reuse], &o),
					 -ENOENT);
		lose_reply(names[reuse]);
		ck_assert_msg(gcs_put(c, BUCKET, names[reuse], "ours", 4,
				      GCS_CREATE_ONLY, NULL) == 0,
			      "%s: %s", names[reuse], gcs_errmsg(c));
		/* somebody else's bytes: the 412 stands */
		ck_assert_int_eq(gcs_put(c, BUCKET, names[reuse], "them", 4,
					 GCS_CREATE_ONLY, NULL),
				 GCS_E_PRECONDITION);
		check_object(c, names[reuse], (const unsigned char *)"ours", 4);
		gcs_client_free(c);
	}
	/* both rules fired: the object was stored, the reply dropped */
	snprintf(url, sizeof(url), "%s/_fake/lost_reply", srv.url);
	ck_assert_int_eq(gt_http("GET", url, NULL, &resp), 200);
	j = json_loads(resp, 0, NULL);
	ck_assert_ptr_nonnull(j);
	for (size_t i = 0; i < 2; i++) {
		json_t *rule = json_array_get(json_object_get(j, "rules"), i);

		ck_assert_int_eq(json_integer_value(
					 json_object_get(rule, "fired")),
				 1);
	}
	json_decref(j);
	free(resp);
}
END_TEST

/* ---- resumable uploads ---- */

struct rel {
	int released;
	uint64_t persisted_at_release_ok;
};

static void count_release(void *arg)
{
	((struct rel *)arg)->released++;
}

/* Streams data in odd-sized segments; checks nothing is released before
 * the server confirmed it (released segments lie below persisted). */
static int stream_upload(struct gcs_client *c, const char *name,
			 const unsigned char *d, size_t n,
			 const struct gcs_upload_opts *opts, struct rel *rel)
{
	struct gcs_upload *u;
	size_t off = 0, step = 77777;
	int nseg = 0, rc;

	rc = gcs_upload_start(c, BUCKET, name, opts, &u);
	if (rc)
		return rc;
	while (off < n) {
		size_t len = n - off < step ? n - off : step;

		rc = gcs_upload_append(u, d + off, len, count_release, rel);
		if (rc)
			break;
		off += len;
		nseg++;
		step = step * 3 % 400000 + 1;
		gcs_poll(c, 0);
		ck_assert_uint_le(gcs_upload_persisted(u), off);
	}
	if (!rc)
		rc = gcs_upload_finish(u, NULL);
	if (!rc)
		rc = gcs_op_wait(gcs_upload_op(u));
	if (rc == 0) {
		ck_assert_int_eq(rel->released, nseg);
		ck_assert_uint_eq(gcs_upload_object(u)->size, n);
		ck_assert_ptr_nonnull(gcs_upload_session(u));
	}
	gcs_upload_free(u);
	/* freeing releases whatever was left */
	ck_assert_int_eq(rel->released, nseg);
	return rc;
}

START_TEST(resumable_stream)
{
	struct gcs_client *c = client();
	size_t n = 3 * GCS_PIECE * 2 + 12345;
	unsigned char *d = gt_pattern(n, 2);
	struct rel rel = { 0 };
	struct gcs_upload_opts o = { GCS_CREATE_ONLY, GCS_SIZE_UNKNOWN, 0, 0 };

	ck_assert_msg(stream_upload(c, "rs/one", d, n, &o, &rel) == 0, "%s",
		      gcs_errmsg(c));
	check_object(c, "rs/one", d, n);
	/* crc and size known up front; and the empty object */
	o.size = n;
	o.crc32c = gcs_crc32c(0, d, n);
	o.has_crc32c = 1;
	memset(&rel, 0, sizeof(rel));
	ck_assert_int_eq(stream_upload(c, "rs/two", d, n, &o, &rel), 0);
	check_object(c, "rs/two", d, n);
	/* a multiple of the chunk: the last request carries no bytes */
	o = (struct gcs_upload_opts){ GCS_CREATE_ONLY, GCS_SIZE_UNKNOWN, 0, 0 };
	memset(&rel, 0, sizeof(rel));
	ck_assert_int_eq(
		stream_upload(c, "rs/exact", d, 4 * GCS_PIECE, &o, &rel), 0);
	check_object(c, "rs/exact", d, 4 * GCS_PIECE);
	o = (struct gcs_upload_opts){ GCS_NO_COND, GCS_SIZE_UNKNOWN, 0, 0 };
	memset(&rel, 0, sizeof(rel));
	ck_assert_int_eq(stream_upload(c, "rs/empty", d, 0, &o, &rel), 0);
	check_object(c, "rs/empty", d, 0);
	/* a wrong crc announced up front: the server refuses the object */
	o = (struct gcs_upload_opts){ GCS_NO_COND, n, 0x1234, 1 };
	memset(&rel, 0, sizeof(rel));
	ck_assert_int_ne(stream_upload(c, "rs/bad", d, n, &o, &rel), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "rs/bad", NULL), -ENOENT);
	free(d);
	gcs_client_free(c);
}
END_TEST

/* Upload n bytes through a client whose requests carry a retry test made
 * of instr; returns the upload result and checks every instruction was
 * consumed. */
static int faulty_upload(const char *name, size_t n, const char *method,
			 const char *const *instr, size_t ni,
			 struct gcs_cond cond, uint64_t *retries)
{
	struct gcs_config cfg = fast_cfg();
	const char *id = gt_retry_test(srv.url, method, instr, ni);
	unsigned char *d = gt_pattern(n, n);
	struct gcs_upload_opts o = { cond, GCS_SIZE_UNKNOWN, 0, 0 };
	struct rel rel = { 0 };
	struct gcs_client *c;
	struct gcs_stats st;
	int rc;

	ck_assert_ptr_nonnull(id);
	cfg.retry_test_id = id;
	cfg.chunk_bytes = 2 * GCS_PIECE;
	c = client_with(cfg);
	rc = stream_upload(c, name, d, n, &o, &rel);
	if (rc == 0)
		check_object(c, name, d, n);
	ck_assert_int_eq(gt_retry_test_completed(srv.url, id), 1);
	gcs_get_stats(c, &st);
	*retries = st.retries;
	free(d);
	gcs_client_free(c);
	return rc;
}

START_TEST(resumable_faults)
{
	static const char *const a[] = { "return-503-after-256K" };
	static const char *const b[] = { "return-reset-connection",
					 "return-503" };
	static const char *const e[] = { "return-408" };
	static const char *const f[] = { "return-503-after-768K",
					 "return-408" };
	static const char *const g[] = { "return-reset-connection" };
	const char *m = "storage.objects.insert";
	uint64_t retries;

	ck_assert_int_eq(faulty_upload("rf/a", 1100000, m, a, 1,
				       GCS_CREATE_ONLY, &retries),
			 0);
	ck_assert_uint_ge(retries, 1);
	ck_assert_int_eq(faulty_upload("rf/b", 1100000, m, b, 2,
				       GCS_CREATE_ONLY, &retries),
			 0);
	ck_assert_uint_eq(retries, 2);
	ck_assert_int_eq(faulty_upload("rf/e", 1100000, m, e, 1,
				       GCS_CREATE_ONLY, &retries),
			 0);
	ck_assert_int_eq(faulty_upload("rf/f", 1100000, m, f, 2,
				       GCS_CREATE_ONLY, &retries),
			 0);
	ck_assert_uint_ge(retries, 2);
	/* no precondition: pieces are still resumed after a failure */
	ck_assert_int_eq(faulty_upload("rf/h", 1100000, m, a, 1, GCS_NO_COND,
				       &retries),
			 0);
	ck_assert_uint_ge(retries, 1);
	/* but the initiation is not repeated blindly */
	ck_assert_int_eq(faulty_upload("rf/g", 1100000, m, g, 1, GCS_NO_COND,
				       &retries),
			 GCS_E_TRANSPORT);
	ck_assert_uint_eq(retries, 0);
}
END_TEST

START_TEST(resumable_restart)
{
	struct gcs_client *c = client();
	size_t n = 5 * GCS_PIECE + 999, half = 3 * GCS_PIECE + 100;
	unsigned char *d = gt_pattern(n, 3);
	struct gcs_upload_opts o = { GCS_CREATE_ONLY, GCS_SIZE_UNKNOWN, 0, 0 };
	struct gcs_upload *u;
	struct rel rel = { 0 };
	uint64_t persisted;
	uint32_t crc = gcs_crc32c(0, d, n);
	char *session;

	/* the first "process": sends part, saves the session, dies */
	ck_assert_int_eq(gcs_upload_start(c, BUCKET, "rr/obj", &o, &u), 0);
	ck_assert_int_eq(gcs_upload_append(u, d, half, count_release, &rel), 0);
	while (gcs_upload_persisted(u) < 3 * GCS_PIECE &&
	       !gcs_op_done(gcs_upload_op(u)))
		gcs_poll(c, 100);
	ck_assert_int_eq(gcs_op_done(gcs_upload_op(u)), 0);
	ck_assert_uint_eq(gcs_upload_persisted(u), 3 * GCS_PIECE);
	session = strdup(gcs_upload_session(u));
	gcs_upload_free(u);
	gcs_client_free(c);
	ck_assert_int_eq(rel.released, 1);

	/* the second: asks the server, sends the rest, gives the crc */
	c = client();
	ck_assert_msg(gcs_upload_resume(c, BUCKET, "rr/obj", session, &o,
					&persisted, &u) == 0,
		      "%s", gcs_errmsg(c));
	ck_assert_uint_eq(persisted, 3 * GCS_PIECE);
	ck_assert_int_eq(gcs_upload_append(u, d + persisted, n - persisted,
					   NULL, NULL),
			 0);
	ck_assert_int_eq(gcs_upload_finish(u, &crc), 0);
	ck_assert_msg(gcs_op_wait(gcs_upload_op(u)) == 0, "%s", gcs_errmsg(c));
	gcs_upload_free(u);
	check_object(c, "rr/obj", d, n);
	/* the session is finished: resuming it reports the whole object */
	ck_assert_int_eq(gcs_upload_resume(c, BUCKET, "rr/obj", session, &o,
					   &persisted, &u),
			 0);
	ck_assert_uint_eq(persisted, n);
	ck_assert_ptr_nonnull(gcs_upload_object(u));
	gcs_upload_free(u);
	/* a wrong final crc is refused, the object is not replaced */
	o.cond = GCS_NO_COND;
	ck_assert_int_eq(gcs_upload_start(c, BUCKET, "rr/obj", &o, &u), 0);
	ck_assert_int_eq(gcs_upload_append(u, d, 1000, NULL, NULL), 0);
	crc ^= 1;
	ck_assert_int_eq(gcs_upload_finish(u, &crc), 0);
	ck_assert_int_ne(gcs_op_wait(gcs_upload_op(u)), 0);
	gcs_upload_free(u);
	check_object(c, "rr/obj", d, n);
	free(session);
	free(d);
	gcs_client_free(c);
}
END_TEST

/* ---- downloads after broken streams ---- */

START_TEST(download_broken_stream)
{
	static const char *const a[] = { "return-broken-stream",
					 "return-broken-stream" };
	static const char *const b[] = { "return-broken-stream-after-256K" };
	struct gcs_client *c = client();
	size_t n = 1000000, got;
	unsigned char *d = gt_pattern(n, 4), *buf = malloc(n);
	struct gcs_config cfg = fast_cfg();
	struct gcs_stats st;
	const char *id;

	ck_assert_int_eq(gcs_put(c, BUCKET, "dl/obj", d, n, GCS_NO_COND, NULL),
			 0);
	gcs_client_free(c);
	id = gt_retry_test(srv.url, "storage.objects.get", a, 2);
	cfg.retry_test_id = id;
	c = client_with(cfg);
	check_object(c, "dl/obj", d, n);
	gcs_get_stats(c, &st);
	ck_assert_uint_eq(st.retries, 2);
	ck_assert_int_eq(gt_retry_test_completed(srv.url, id), 1);
	gcs_client_free(c);

	cfg.retry_test_id = gt_retry_test(srv.url, "storage.objects.get", b, 1);
	c = client_with(cfg);
	ck_assert_int_eq(
		gcs_read(c, BUCKET, "dl/obj", 1000, n - 2000, buf, &got), 0);
	ck_assert_uint_eq(got, n - 2000);
	ck_assert_mem_eq(buf, d + 1000, n - 2000);
	ck_assert_int_eq(gt_retry_test_completed(srv.url, cfg.retry_test_id),
			 1);
	gcs_client_free(c);
	free(buf);
	free(d);
}
END_TEST

/* ---- retry rules ---- */

static int with_faults(const char *method, const char *const *instr, size_t n,
		       const struct gcs_config *base,
		       int (*fn)(struct gcs_client *), char *msg, size_t msglen)
{
	struct gcs_config cfg = base ? *base : fast_cfg();
	struct gcs_client *c;
	int rc;

	cfg.retry_test_id = gt_retry_test(srv.url, method, instr, n);
	c = client_with(cfg);
	rc = fn(c);
	snprintf(msg, msglen, "%s", gcs_errmsg(c));
	gcs_client_free(c);
	return rc;
}

static int put_plain(struct gcs_client *c)
{
	return gcs_put(c, BUCKET, "rt/plain", "x", 1, GCS_NO_COND, NULL);
}

static int put_create(struct gcs_client *c)
{
	return gcs_put(c, BUCKET, "rt/create", "x", 1, GCS_CREATE_ONLY, NULL);
}

static int stat_it(struct gcs_client *c)
{
	struct gcs_object o;
	int rc = gcs_stat(c, BUCKET, "rt/create", &o);

	if (!rc)
		gcs_object_clear(&o);
	return rc;
}

START_TEST(retry_rules)
{
	static const char *const one503[] = { "return-503" };
	static const char *const two503[] = { "return-503", "return-503" };
	static const char *const bad[] = { "return-400" };
	static const char *const five[] = { "return-503", "return-503",
					    "return-503", "return-503",
					    "return-503" };
	static const char *const stall[] = { "stall-for-3s-after-0K" };
	const char *ins = "storage.objects.insert";
	struct gcs_config cfg = fast_cfg();
	char msg[800];

	/* insert without precondition: 503 is final */
	ck_assert_int_eq(with_faults(ins, one503, 1, NULL, put_plain, msg,
				     sizeof(msg)),
			 GCS_E_HTTP);
	ck_assert_ptr_nonnull(strstr(msg, "gs://" BUCKET "/rt/plain"));
	ck_assert_ptr_nonnull(strstr(msg, "HTTP 503"));
	/* with one: retried */
	ck_assert_int_eq(with_faults(ins, two503, 2, NULL, put_create, msg,
				     sizeof(msg)),
			 0);
	/* reads: retried; 400 is not */
	ck_assert_int_eq(with_faults("storage.objects.get", two503, 2, NULL,
				     stat_it, msg, sizeof(msg)),
			 0);
	ck_assert_int_eq(with_faults("storage.objects.get", bad, 1, NULL,
				     stat_it, msg, sizeof(msg)),
			 GCS_E_HTTP);
	ck_assert_ptr_nonnull(strstr(msg, "HTTP 400"));
	/* attempts are capped when asked */
	cfg.max_attempts = 3;
	ck_assert_int_eq(with_faults("storage.objects.get", five, 5, &cfg,
				     stat_it, msg, sizeof(msg)),
			 GCS_E_HTTP);
	ck_assert_ptr_nonnull(strstr(msg, "after 3 attempts"));
	/* the overall deadline ends an attempt that stalls */
	cfg.max_attempts = 0;
	cfg.deadline_s = 0.5;
	ck_assert_int_ne(with_faults("storage.objects.get", stall, 1, &cfg,
				     stat_it, msg, sizeof(msg)),
			 0);
	ck_assert_ptr_nonnull(strstr(msg, "gs://" BUCKET "/rt/create"));
}
END_TEST

/* ---- list, compose ---- */

static int stop_after;

static int stop_at(void *arg, const struct gcs_object *o, const char *p)
{
	(void)arg;
	(void)p;
	ck_assert_ptr_nonnull(o);
	return --stop_after == 0 ? 42 : 0;
}

START_TEST(list_pages)
{
	struct gcs_config cfg = fast_cfg();
	struct gcs_client *c;
	struct gcs_list l;
	char name[64];
	int i, seen[25] = { 0 };
	size_t k;

	cfg.list_page_size = 7;
	c = client_with(cfg);
	for (i = 0; i < 25; i++) {
		snprintf(name, sizeof(name), "ls/p/obj-%02d", i);
		ck_assert_int_eq(gcs_put(c, BUCKET, name, name, strlen(name),
					 GCS_CREATE_ONLY, NULL),
				 0);
	}
	ck_assert_int_eq(
		gcs_put(c, BUCKET, "ls/q/x", "x", 1, GCS_NO_COND, NULL), 0);
	ck_assert_int_eq(
		gcs_put(c, BUCKET, "ls/top", "x", 1, GCS_NO_COND, NULL), 0);
	ck_assert_msg(gcs_list(c, BUCKET, "ls/p/", NULL, &l) == 0, "%s",
		      gcs_errmsg(c));
	ck_assert_uint_eq(l.n_items, 25);
	for (k = 0; k < l.n_items; k++) {
		ck_assert_int_eq(sscanf(l.items[k].name, "ls/p/obj-%d", &i), 1);
		seen[i]++;
		ck_assert_uint_eq(l.items[k].size, strlen(l.items[k].name));
	}
	for (i = 0; i < 25; i++)
		ck_assert_int_eq(seen[i], 1);
	gcs_list_free(&l);
	ck_assert_int_eq(gcs_list(c, BUCKET, "ls/", "/", &l), 0);
	ck_assert_uint_eq(l.n_items, 1);
	ck_assert_str_eq(l.items[0].name, "ls/top");
	ck_assert_uint_eq(l.n_prefixes, 2);
	gcs_list_free(&l);
	/* a callback that stops the walk: its code comes back */
	stop_after = 10;
	ck_assert_int_eq(gcs_list_each(c, BUCKET, "ls/p/", NULL, stop_at, NULL),
			 42);
	ck_assert_int_eq(stop_after, 0);
	ck_assert_int_eq(gcs_list(c, BUCKET, "nothing-here/", "/", &l), 0);
	ck_assert_uint_eq(l.n_items + l.n_prefixes, 0);
	gcs_list_free(&l);
	gcs_client_free(c);
}
END_TEST

START_TEST(compose_parts)
{
	struct gcs_client *c = client();
	unsigned char *d = gt_pattern(90000, 5);
	const char *srcs[3] = { "cp/0", "cp/1", "cp/2" };
	int64_t gens[3];
	struct gcs_object o;
	uint32_t crc;
	int i;

	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(gcs_put(c, BUCKET, srcs[i], d + i * 30000,
					 30000, GCS_CREATE_ONLY, &o),
				 0);
		gens[i] = o.generation;
		gcs_object_clear(&o);
	}
	ck_assert_msg(gcs_compose(c, BUCKET, "cp/all", srcs, gens, 3,
				  GCS_CREATE_ONLY, &o) == 0,
		      "%s", gcs_errmsg(c));
	crc = gcs_crc32c_combine(
		gcs_crc32c_combine(gcs_crc32c(0, d, 30000),
				   gcs_crc32c(0, d + 30000, 30000), 30000),
		gcs_crc32c(0, d + 60000, 30000), 30000);
	ck_assert_uint_eq(o.crc32c, crc);
	ck_assert_uint_eq(o.size, 90000);
	gcs_object_clear(&o);
	check_object(c, "cp/all", d, 90000);
	ck_assert_int_eq(gcs_compose(c, BUCKET, "cp/all", srcs, NULL, 3,
				     GCS_CREATE_ONLY, NULL),
			 GCS_E_PRECONDITION);
	ck_assert_int_eq(gcs_compose(c, BUCKET, "cp/all", srcs, NULL, 33,
				     GCS_NO_COND, NULL),
			 -EINVAL);
	free(d);
	gcs_client_free(c);
}
END_TEST

/* ---- many at once ---- */

START_TEST(parallel_transfers)
{
	enum { N = 24 };
	struct gcs_client *c = client();
	size_t n = 2 * GCS_PIECE + 4321;
	unsigned char *d[N], *back[N];
	struct gcs_upload *u[N];
	struct gcs_op *op[N];
	size_t got[N];
	struct gcs_stats st;
	char name[32];
	int i;

	for (i = 0; i < N; i++) {
		struct gcs_upload_opts o = { GCS_CREATE_ONLY, n, 0, 0 };

		d[i] = gt_pattern(n, 100 + (uint64_t)i);
		back[i] = malloc(n);
		snprintf(name, sizeof(name), "par/%d", i);
		ck_assert_int_eq(gcs_upload_start(c, BUCKET, name, &o, &u[i]),
				 0);
		ck_assert_int_eq(gcs_upload_append(u[i], d[i], n, NULL, NULL),
				 0);
		ck_assert_int_eq(gcs_upload_finish(u[i], NULL), 0);
	}
	/* all sessions progress together in one loop */
	while (gcs_poll(c, 1000) > 0)
		;
	for (i = 0; i < N; i++) {
		ck_assert_msg(gcs_op_wait(gcs_upload_op(u[i])) == 0, "%s",
			      gcs_op_errmsg(gcs_upload_op(u[i])));
		gcs_upload_free(u[i]);
		snprintf(name, sizeof(name), "par/%d", i);
		ck_assert_int_eq(gcs_start_read(c, BUCKET, name, 0, n, back[i],
						&got[i], &op[i]),
				 0);
	}
	for (i = 0; i < N; i++) {
		ck_assert_int_eq(gcs_op_wait(op[i]), 0);
		gcs_op_free(op[i]);
		ck_assert_uint_eq(got[i], n);
		ck_assert_mem_eq(back[i], d[i], n);
		free(d[i]);
		free(back[i]);
	}
	gcs_get_stats(c, &st);
	ck_assert_uint_ge(st.requests, N * 5);
	ck_assert_uint_ge(st.bytes_up, N * n);
	ck_assert_uint_ge(st.bytes_down, N * n);
	/* connections are kept and reused: at most one per stream */
	ck_assert_uint_le(st.connects, 8);
	gcs_client_free(c);
}
END_TEST

/* ---- a soak: random faults on a quarter of the requests ---- */

struct soak_obj {
	char name[32];
	unsigned char *d;
	size_t n;
	struct gcs_upload *u;
};

START_TEST(soak_random_faults)
{
	enum { N = 12 };
	static const char *const args[] = { "--fault-rate", "0.25",
					    "--fault-seed", "11", NULL };
	struct gcs_config cfg = fast_cfg();
	tu_server faulty;
	struct soak_obj ob[N];
	struct gcs_client *c;
	struct gcs_stats st;
	struct gcs_list l;
	int i;

	gt_server_start_args(&faulty, BUCKET, args);
	cfg.endpoint = faulty.url;
	cfg.chunk_bytes = 2 * GCS_PIECE;
	cfg.stall_s = 1; /* a stalled transfer is given up after 1 s */
	c = client_with(cfg);
	for (i = 0; i < N; i++) {
		struct gcs_upload_opts o = { GCS_CREATE_ONLY, GCS_SIZE_UNKNOWN,
					     0, 0 };

		ob[i].n = (size_t)(i + 1) * 300000 + 17;
		ob[i].d = gt_pattern(ob[i].n, 500 + (uint64_t)i);
		snprintf(ob[i].name, sizeof(ob[i].name), "soak/%02d", i);
		if (i % 4 == 3) {
			ob[i].u = NULL; /* a small one: multipart */
			ob[i].n = 5000 + (size_t)i;
			continue;
		}
		ck_assert_int_eq(gcs_upload_start(c, BUCKET, ob[i].name, &o,
						  &ob[i].u),
				 0);
		ck_assert_int_eq(gcs_upload_append(ob[i].u, ob[i].d, ob[i].n,
						   NULL, NULL),
				 0);
		ck_assert_int_eq(gcs_upload_finish(ob[i].u, NULL), 0);
	}
	for (i = 0; i < N; i++) {
		if (ob[i].u) {
			ck_assert_msg(gcs_op_wait(gcs_upload_op(ob[i].u)) == 0,
				      "%s", gcs_errmsg(c));
			gcs_upload_free(ob[i].u);
		} else {
			ck_assert_msg(gcs_put(c, BUCKET, ob[i].name, ob[i].d,
					      ob[i].n, GCS_CREATE_ONLY,
					      NULL) == 0,
				      "%s", gcs_errmsg(c));
		}
	}
	for (i = 0; i < N; i++) {
		check_object(c, ob[i].name, ob[i].d, ob[i].n);
		free(ob[i].d);
	}
	/* nothing stray, nothing twice */
	ck_assert_msg(gcs_list(c, BUCKET, "soak/", NULL, &l) == 0, "%s",
		      gcs_errmsg(c));
	ck_assert_uint_eq(l.n_items, N);
	gcs_list_free(&l);
	gcs_get_stats(c, &st);
	printf("soak: %llu requests, %llu retries\n",
	       (unsigned long long)st.requests, (unsigned long long)st.retries);
	ck_assert_uint_gt(st.retries, 0);
	gcs_client_free(c);
	tu_server_stop(&faulty);
}
END_TEST

/* ---- another thread ends the owner's poll ---- */

static void *wake_later(void *arg)
{
	usleep(100000);
	gcs_wakeup(arg);
	return NULL;
}

START_TEST(wakeup)
{
	static const char *const stall[] = { "stall-for-20s-after-0K" };
	struct gcs_config cfg = fast_cfg();
	struct gcs_client *c = client();
	unsigned char buf[100];
	struct gcs_op *op;
	pthread_t th;
	size_t got;

	ck_assert_int_eq(
		gcs_put(c, BUCKET, "wk/x", "hello", 5, GCS_NO_COND, NULL), 0);
	gcs_client_free(c);
	cfg.retry_test_id =
		gt_retry_test(srv.url, "storage.objects.get", stall, 1);
	c = client_with(cfg);
	ck_assert_int_eq(
		gcs_start_read(c, BUCKET, "wk/x", 0, 5, buf, &got, &op), 0);
	/* the read stalls for 20 s: only a wakeup ends these polls early */
	gcs_wakeup(c);
	ck_assert_int_eq(gcs_poll(c, 60000), 1);
	pthread_create(&th, NULL, wake_later, c);
	ck_assert_int_eq(gcs_poll(c, 60000), 1);
	pthread_join(th, NULL);
	ck_assert_int_eq(gcs_op_done(op), 0);
	gcs_op_free(op);
	gcs_client_free(c);
}
END_TEST

START_TEST(auth_emulator_env)
{
	struct gcs_client *c;
	struct gcs_object o;

	/* host:port without a scheme means http, and no credentials */
	setenv("STORAGE_EMULATOR_HOST", srv.url + strlen("http://"), 1);
	setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "/nonexistent/tok", 1);
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_put(c, BUCKET, "emu/x", "x", 1, GCS_NO_COND, NULL),
			 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "emu/x", &o), 0);
	gcs_object_clear(&o);
	gcs_client_free(c);
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	ck_assert_int_eq(gcs_client_new(&c, NULL), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, "emu/x", &o), 0);
	gcs_object_clear(&o);
	gcs_client_free(c);
}
END_TEST

static Suite *gcs_suite(void)
{
	Suite *s = suite_create("gcs_client");
	TCase *tc = tu_tcase("client", 120);

	tcase_add_test(tc, crc_vectors);
	tcase_add_test(tc, put_get_stat_delete);
	tcase_add_test(tc, create_only_and_replace);
	tcase_add_test(tc, create_lost_reply);
	tcase_add_test(tc, resumable_stream);
	tcase_add_test(tc, resumable_faults);
	tcase_add_test(tc, resumable_restart);
	tcase_add_test(tc, download_broken_stream);
	tcase_add_test(tc, retry_rules);
	tcase_add_test(tc, list_pages);
	tcase_add_test(tc, compose_parts);
	tcase_add_test(tc, parallel_transfers);
	tcase_add_test(tc, soak_random_faults);
	tcase_add_test(tc, wakeup);
	tcase_add_test(tc, auth_emulator_env);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int rc;

	gt_server_start(&srv, BUCKET);
	rc = tu_main(gcs_suite());
	tu_server_stop(&srv);
	return rc;
}
