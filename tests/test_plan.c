/*
 * test_plan.c - what happens around the save a notice asks for: the policy
 * after it (ckpt_should_stop, the CONTINUE save before the deadline) and
 * the event journal (ckpt_event_append / ckpt_events_read on a directory,
 * on gs:// alone, and a directory's journal uploaded to its remote).
 *
 * Notices are raised with ckpt_request_save() on a handle whose watcher
 * has no metadata thread, so no test waits on a server. Deadlines are
 * either far (600 s: "not yet" can never be late) or already near, and
 * waits are bounded by PATIENCE_S; no duration is asserted.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plan.h"
#include "save_internal.h"
#include "test_gcs_util.h"
#include "testutil.h"

#define PATIENCE_S 30.0
#define BUCKET "plan-bkt"

static int64_t unix_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- journal lines, collected --------------------------------------- */

struct lines {
	int n;
	uint32_t host[64];
	json_t *obj[64];
	int stop_at; /* stop the walk after this many (0: never) */
};

static int collect(void *arg, uint32_t host, const char *line)
{
	struct lines *L = arg;
	json_error_t e;

	ck_assert_int_lt(L->n, 64);
	L->host[L->n] = host;
	L->obj[L->n] = json_loads(line, 0, &e);
	ck_assert_msg(L->obj[L->n] != NULL, "bad line %s: %s", line, e.text);
	L->n++;
	return L->stop_at && L->n == L->stop_at ? 7 : 0;
}

static void lines_free(struct lines *L)
{
	for (int i = 0; i < L->n; i++)
		json_decref(L->obj[i]);
	memset(L, 0, sizeof(*L));
}

static const char *str(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_string(v) ? json_string_value(v) : "";
}

/* The first line whose "action" is `action` (and "step" is step). */
static json_t *find_action(const struct lines *L, const char *action,
			   int64_t step)
{
	for (int i = 0; i < L->n; i++)
		if (!strcmp(str(L->obj[i], "action"), action) &&
		    json_integer_value(json_object_get(L->obj[i], "step")) ==
			    step)
			return L->obj[i];
	return NULL;
}

/* ---- handles and saves -------------------------------------------- */

static ckpt *open_at(const char *dir, const char *remote)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = 1 << 20;
	s.chunk_bytes = 64 << 10;
	s.threads = 1;
	s.files_per_host = 1;
	s.remote = remote;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	return c;
}

static void watch_no_md(ckpt *c, int after_save)
{
	ckpt_watch_opts o;

	ckpt_watch_opts_default(&o);
	o.flags = CKPT_WATCH_NO_METADATA | CKPT_WATCH_NO_PROBE;
	o.every_seconds = 0;
	o.after_save = after_save;
	ck_assert_msg(ckpt_watch_start(c, &o) == 0, "%s", ckpt_errmsg(NULL));
}

static void save(ckpt *c, uint64_t step, int reason)
{
	static uint8_t data[8192];
	uint64_t dim;
	ckpt_tensor t = tu_bytes_tensor("w", data, sizeof(data), &dim);
	ckpt_save_opts o;

	ckpt_save_opts_default(&o);
	o.reason = reason;
	ck_assert_msg(ckpt_save_ex(c, step, &t, 1, &o) == 0, "%s",
		      ckpt_errmsg(c));
	ck_assert_msg(ckpt_wait(c) == 0, "%s", ckpt_errmsg(c));
}

/* ---- the journal ---------------------------------------------------- */

START_TEST(test_journal_dir)
{
	const char *dir = tu_tmpdir();
	struct lines L = { 0 };
	char *path, *torn;
	uint8_t *buf;
	size_t len;

	/* nothing yet: no call, no error */
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_int_eq(L.n, 0);

	ck_assert_int_eq(ckpt_event_append(dir, 3,
					   "{\"source\":\"run\","
					   "\"action\":\"restart\","
					   "\"restart\":1}"),
			 0);
	ck_assert_int_eq(ckpt_event_append(dir, 0,
					   "{\"source\":\"request\","
					   "\"time\":\"2026-01-02T03:"
					   "04:05.006Z\"}"),
			 0);
	ck_assert_int_eq(ckpt_event_append(dir, 0,
					   "{\"source\":\"pod\","
					   "\"host\":9}"),
			 0);
	/* not an object, two lines, garbage: refused, nothing written */
	ck_assert_int_eq(ckpt_event_append(dir, 0, "[1,2]"), -EINVAL);
	ck_assert_int_eq(ckpt_event_append(dir, 0, "{\"a\":1}\n{\"b\":2}"),
			 -EINVAL);
	ck_assert_int_eq(ckpt_event_append(dir, 0, "{\"a\":"), -EINVAL);
	ck_assert_int_eq(ckpt_event_append(NULL, 0, "{}"), -EINVAL);

	/* the file: host 0's own name, time and host first */
	path = tu_path("%s/events/h00000.jsonl", dir);
	ck_assert_int_eq(tu_read_file(path, &buf, &len), 0);
	{
		static const char first[] =
			"{\"time\":\"2026-01-02T03:04:05.006Z\","
			"\"host\":0,\"source\":\"request\"}\n";

		ck_assert_msg(len > strlen(first) &&
				      !memcmp(buf, first, strlen(first)),
			      "%.*s", (int)len, buf);
	}
	free(buf);
	{
		char *h3 = tu_path("%s/events/h00003.jsonl", dir);

		ck_assert_int_gt(tu_file_size(h3), 0);
		free(h3);
	}

	/* a torn last line (crash during an append) is skipped */
	torn = tu_path("%s/events/h00000.jsonl", dir);
	{
		FILE *f = fopen(torn, "a");

		ck_assert_ptr_nonnull(f);
		fputs("{\"source\":\"half", f);
		fclose(f);
	}

	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_int_eq(L.n, 3);
	/* hosts ascending, lines in order */
	ck_assert_uint_eq(L.host[0], 0);
	ck_assert_str_eq(str(L.obj[0], "source"), "request");
	ck_assert_str_eq(str(L.obj[1], "source"), "pod");
	ck_assert_int_eq(json_integer_value(json_object_get(L.obj[1], "host")),
			 9);
	ck_assert_uint_eq(L.host[2], 3);
	ck_assert_str_eq(str(L.obj[2], "action"), "restart");
	/* RFC 3339 UTC with milliseconds, added when absent */
	ck_assert_int_eq(strlen(str(L.obj[2], "time")), 24);
	ck_assert_int_eq(str(L.obj[2], "time")[23], 'Z');
	ck_assert_int_eq(str(L.obj[2], "time")[10], 'T');
	lines_free(&L);

	/* fn's non-zero stops the walk and is returned */
	L.stop_at = 2;
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 7);
	ck_assert_int_eq(L.n, 2);
	lines_free(&L);
	free(path);
	free(torn);
}
END_TEST

