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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_gcs_util.h"
#include "testutil.h"

#define PATIENCE_S 30.0
#define BUCKET "plan-bkt"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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
	o.flags = CKPT_WATCH_NO_METADATA;
	o.every_seconds = 0;
	o.after_save = after_save;
	ck_assert_msg(ckpt_watch_start(c, &o) == 0, "%s", ckpt_errmsg(NULL));
}

static void save(ckpt *c, uint64_t step, int reason)
{
	static uint8_t data[8192];
	uint64_t shape[1] = { sizeof(data) };
	ckpt_tensor t = { .name = "w",
			  .dtype = CKPT_U8,
			  .ndim = 1,
			  .shape = shape,
			  .data = data,
			  .nbytes = sizeof(data) };
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
	ck_assert_int_gt(tu_file_size(tu_path("%s/events/h00003.jsonl", dir)),
			 0);

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
	struct gt_server fs;
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
	gt_server_stop(&fs);
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
	t0 = now_s();
	while (!ckpt_should_save(c, 2, &a) && now_s() - t0 < PATIENCE_S)
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

/* A directory with a remote: the notice's journal lines reach the bucket
 * (the rate limit leaves the last ones to ckpt_close). */
START_TEST(test_journal_remote)
{
	const char *dir = tu_tmpdir();
	struct gt_server fs;
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
	lines_free(&L);
	lines_free(&R);
	gt_server_stop(&fs);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tu_tcase("journal", 120);

	tcase_add_test(tc, test_journal_dir);
	tcase_add_test(tc, test_journal_gcs);
	tcase_add_test(tc, test_journal_remote);
	suite_add_tcase(s, tc);
	tc = tu_tcase("policy", 120);
	tcase_add_test(tc, test_stop_policy);
	tcase_add_test(tc, test_continue_policy);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