START_TEST(test_journal_gcs)
{
	tu_server fs;
	struct lines L = { 0 };
	char loc[64];

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(loc, sizeof(loc), "gs://%s/run1", BUCKET);
	ck_assert_int_eq(ckpt_events_read(loc, collect, &L), 0);
	ck_assert_int_eq(L.n, 0);
	ck_assert_msg(ckpt_event_append(loc, 1,
					"{\"source\":\"run\","
					"\"n\":1}") == 0,
		      "%s", ckpt_errmsg(NULL));
	ck_assert_int_eq(ckpt_event_append(loc, 1,
					   "{\"source\":\"run\","
					   "\"n\":2}"),
			 0);
	ck_assert_int_eq(ckpt_event_append(loc, 0,
					   "{\"source\":\"run\","
					   "\"n\":3}"),
			 0);
	ck_assert_int_eq(ckpt_events_read(loc, collect, &L), 0);
	ck_assert_int_eq(L.n, 3);
	ck_assert_uint_eq(L.host[0], 0);
	ck_assert_uint_eq(L.host[1], 1);
	ck_assert_int_eq(json_integer_value(json_object_get(L.obj[1], "n")), 1);
	ck_assert_int_eq(json_integer_value(json_object_get(L.obj[2], "n")), 2);
	lines_free(&L);
	tu_server_stop(&fs);
}
END_TEST

/* Two writers of one host's gs:// journal at once (the training process
 * and `ckptctl run` on one VM): every line of both is kept. A plain read,
 * extend and replace loses some of them. */
#define RACE_LINES 24

struct appender {
	const char *loc;
	int who, failed;
};

static void *append_many(void *arg)
{
	struct appender *a = arg;
	char line[96];

	for (int i = 0; i < RACE_LINES && !a->failed; i++) {
		snprintf(line, sizeof(line),
			 "{\"source\":\"run\",\"who\":%d,\"i\":%d}", a->who,
			 i);
		if (ckpt_event_append(a->loc, 2, line) != 0)
			a->failed = 1;
	}
	return NULL;
}

START_TEST(test_journal_gcs_two_writers)
{
	tu_server fs;
	struct lines L = { 0 };
	struct appender a[2];
	pthread_t th[2];
	int seen[2][RACE_LINES] = { { 0 } };
	char loc[64];

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(loc, sizeof(loc), "gs://%s/race", BUCKET);
	for (int k = 0; k < 2; k++) {
		a[k] = (struct appender){ loc, k, 0 };
		ck_assert_int_eq(pthread_create(&th[k], NULL, append_many,
						&a[k]),
				 0);
	}
	for (int k = 0; k < 2; k++) {
		pthread_join(th[k], NULL);
		ck_assert_msg(!a[k].failed, "writer %d: an append failed", k);
	}
	ck_assert_int_eq(ckpt_events_read(loc, collect, &L), 0);
	for (int n = 0; n < L.n; n++) {
		json_int_t w = json_integer_value(json_object_get(L.obj[n],
								  "who")),
			   i = json_integer_value(json_object_get(L.obj[n],
								  "i"));

		ck_assert(w >= 0 && w < 2 && i >= 0 && i < RACE_LINES);
		seen[w][i]++;
	}
	for (int w = 0; w < 2; w++)
		for (int i = 0; i < RACE_LINES; i++)
			ck_assert_msg(seen[w][i] == 1,
				      "writer %d line %d is there %d times (of "
				      "%d lines)",
				      w, i, seen[w][i], L.n);
	lines_free(&L);
	tu_server_stop(&fs);
}
END_TEST

/* The reply to a journal upload is lost after the server stored it
 * (fake_gcs's lost-reply fault: store, then reset the connection). The
 * client retries, meets its own generation (412), and the append's fresh
 * read finds its own line at the end: done, the line is there once. The
 * first append creates the object; the second replaces a generation, the
 * case only gb_append's own-bytes check catches. */
static void lose_next_reply(const tu_server *fs, const char *name)
{
	char url[128], body[256];

	snprintf(url, sizeof(url), "%s/_fake/lost_reply", fs->url);
	snprintf(body, sizeof(body),
		 "{\"bucket\":\"%s\",\"name\":\"%s\",\"times\":1}", BUCKET,
		 name);
	ck_assert_int_eq(gt_http("POST", url, body, NULL), 200);
}

static long lost_replies(const tu_server *fs)
{
	char url[128], *body = NULL;
	json_t *j;
	long n;

	snprintf(url, sizeof(url), "%s/_fake/stats", fs->url);
	ck_assert_int_eq(gt_http("GET", url, NULL, &body), 200);
	j = json_loads(body, 0, NULL);
	ck_assert_ptr_nonnull(j);
	n = (long)json_integer_value(
		json_object_get(json_object_get(j, "faults"), "lost-reply"));
	json_decref(j);
	free(body);
	return n;
}

START_TEST(test_journal_gcs_lost_reply)
{
	tu_server fs;
	struct lines L = { 0 };
	char loc[64], line[64];

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(loc, sizeof(loc), "gs://%s/lost", BUCKET);
	for (int n = 1; n <= 2; n++) {
		int seen[3] = { 0 };

		lose_next_reply(&fs, "lost/events/h00003.jsonl");
		snprintf(line, sizeof(line), "{\"source\":\"run\",\"n\":%d}",
			 n);
		ck_assert_msg(ckpt_event_append(loc, 3, line) == 0, "%s",
			      ckpt_errmsg(NULL));
		/* the server stored the object and dropped the answer */
		ck_assert_int_eq(lost_replies(&fs), n);
		ck_assert_int_eq(ckpt_events_read(loc, collect, &L), 0);
		for (int i = 0; i < L.n; i++) {
			json_int_t k = json_integer_value(
				json_object_get(L.obj[i], "n"));

			ck_assert(k >= 1 && k <= n && L.host[i] == 3);
			seen[k]++;
		}
		for (int k = 1; k <= n; k++)
			ck_assert_msg(seen[k] == 1,
				      "after %d appends, line %d is there %d "
				      "times (of %d lines)",
				      n, k, seen[k], L.n);
		lines_free(&L);
	}
	tu_server_stop(&fs);
}
END_TEST

/* ---- the policy after a notice's save ------------------------------- */

START_TEST(test_stop_policy)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_at(dir, NULL);
	ckpt_save_advice a;
	struct lines L = { 0 };
	json_t *o;
	int64_t dl = unix_ns() + 600 * (int64_t)1000000000;

	watch_no_md(c, CKPT_AFTER_STOP);
	ck_assert_int_eq(ckpt_should_stop(NULL), 0);
	/* a periodic save never stops the loop */
	save(c, 1, CKPT_REASON_PERIODIC);
	ck_assert_int_eq(ckpt_should_stop(c), 0);

	ck_assert_int_eq(ckpt_request_save(c, dl), 0);
	ck_assert_int_eq(ckpt_should_save(c, 2, &a), 1);
	ck_assert_int_eq(a.reason, CKPT_REASON_REQUESTED);
	ck_assert_int_eq(ckpt_should_stop(c), 0);
	save(c, 2, a.reason);
	/* set before ckpt_wait returned */
	ck_assert_int_eq(ckpt_should_stop(c), 1);
	ck_assert_int_eq(ckpt_should_save(c, 3, &a), 0);
	ck_assert_int_eq(ckpt_close(c), 0);

	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_ptr_null(find_action(&L, "save", 1));
	o = find_action(&L, "save", 2);
	ck_assert_ptr_nonnull(o);
	ck_assert_str_eq(str(o, "source"), "request");
	ck_assert_str_eq(str(o, "reason"), "requested");
	ck_assert(json_is_true(json_object_get(o, "deadline_met")));
	ck_assert(json_real_value(json_object_get(o, "margin_s")) > 0);
	ck_assert(json_real_value(json_object_get(o, "durable_s")) >= 0);
	ck_assert_int_eq(strlen(str(o, "deadline")), 24);
	ck_assert_ptr_nonnull(find_action(&L, "stop", 2));
	lines_free(&L);
}
END_TEST

START_TEST(test_continue_policy)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_at(dir, NULL);
	ckpt_save_advice a;
	struct lines L = { 0 };
	double t0;
	int64_t dl;

	watch_no_md(c, CKPT_AFTER_CONTINUE);
	/* far deadline: after the save nothing is due yet */
	dl = unix_ns() + 600 * (int64_t)1000000000;
	ck_assert_int_eq(ckpt_request_save(c, dl), 0);
	ck_assert_int_eq(ckpt_should_save(c, 1, &a), 1);
	save(c, 1, a.reason);
	ck_assert_int_eq(ckpt_should_stop(c), 0);
	ck_assert_int_eq(ckpt_should_save(c, 2, &a), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_ptr_nonnull(find_action(&L, "continue", 1));
	ck_assert_int_eq(
		strlen(str(find_action(&L, "continue", 1), "resave_at")), 24);
	lines_free(&L);

	/* near deadline: asked again before it, once */
	dir = tu_tmpdir();
	c = open_at(dir, NULL);
	watch_no_md(c, CKPT_AFTER_CONTINUE);
	dl = unix_ns() + 3 * (int64_t)1000000000;
	ck_assert_int_eq(ckpt_request_save(c, dl), 0);
	ck_assert_int_eq(ckpt_should_save(c, 1, &a), 1);
	save(c, 1, a.reason);
	t0 = tu_now_s();
	while (!ckpt_should_save(c, 2, &a) && tu_now_s() - t0 < PATIENCE_S)
		usleep(1000);
	ck_assert_int_eq(a.reason, CKPT_REASON_REQUESTED);
	ck_assert_int_eq(a.deadline_ns, dl);
	save(c, 2, a.reason);
	ck_assert_int_eq(ckpt_should_stop(c), 0);
	ck_assert_int_eq(ckpt_should_save(c, 3, &a), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_ptr_nonnull(find_action(&L, "save", 1));
	ck_assert(json_is_true(
		json_object_get(find_action(&L, "save", 2), "resave")));
	lines_free(&L);
}
END_TEST

/* Fails the tensor's chunk (8 KiB), not the journal's lines. */
static long enospc_write(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)off;
	return res > 0 && len >= 8192 ? -ENOSPC : res;
}

/* A notice's save that fails: its journal line (with the error) is
 * written when ckpt_wait() returns, as a successful one's is; the journal
 * thread writes the lines, so the writer waits for it. */
START_TEST(test_failed_save_journal)
{
	static const eng_io io = { .write_result = enospc_write };
	static uint8_t data[8192];
	uint64_t dim;
	ckpt_tensor t = tu_bytes_tensor("w", data, sizeof(data), &dim);
	const char *dir = tu_tmpdir();
	ckpt *c = open_at(dir, NULL);
	ckpt_save_advice a;
	ckpt_save_opts so;
	struct lines L = { 0 };
	json_t *o;
	int rc;

	watch_no_md(c, CKPT_AFTER_STOP);
	ck_assert_int_eq(ckpt_request_save(c, unix_ns() + 600000000000LL), 0);
	ck_assert_int_eq(ckpt_should_save(c, 3, &a), 1);
	ckpt_save_opts_default(&so);
	so.reason = a.reason;
	so.codec = CKPT_CODEC_NONE; /* the chunk is 8 KiB */
	eng_io_set(&io);
	rc = ckpt_save_ex(c, 3, &t, 1, &so);
	if (rc == 0)
		rc = ckpt_wait(c);
	eng_io_set(NULL);
	ck_assert_int_eq(rc, -ENOSPC);
	/* read before ckpt_close (which waits for the journal thread) */
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	o = find_action(&L, "save", 3);
	ck_assert_msg(o != NULL, "no journal line for the failed save");
	ck_assert_str_eq(str(o, "error"), ckpt_strerror(-ENOSPC));
	ck_assert_int_eq(ckpt_should_stop(c), 0);
	lines_free(&L);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

/* A directory with a remote: the notice's journal lines reach the bucket
 * (the rate limit leaves the last ones to ckpt_close). */
START_TEST(test_journal_remote)
{
	const char *dir = tu_tmpdir();
	tu_server fs;
	struct lines L = { 0 }, R = { 0 };
	char remote[64];
	ckpt_save_advice a;
	ckpt *c;

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(remote, sizeof(remote), "gs://%s/mirror", BUCKET);
	c = open_at(dir, remote);
	watch_no_md(c, CKPT_AFTER_STOP);
	ck_assert_int_eq(ckpt_request_save(c, 0), 0);
	ck_assert_int_eq(ckpt_should_save(c, 5, &a), 1);
	save(c, 5, a.reason);
	ck_assert_int_eq(ckpt_should_stop(c), 1);
	ck_assert_int_eq(ckpt_upload_wait(c, 60000), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	/* anyone appending to the directory uploads too */
	ck_assert_int_eq(ckpt_event_append(dir, 0,
					   "{\"source\":\"run\","
					   "\"action\":\"restart\"}"),
			 0);
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	ck_assert_int_eq(ckpt_events_read(remote, collect, &R), 0);
	ck_assert_int_ge(L.n, 3);
	ck_assert_ptr_nonnull(find_action(&R, "save", 5));
	ck_assert_ptr_nonnull(find_action(&R, "stop", 5));
	/* the upload that committed the notice's step in the bucket */
	{
		json_t *u = NULL;

		for (int i = 0; i < L.n; i++)
			if (!strcmp(str(L.obj[i], "source"), "upload"))
				u = L.obj[i];
		ck_assert_ptr_nonnull(u);
		ck_assert_int_eq(json_integer_value(json_object_get(u, "step")),
				 5);
		ck_assert(json_real_value(json_object_get(u, "committed_s")) >=
			  0);
	}
	lines_free(&L);
	lines_free(&R);
	tu_server_stop(&fs);
}
END_TEST

/* ---- planning with injected throughputs ----------------------------- */

/* A compressible bf16 tensor of `n` bytes (slow ramps: zstd shrinks it). */
static void save_state(ckpt *c, uint64_t step, int reason, uint64_t n, int wait)
{
	static uint16_t *data;
	static uint64_t have;
	uint64_t shape[1] = { n / 2 };
	ckpt_tensor t = { .name = "state",
			  .dtype = CKPT_BF16,
			  .ndim = 1,
			  .shape = shape,
			  .nbytes = n };
	ckpt_save_opts o;

	if (have < n) {
		free(data);
		data = malloc(n);
		ck_assert_ptr_nonnull(data);
		for (uint64_t i = 0; i < n / 2; i++)
			data[i] = (uint16_t)(0x3c00 + (i >> 12) % 64);
		have = n;
	}
	t.data = data;
	ckpt_save_opts_default(&o);
	o.reason = reason;
	ck_assert_msg(ckpt_save_ex(c, step, &t, 1, &o) == 0, "%s",
		      ckpt_errmsg(c));
	if (wait)
		ck_assert_msg(ckpt_wait(c) == 0, "%s", ckpt_errmsg(c));
}

static ckpt *open_plan(const char *dir, uint64_t staging)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = staging;
	s.chunk_bytes = 64 << 10;
	s.threads = 1;
	s.files_per_host = 1;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	return c;
}

/* Rates in bytes/s; ratio stored/raw. */
static void inject(ckpt *c, double local, const double enc[3],
		   const double ratio[3])
{
	struct eng_plan_meas m = { .local_bps = local, .remote_bps = 0 };

	for (int k = 0; k < 3; k++) {
		m.enc_bps[k] = enc[k];
		m.ratio[k] = ratio[k];
	}
	eng_plan_inject(c, &m);
}

static uint64_t chunks_of(const char *dir, uint64_t step, int codec)
{
	ckpt_reader *r = NULL;
	ckpt_stats st;

	ck_assert_msg(ckpt_reader_open(&r, dir, step, NULL) == 0, "%s",
		      ckpt_reader_errmsg(NULL));
	ck_assert_int_eq(ckpt_reader_stats(r, &st), 0);
	ckpt_reader_close(r);
	return st.chunks_by_codec[codec];
}

/* The codec of a notice's save: the handle's when it fits, else the one
 * predicted fastest. 4 MiB planned against made-up rates, so the
 * predictions are hundreds of seconds and no clock matters. */
START_TEST(test_plan_codec)
{
	static const struct {
		double local, enc[3], ratio[3];
		int deadline_s, want;
	} cases[] = {
		/* float 200 s fits 600 s: kept */
		{ 100e3,
		  { 1e9, 40e3, 20e3 },
		  { 1, .25, .2 },
		  600,
		  CKPT_CODEC_FLOAT },
		/* 150 s: float (200) no, none 42 s is fastest */
		{ 100e3,
		  { 1e9, 40e3, 20e3 },
		  { 1, .25, .2 },
		  150,
		  CKPT_CODEC_NONE },
		/* slow disk: none 420 s, zstd 105 s, float 210 s */
		{ 10e3,
		  { 1e9, 1e6, 20e3 },
		  { 1, .25, .2 },
		  150,
		  CKPT_CODEC_ZSTD },
	};
	int i = _i;
	const char *dir = tu_tmpdir();
	ckpt *c = open_plan(dir, 8 << 20);
	ckpt_save_advice a;
	ckpt_plan p;
	struct lines L = { 0 };
	json_t *o;
	int64_t dl = unix_ns() + cases[i].deadline_s * (int64_t)1000000000;

	watch_no_md(c, CKPT_AFTER_STOP);
	inject(c, cases[i].local, cases[i].enc, cases[i].ratio);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_uint_eq(p.event, 0);
	ck_assert(p.local_bps == cases[i].local);
	ck_assert_int_eq(ckpt_request_save(c, dl), 0);
	ck_assert_int_eq(ckpt_should_save(c, 10, &a), 1);
	save_state(c, 10, a.reason, 4 << 20, 1);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_uint_ne(p.event, 0);
	ck_assert_int_eq(p.codec, cases[i].want);
	ck_assert_int_eq(p.dest, CKPT_PLAN_LOCAL);
	ck_assert_int_eq(p.inflight, CKPT_INFLIGHT_NONE);
	ck_assert_uint_eq(p.step, 10);
	ck_assert_uint_eq(p.state_bytes, 4 << 20);
	ck_assert_int_eq(p.deadline_ns, dl);
	ck_assert(p.predicted_s > 30);
	if (cases[i].want == CKPT_CODEC_FLOAT) /* kept: it fits */
		ck_assert(p.predicted_s * 1.25 <= p.left_s);
	else /* the handle's would not have */
		ck_assert(p.predicted_s < p.left_s);
	ck_assert_int_eq(p.status, 0);
	ck_assert_int_eq(p.deadline_met, 1);
	ck_assert(p.margin_s > 0);
	ck_assert_int_ne(p.durable_ns, 0);
	ck_assert_int_eq(ckpt_close(c), 0);

	/* the step was written with that codec */
	if (cases[i].want == CKPT_CODEC_NONE) {
		ck_assert_uint_gt(chunks_of(dir, 10, CKPT_CODEC_NONE), 0);
		ck_assert_uint_eq(chunks_of(dir, 10, CKPT_CODEC_ZSTD), 0);
		ck_assert_uint_eq(chunks_of(dir, 10, CKPT_CODEC_FLOAT), 0);
	} else {
		ck_assert_uint_gt(chunks_of(dir, 10, cases[i].want), 0);
	}
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	o = find_action(&L, "save", 10);
	ck_assert_ptr_nonnull(o);
	{
		char want[32];

		snprintf(want, sizeof(want), "local+%s",
			 ckpt_codec_name(cases[i].want));
		ck_assert_str_eq(str(o, "plan"), want);
	}
	ck_assert(json_real_value(json_object_get(o, "predicted_s")) > 30);
	lines_free(&L);
}
END_TEST

/* An explicit codec in the options is kept whatever the plan thinks. */
START_TEST(test_plan_explicit_codec)
{
	static const double enc[3] = { 1e9, 40e3, 20e3 },
			    ratio[3] = { 1, .25, .2 };
	const char *dir = tu_tmpdir();
	ckpt *c = open_plan(dir, 8 << 20);
	ckpt_save_advice a;
	ckpt_plan p;
	ckpt_save_opts o;
	static uint8_t data[1 << 16];
	uint64_t dim;
	ckpt_tensor t = tu_bytes_tensor("w", data, sizeof(data), &dim);

	watch_no_md(c, CKPT_AFTER_STOP);
	inject(c, 100e3, enc, ratio);
	ck_assert_int_eq(ckpt_request_save(c, unix_ns() + 5000000000LL), 0);
	ck_assert_int_eq(ckpt_should_save(c, 1, &a), 1);
	ckpt_save_opts_default(&o);
	o.reason = a.reason;
	o.codec = CKPT_CODEC_FLOAT;
	ck_assert_int_eq(ckpt_save_ex(c, 1, &t, 1, &o), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_int_eq(p.codec, CKPT_CODEC_FLOAT);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

/* ---- a periodic save in flight: finished or cancelled ---------------- */

static atomic_int g_gate; /* writes of the save in flight wait for it */
static atomic_int g_settled;

static long slow_write(int fd, uint64_t off, size_t len, long res)
{
	double t0 = tu_now_s();

	(void)fd;
	(void)off;
	(void)len;
	while (!atomic_load(&g_gate) && tu_now_s() - t0 < PATIENCE_S)
		usleep(1000);
	return res;
}

static void on_settled(void *arg, int action)
{
	(void)arg;
	atomic_store(&g_settled, action);
	atomic_store(&g_gate, 1);
}

static void inflight_case(int want)
{
	/* cancel: a slow disk, the periodic save's rest takes ~800 s, the
	 * notice's 0.3 s; finish: everything is fast */
	static const double enc[3] = { 1e9, 1e9, 1e9 }, ratio[3] = { 1, 1, 1 };
	const char *dir = tu_tmpdir();
	ckpt *c = open_plan(dir, 16 << 20);
	eng_io io = { .write_result = slow_write };
	ckpt_save_advice a;
	ckpt_plan p;
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	struct lines L = { 0 };
	json_t *o;
	char *stepdir;

	watch_no_md(c, CKPT_AFTER_STOP);
	inject(c, want == CKPT_INFLIGHT_CANCEL ? 10e3 : 10e9, enc, ratio);
	c->plan->settled = on_settled;
	atomic_store(&g_gate, 0);
	atomic_store(&g_settled, -1);
	eng_io_set(&io);
	/* 8 MiB fits the 16 MiB pool: ckpt_save returns, writes wait */
	save_state(c, 100, CKPT_REASON_PERIODIC, 8 << 20, 0);
	ck_assert_int_eq(ckpt_poll(c, NULL), 1);
	ck_assert_int_eq(ckpt_request_save(c, unix_ns() + 600000000000LL), 0);
	ck_assert_int_eq(ckpt_should_save(c, 101, &a), 1);
	/* waits for the save in flight, whichever way it ends */
	save_state(c, 101, a.reason, 1 << 16, 1);
	eng_io_set(NULL);
	{
		int settled = atomic_load(&g_settled);

		ck_assert_int_eq(settled, want);
	}
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_int_eq(p.inflight, want);
	ck_assert_int_eq(ckpt_should_stop(c), 1);
	ck_assert_int_eq(ckpt_close(c), 0);

	c = open_plan(dir, 0);
	ck_assert_int_eq(ckpt_list(c, &steps, &n), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	stepdir = tu_step_dir(dir, 100);
	if (want == CKPT_INFLIGHT_CANCEL) {
		/* only the notice's step; nothing of step 100 is left */
		ck_assert_uint_eq(n, 1);
		ck_assert_uint_eq(steps[0].step, 101);
		ck_assert_int_ne(access(stepdir, F_OK), 0);
	} else {
		ck_assert_uint_eq(n, 2);
		ck_assert_uint_eq(steps[0].step, 100);
		ck_assert_uint_eq(steps[1].step, 101);
	}
	ckpt_free(steps);
	free(stepdir);
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	o = find_action(&L, want == CKPT_INFLIGHT_CANCEL ? "cancel" : "finish",
			100);
	ck_assert_ptr_nonnull(o);
	ck_assert_str_eq(str(o, "source"), "periodic");
	ck_assert_ptr_null(json_object_get(o, "error"));
	o = find_action(&L, "save", 101);
	ck_assert_ptr_nonnull(o);
	ck_assert_str_eq(str(o, "inflight"),
			 want == CKPT_INFLIGHT_CANCEL ? "cancel" : "finish");
	ck_assert(json_is_true(json_object_get(o, "deadline_met")));
	lines_free(&L);
}

START_TEST(test_inflight_cancel)
{
	inflight_case(CKPT_INFLIGHT_CANCEL);
}
END_TEST

START_TEST(test_inflight_finish)
{
	inflight_case(CKPT_INFLIGHT_FINISH);
}
END_TEST

/* ckpt_watch_start probes what no save measured; saves measure. */
START_TEST(test_probe_and_measure)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_plan(dir, 8 << 20);
	ckpt_plan p;

	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert(p.local_bps == 0);
	ck_assert_int_eq(
		ckpt_watch_start(
			c, &(ckpt_watch_opts){ .flags = CKPT_WATCH_NO_METADATA,
					       .time_scale = 1,
					       .timeout_sec = 60,
					       .upcoming_interval_ms = 1,
					       .backoff_min_ms = 1,
					       .backoff_max_ms = 1 }),
		0);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert(p.local_bps > 0);
	for (int k = 0; k < CKPT_CODEC_COUNT; k++) {
		ck_assert(p.encode_bps[k] > 0);
		ck_assert(p.ratio[k] > 0 && p.ratio[k] <= 1.0);
	}
	ck_assert_int_eq(p.deadline_met, -1);
	/* a 4 MiB zstd save replaces zstd's probed ratio by its own */
	{
		double before = p.ratio[CKPT_CODEC_ZSTD];
		ckpt_save_opts o;
		static uint8_t zeros[4 << 20];
		uint64_t dim;
		ckpt_tensor t =
			tu_bytes_tensor("z", zeros, sizeof(zeros), &dim);

		ckpt_save_opts_default(&o);
		o.codec = CKPT_CODEC_ZSTD;
		ck_assert_int_eq(ckpt_save_ex(c, 1, &t, 1, &o), 0);
		ck_assert_int_eq(ckpt_wait(c), 0);
		ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
		ck_assert(p.ratio[CKPT_CODEC_ZSTD] < 0.01);
		ck_assert(p.ratio[CKPT_CODEC_ZSTD] != before);
	}
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

/* A directory with a remote where the network beats the disk: the notice's
 * save goes straight to the bucket (direct sink), is committed there only,
 * and the loop is told to stop; where the disk is faster it stays local
 * and is uploaded after. _i: the handle's codec (none, float). */
START_TEST(test_plan_remote_direct)
{
	static const int codecs[2] = { CKPT_CODEC_NONE, CKPT_CODEC_FLOAT };
	const char *dir = tu_tmpdir();
	tu_server fs;
	struct eng_plan_meas m = { 0 };
	struct lines L = { 0 };
	char remote[64], path[512];
	ckpt_save_advice a;
	ckpt_settings s;
	ckpt_reader *r = NULL;
	ckpt_plan p;
	struct stat st;
	uint64_t latest = 0;
	uint16_t *back;
	ckpt *c = NULL;
	const uint64_t n = 4u << 20;

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(remote, sizeof(remote), "gs://%s/direct", BUCKET);
	ckpt_settings_default(&s);
	s.staging_bytes = 2 << 20;
	s.chunk_bytes = 64 << 10;
	s.threads = 1;
	s.files_per_host = 2;
	s.codec = codecs[_i];
	s.remote = remote;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	watch_no_md(c, CKPT_AFTER_STOP);
	save_state(c, 1, CKPT_REASON_PERIODIC, n, 1);
	ck_assert_int_eq(ckpt_upload_wait(c, 60000), 0);

	/* the network ten times the disk */
	m.local_bps = 10e6;
	m.remote_bps = 100e6;
	for (int k = 0; k < 3; k++) {
		m.enc_bps[k] = 1e9;
		m.ratio[k] = 1;
	}
	eng_plan_inject(c, &m);
	ck_assert_int_eq(ckpt_request_save(c, 0), 0);
	ck_assert_int_eq(ckpt_should_save(c, 2, &a), 1);
	save_state(c, 2, a.reason, n, 1);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_int_eq(p.dest, CKPT_PLAN_REMOTE);
	ck_assert_int_eq(p.step, 2);
	ck_assert_int_eq(p.status, 0);
	ck_assert_int_eq(ckpt_should_stop(c), 1);
	/* committed in the bucket, nothing of it in the directory */
	snprintf(path, sizeof(path), "%s/step-%020d", dir, 2);
	ck_assert_msg(stat(path, &st) < 0 && errno == ENOENT,
		      "%s exists: the save went to the disk", path);
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_int_eq(latest, 1);
	ck_assert_msg(ckpt_reader_open(&r, remote, 2, NULL) == 0, "%s",
		      ckpt_reader_errmsg(NULL));
	ck_assert_msg(ckpt_reader_verify(r, NULL, NULL) == 0, "%s",
		      ckpt_reader_errmsg(r));
	back = malloc(n);
	ck_assert_ptr_nonnull(back);
	ck_assert_int_eq(ckpt_read(r, "state", back, n), 0);
	for (uint64_t i = 0; i < n / 2; i++)
		ck_assert_uint_eq(back[i], 0x3c00 + (i >> 12) % 64);
	free(back);
	ckpt_reader_close(r);

	/* the disk faster again: local first, then uploaded */
	m.local_bps = 1e9;
	m.remote_bps = 10e6;
	eng_plan_inject(c, &m);
	ck_assert_int_eq(ckpt_request_save(c, 0), 0);
	ck_assert_int_eq(ckpt_should_save(c, 3, &a), 1);
	save_state(c, 3, a.reason, n, 1);
	ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
	ck_assert_int_eq(p.dest, CKPT_PLAN_LOCAL);
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_int_eq(latest, 3);
	ck_assert_msg(ckpt_upload_wait(c, 60000) == 0, "%s", ckpt_errmsg(c));
	ck_assert_msg(ckpt_reader_open(&r, remote, 3, NULL) == 0, "%s",
		      ckpt_reader_errmsg(NULL));
	ckpt_reader_close(r);
	ck_assert_int_eq(ckpt_close(c), 0);
	/* the journal names the plan */
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	{
		json_t *o = find_action(&L, "save", 2);

		ck_assert_ptr_nonnull(o);
		ck_assert_msg(!strncmp(str(o, "plan"), "gcs+", 4), "plan %s",
			      str(o, "plan"));
	}
	lines_free(&L);
	tu_server_stop(&fs);
}
END_TEST

/* A directory with a remote probes Cloud Storage's own pace at
 * ckpt_watch_start (no save has measured it), and leaves no object. */
START_TEST(test_remote_probe)
{
	const char *dir = tu_tmpdir();
	tu_server fs;
	char remote[64], url[256], *body = NULL;
	ckpt_watch_opts o;
	ckpt_plan p;
	double t0;
	ckpt *c;

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	setenv("CKPT_PROBE_REMOTE_MIB", "8", 1);
	snprintf(remote, sizeof(remote), "gs://%s/probed", BUCKET);
	c = open_at(dir, remote);
	ckpt_watch_opts_default(&o);
	o.flags = CKPT_WATCH_NO_METADATA; /* the probes on */
	ck_assert_msg(ckpt_watch_start(c, &o) == 0, "%s", ckpt_errmsg(NULL));
	for (t0 = tu_now_s();; usleep(10000)) {
		ck_assert_int_eq(ckpt_plan_get(c, &p), 0);
		if (p.remote_bps > 0)
			break;
		ck_assert_msg(tu_now_s() - t0 < 60, "no remote probe result");
	}
	printf("remote probe: %.0f MB/s (local probe %.0f MB/s)\n",
	       p.remote_bps / 1e6, p.local_bps / 1e6);
	ck_assert_int_eq(ckpt_close(c), 0);
	snprintf(url, sizeof(url), "%s/storage/v1/b/%s/o?prefix=probed/",
		 fs.url, BUCKET);
	ck_assert_int_eq(gt_http("GET", url, NULL, &body), 200);
	ck_assert_msg(!strstr(body, ".probe"), "probe objects left: %s", body);
	free(body);
	unsetenv("CKPT_PROBE_REMOTE_MIB");
	tu_server_stop(&fs);
}
END_TEST

/* A directory with a remote: after a notice's save, ckpt_close waits for
 * the upload to be committed in the bucket (before the deadline), since a
 * node that does not come back keeps nothing local; the journal says so. */
START_TEST(test_close_waits_upload)
{
	const char *dir = tu_tmpdir();
	tu_server fs;
	struct lines L = { 0 };
	char remote[64];
	ckpt_save_advice a;
	ckpt_settings s;
	ckpt_reader *r = NULL;
	json_t *o = NULL;
	ckpt *c = NULL;

	gt_server_start(&fs, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	snprintf(remote, sizeof(remote), "gs://%s/closing", BUCKET);
	ckpt_settings_default(&s);
	s.staging_bytes = 8 << 20;
	s.threads = 1;
	s.files_per_host = 2;
	s.codec = CKPT_CODEC_NONE;
	s.remote = remote;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	watch_no_md(c, CKPT_AFTER_STOP);
	ck_assert_int_eq(ckpt_request_save(c, unix_ns() + 60000000000LL), 0);
	ck_assert_int_eq(ckpt_should_save(c, 4, &a), 1);
	save_state(c, 4, a.reason, 64u << 20, 1);
	ck_assert_int_eq(ckpt_should_stop(c), 1);
	/* no ckpt_upload_wait: the loop exits at once */
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_msg(ckpt_reader_open(&r, remote, 4, NULL) == 0,
		      "step 4 not in the bucket after close: %s",
		      ckpt_reader_errmsg(NULL));
	ckpt_reader_close(r);
	ck_assert_int_eq(ckpt_events_read(dir, collect, &L), 0);
	for (int i = 0; i < L.n; i++)
		if (!strcmp(str(L.obj[i], "action"), "close-wait"))
			o = L.obj[i];
	ck_assert_ptr_nonnull(o);
	ck_assert(json_is_true(json_object_get(o, "committed")));
	printf("close waited %.3f s for the upload\n",
	       json_real_value(json_object_get(o, "waited_s")));
	lines_free(&L);
	tu_server_stop(&fs);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tu_tcase("journal", 120);

	tcase_add_test(tc, test_journal_dir);
	tcase_add_test(tc, test_journal_gcs);
	tcase_add_test(tc, test_journal_gcs_two_writers);
	tcase_add_test(tc, test_journal_gcs_lost_reply);
	tcase_add_test(tc, test_journal_remote);
	suite_add_tcase(s, tc);
	tc = tu_tcase("policy", 120);
	tcase_add_test(tc, test_stop_policy);
	tcase_add_test(tc, test_continue_policy);
	tcase_add_test(tc, test_failed_save_journal);
	suite_add_tcase(s, tc);
	tc = tu_tcase("plan", 120);
	tcase_add_loop_test(tc, test_plan_codec, 0, 3);
	tcase_add_test(tc, test_plan_explicit_codec);
	tcase_add_test(tc, test_inflight_cancel);
	tcase_add_test(tc, test_inflight_finish);
	tcase_add_test(tc, test_probe_and_measure);
	tcase_add_loop_test(tc, test_plan_remote_direct, 0, 2);
	tcase_add_test(tc, test_remote_probe);
	tcase_add_test(tc, test_close_waits_upload);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
