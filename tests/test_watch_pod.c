/*
 * test_watch_pod.c - pod-wide agreement on the step to save through
 * save-request objects (engine/watch_pod.c, SPEC.md "Pod save requests").
 *
 * Four processes (fork) are the four hosts of a pod (host_count 4), each
 * with its own directory and settings.remote on one loopback fake Cloud
 * Storage bucket (tests/servers/fake_gcs.py, started by gk_main). Two
 * loopback metadata servers (tests/servers/fake_metadata.py): one that
 * announces TERMINATE_ON_HOST_MAINTENANCE and a quiet one, so only the
 * hosts pointed at the first see a notice. A host's loop asks
 * ckpt_should_save() at every step, saves when told (checking that the
 * advice is the pod's, with the notice's reason) and keeps stepping until
 * the step it saved last is committed in the bucket. Checked: every host
 * ends on the same committed step, which is the last request's target;
 * the bucket holds exactly one COMMIT and the step is complete; the
 * requests the hosts say they created are the objects in the bucket.
 *
 * Cases: one host announces (hosts in lockstep, as on a pod); two hosts
 * announce at once (one request wins, the other host adopts it); one host
 * much slower than the others (free-running, the slow one announces, so
 * the others are far past its target: the rule for a passed target);
 * and, in one process with two handles and steps chosen by the test, the
 * passed-target rule exactly: host 1 is past request 1's target, raises
 * request 2 ("missed") and both hosts save its target, never before.
 * Nothing is timed: waits are bounded by PATIENCE_S and only fail then.
 */
#include "test_gcs_ckpt.h"
#include "test_gcs_util.h"
#include "testutil.h"

#include "ckpt.h"
#include "gcs.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUCKET "ckpt-podwatch"
#define HOSTS 4
#define ME "instance/maintenance-event"
#define PATIENCE_S 120.0
#define MAXSAVES 8

/* ---- a metadata server per role ---------------------------------- */

static void pm_announce(const tu_server *s)
{
	char url[128], *resp = NULL;
	long st;

	snprintf(url, sizeof(url), "http://%s/_fake/set", s->host);
	st = gt_http("POST", url,
		     "{\"key\": \"" ME "\", \"value\": "
		     "\"TERMINATE_ON_HOST_MAINTENANCE\"}",
		     &resp);
	ck_assert_msg(st == 200, "announce: HTTP %ld %s", st, resp ? resp : "");
	free(resp);
}

/* ---- one host ----------------------------------------------------- */

/* Shared by the test and its hosts (MAP_SHARED before fork). */
struct shared {
	atomic_ullong step[HOSTS]; /* last step asked */
	atomic_int finished[HOSTS];
	atomic_uint nsaved[HOSTS];
	atomic_ullong saved[HOSTS][MAXSAVES];
	atomic_ullong final[HOSTS]; /* the committed step it ended on */
	atomic_ullong made[HOSTS], lost[HOSTS];
	char why[HOSTS][512];
};

struct pod_case {
	const char *run;   /* prefix in the bucket, directory name */
	unsigned announce; /* bit h: host h sees the notice */
	unsigned step_us[HOSTS];
	int lockstep; /* hosts wait for each other at every step */
};

static void fast_opts(ckpt_watch_opts *o)
{
	ckpt_watch_opts_default(o);
	o->every_seconds = 0;
	o->timeout_sec = 2;
	o->http_slack_ms = 1000;
	o->upcoming_interval_ms = 1000;
	o->backoff_min_ms = 20;
	o->backoff_max_ms = 200;
	o->pod_interval_ms = 50;
	o->pod_slack_ms = 200;
}

static ckpt *pod_open(const char *dir, const char *run, uint32_t h,
		      uint32_t hosts, char *remote, size_t rlen)
{
	ckpt_settings s;
	ckpt *c = NULL;

	snprintf(remote, rlen, "gs://" BUCKET "/%s", run);
	ckpt_settings_default(&s);
	s.staging_bytes = 1u << 20;
	s.chunk_bytes = 64u << 10;
	s.threads = 1;
	s.files_per_host = 1;
	s.codec = CKPT_CODEC_NONE;
	s.host_index = h;
	s.host_count = hosts;
	s.remote = remote;
	if (ckpt_open(&c, dir, &s) < 0)
		return NULL;
	return c;
}

/* Saves host h's small tensor as `step` with the advice's reason. */
static int pod_save(ckpt *c, uint32_t h, uint64_t step,
		    const ckpt_save_advice *a)
{
	uint64_t shape[1] = { 1000 + h };
	ckpt_tensor t;
	ckpt_save_opts o;
	char name[32];
	tu_set set;
	int r;

	tu_set_init(&set);
	snprintf(name, sizeof(name), "host%u.w", h);
	tu_set_add(&set, name, CKPT_F32, 1, shape, h * 1000 + step);
	tu_set_view(&set, &t);
	ckpt_save_opts_default(&o);
	o.reason = a->reason;
	r = ckpt_wait(c);
	if (!r)
		r = ckpt_save_ex(c, step, &t, 1, &o);
	if (!r)
		r = ckpt_wait(c);
	tu_set_free(&set);
	return r;
}

#define HFAIL(...)                                                     \
	do {                                                           \
		snprintf(sh->why[h], sizeof(sh->why[h]), __VA_ARGS__); \
		atomic_store(&sh->finished[h], 1);                     \
		_exit(1);                                              \
	} while (0)

/* What a host's journal says of step `step`: bit 0 a pod line
 * (request or adopt) with that target, bit 1 its save, bit 2 the stop. */
struct jscan {
	uint64_t step;
	unsigned seen;
	char missed[64]; /* "missed" line: "request:target" */
};

static int jscan_line(void *arg, uint32_t host, const char *line)
{
	struct jscan *j = arg;
	json_t *o = json_loads(line, 0, NULL);
	const char *src = json_string_value(json_object_get(o, "source"));
	const char *act = json_string_value(json_object_get(o, "action"));
	uint64_t tgt =
		(uint64_t)json_integer_value(json_object_get(o, "target"));
	uint64_t st = (uint64_t)json_integer_value(json_object_get(o, "step"));

	(void)host;
	if (src && act && !strcmp(src, "pod")) {
		if ((!strcmp(act, "request") || !strcmp(act, "adopt")) &&
		    tgt == j->step)
			j->seen |= 1;
		if (!strcmp(act, "stop") && tgt == j->step)
			j->seen |= 4;
		if (!strcmp(act, "missed"))
			snprintf(j->missed, sizeof(j->missed), "%lld:%llu",
				 (long long)json_integer_value(
					 json_object_get(o, "request")),
				 (unsigned long long)tgt);
	} else if (act && !strcmp(act, "save") && st == j->step) {
		j->seen |= 2;
	}
	json_decref(o);
	return 0;
}

static int dump_line(void *arg, uint32_t host, const char *line)
{
	fprintf(stderr, "  h%u %s: %s\n", host, (const char *)arg, line);
	return 0;
}

static unsigned journal_scan(const char *dir, uint64_t step, struct jscan *j)
{
	memset(j, 0, sizeof(*j));
	j->step = step;
	if (ckpt_events_read(dir, jscan_line, j) < 0)
		return 0;
	return j->seen;
}

/* Lockstep: step s starts once every running host has asked step s-1. */
static int wait_pod(struct shared *sh, uint32_t h, uint64_t s, double t0)
{
	uint32_t o;

	for (o = 0; o < HOSTS; o++)
		while (o != h && !atomic_load(&sh->finished[o]) &&
		       atomic_load(&sh->step[o]) + 1 < s) {
			if (tu_now_s() - t0 > PATIENCE_S)
				return -1;
			usleep(100);
		}
	return 0;
}

static void host_main(struct shared *sh, const struct pod_case *pc, uint32_t h,
		      const char *md)
{
	char *dir = tu_path("%s/%s/host%u", tu_tmpdir(), pc->run, h);
	struct gcs_client *gc = gk_client(gk_srv.url);
	char remote[128], *commit = NULL;
	double t0 = tu_now_s(), checked = 0;
	uint64_t step, pending = 0;
	ckpt_watch_opts o;
	ckpt_watch_info info;
	ckpt *c;

	setenv("GCE_METADATA_HOST", md, 1);
	c = pod_open(dir, pc->run, h, HOSTS, remote, sizeof(remote));
	if (!c)
		HFAIL("open: %s", ckpt_errmsg(NULL));
	fast_opts(&o);
	if (ckpt_watch_start(c, &o) < 0)
		HFAIL("watch_start: %s", ckpt_errmsg(NULL));
	for (step = 1;; step++) {
		ckpt_save_advice a;

		if (tu_now_s() - t0 > PATIENCE_S) {
			ckpt_upload_status us;

			memset(&us, 0, sizeof(us));
			ckpt_upload_status_get(c, &us);
			ckpt_events_read(dir, dump_line, (void *)pc->run);
			HFAIL("no committed pod step after %.0f s (step %" PRIu64
			      ", saved %" PRIu64 "; upload of step %" PRIu64
			      ": state %d, %s)",
			      PATIENCE_S, step, pending, us.step, us.state,
			      us.msg);
		}
		if (pc->lockstep && wait_pod(sh, h, step, t0) < 0)
			HFAIL("lockstep: the pod stopped at step %" PRIu64,
			      step);
		usleep(pc->step_us[h]);
		atomic_store(&sh->step[h], step);
		if (ckpt_should_save(c, step, &a)) {
			unsigned k = atomic_load(&sh->nsaved[h]);

			if (!(a.flags & CKPT_ADVICE_POD) ||
			    a.reason != CKPT_REASON_MAINTENANCE ||
			    !a.deadline_ns)
				HFAIL("step %" PRIu64
				      ": advice reason %d flags "
				      "%u deadline %" PRId64,
				      step, a.reason, a.flags, a.deadline_ns);
			if (k < MAXSAVES)
				atomic_store(&sh->saved[h][k], step);
			atomic_store(&sh->nsaved[h], k + 1);
			if (pod_save(c, h, step, &a) < 0)
				HFAIL("save %" PRIu64 ": %s", step,
				      ckpt_errmsg(c));
			pending = step;
			free(commit);
			commit = gk_object(pc->run, step, "COMMIT");
		}
		/* a committed step ends the run (checked every 50 ms) */
		if (pending && tu_now_s() - checked > 0.05) {
			checked = tu_now_s();
			if (gk_exists(gc, BUCKET, commit) == 1)
				break;
		}
	}
	/* the STOP policy: should_stop once no later request came */
	while (!ckpt_should_stop(c)) {
		if (tu_now_s() - t0 > PATIENCE_S)
			HFAIL("step %" PRIu64 " committed, never told to stop",
			      pending);
		usleep(1000);
	}
	if (ckpt_watch_state(c, &info) < 0)
		HFAIL("watch_state: %s", ckpt_errmsg(c));
	{
		struct jscan j;
		unsigned seen = journal_scan(dir, pending, &j);

		if (seen != 7)
			HFAIL("journal of step %" PRIu64 ": %s%s%s missing",
			      pending, seen & 1 ? "" : "pod request/adopt ",
			      seen & 2 ? "" : "save ", seen & 4 ? "" : "stop");
	}
	atomic_store(&sh->made[h], info.pod_requests_made);
	atomic_store(&sh->lost[h], info.pod_requests_lost);
	atomic_store(&sh->final[h], pending);
	if (ckpt_close(c) < 0)
		HFAIL("close: %s", ckpt_errmsg(NULL));
	atomic_store(&sh->finished[h], 1);
	free(commit);
	free(dir);
	gcs_client_free(gc);
	_exit(0);
}

/* ---- what the bucket holds ---------------------------------------- */

struct bucket_view {
	long commits;
	uint64_t commit_step;
	uint64_t nreq;
	json_t *last; /* the highest-numbered request */
};

static void bucket_view(struct gcs_client *gc, const char *run,
			struct bucket_view *v)
{
	struct gcs_list l;
	size_t i, plen = strlen(run);
	uint64_t maxn = 0;

	memset(v, 0, sizeof(*v));
	ck_assert_int_eq(gcs_list(gc, BUCKET, run, NULL, &l), 0);
	for (i = 0; i < l.n_items; i++) {
		const char *n = l.items[i].name + plen;
		unsigned long long num, step;

		if (sscanf(n, "/step-%llu/COMMIT", &step) == 1 &&
		    !strcmp(n + strlen(n) - 7, "/COMMIT")) {
			v->commits++;
			v->commit_step = step;
		}
		if (sscanf(n, "/pod/request-%llu", &num) == 1) {
			v->nreq++;
			if (num > maxn)
				maxn = num;
		}
	}
	gcs_list_free(&l);
	if (maxn) {
		char *name = tu_path("%s/pod/request-%010" PRIu64, run, maxn);
		void *doc = NULL;
		size_t len = 0;

		ck_assert_int_eq(gcs_get(gc, BUCKET, name, 0, &doc, &len, NULL),
				 0);
		v->last = json_loadb(doc, len, 0, NULL);
		ck_assert_ptr_nonnull(v->last);
		ck_assert_int_eq(
			json_integer_value(json_object_get(v->last, "request")),
			(json_int_t)maxn);
		free(doc);
		free(name);
	}
}

static uint64_t jint(json_t *o, const char *k)
{
	return (uint64_t)json_integer_value(json_object_get(o, k));
}

/* Runs one 4-host case; returns the number of requests in the bucket. */
static uint64_t run_pod(const struct pod_case *pc, int slow_host)
{
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct gcs_client *gc = gk_client(gk_srv.url);
	tu_server loud, quiet;
	struct bucket_view v;
	pid_t pid[HOSTS];
	int st[HOSTS];
	uint64_t made = 0, lost = 0;
	double t0;
	uint32_t h;
	char why[512];

	ck_assert_ptr_ne(sh, MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	tu_server_start(&loud, "fake_metadata.py", NULL);
	tu_server_start(&quiet, "fake_metadata.py", NULL);
	for (h = 0; h < HOSTS; h++) {
		pid[h] = fork();
		ck_assert_int_ge(pid[h], 0);
		if (pid[h] == 0)
			host_main(sh, pc, h,
				  pc->announce & (1u << h) ? loud.host :
							     quiet.host);
	}
	/* announce once every host is stepping (and, with a slow host,
	 * once the others are well ahead of it) */
	t0 = tu_now_s();
	for (;;) {
		uint64_t min = UINT64_MAX, fast = UINT64_MAX;

		for (h = 0; h < HOSTS; h++) {
			uint64_t s = atomic_load(&sh->step[h]);

			ck_assert_msg(!atomic_load(&sh->finished[h]),
				      "host %u stopped: %s", h, sh->why[h]);
			min = s < min ? s : min;
			if ((int)h != slow_host)
				fast = s < fast ? s : fast;
		}
		if (min >= 20 &&
		    (slow_host < 0 ||
		     fast >= atomic_load(&sh->step[slow_host]) + 300))
			break;
		ck_assert_msg(tu_now_s() - t0 < PATIENCE_S, "hosts not stepping");
		usleep(5000);
	}
	pm_announce(&loud);
	for (h = 0; h < HOSTS; h++)
		ck_assert_int_eq(waitpid(pid[h], &st[h], 0), pid[h]);
	for (h = 0; h < HOSTS; h++) {
		unsigned k, n = atomic_load(&sh->nsaved[h]);

		printf("%s: host %u saved", pc->run, h);
		for (k = 0; k < n && k < MAXSAVES; k++)
			printf(" %llu", (unsigned long long)sh->saved[h][k]);
		printf("; made %llu, lost %llu requests; %s\n",
		       (unsigned long long)sh->made[h],
		       (unsigned long long)sh->lost[h], sh->why[h]);
	}
	for (h = 0; h < HOSTS; h++) {
		ck_assert_msg(WIFEXITED(st[h]) && WEXITSTATUS(st[h]) == 0,
			      "host %u: status 0x%x: %s", h, st[h], sh->why[h]);
		ck_assert_uint_ne(sh->final[h], 0);
		ck_assert_msg(sh->final[h] == sh->final[0],
			      "host %u ended on step %llu, host 0 on %llu", h,
			      (unsigned long long)sh->final[h],
			      (unsigned long long)sh->final[0]);
		made += sh->made[h];
		lost += sh->lost[h];
	}
	bucket_view(gc, pc->run, &v);
	printf("%s: %llu request(s), %llu lost race(s), committed step %llu\n",
	       pc->run, (unsigned long long)v.nreq, (unsigned long long)lost,
	       (unsigned long long)sh->final[0]);
	ck_assert_int_eq(v.commits, 1);
	ck_assert_uint_eq(v.commit_step, sh->final[0]);
	ck_assert_uint_eq(made, v.nreq);
	ck_assert_uint_eq(jint(v.last, "target"), sh->final[0]);
	ck_assert_msg(gk_step_complete(gc, BUCKET, pc->run, sh->final[0], HOSTS,
				       why, sizeof(why)) == 0,
		      "%s", why);
	json_decref(v.last);
	tu_server_stop(&loud);
	tu_server_stop(&quiet);
	munmap(sh, sizeof(*sh));
	gcs_client_free(gc);
	return v.nreq;
}

START_TEST(pod_one_announces)
{
	const struct pod_case pc = { .run = "one",
				     .announce = 1u << 2,
				     .step_us = { 2000, 2000, 2000, 2000 },
				     .lockstep = 1 };

	ck_assert_uint_ge(run_pod(&pc, -1), 1);
}
END_TEST

START_TEST(pod_two_announce)
{
	const struct pod_case pc = { .run = "two",
				     .announce = (1u << 0) | (1u << 1),
				     .step_us = { 2000, 2000, 2000, 2000 },
				     .lockstep = 1 };

	ck_assert_uint_ge(run_pod(&pc, -1), 1);
}
END_TEST

START_TEST(pod_slow_host)
{
	const struct pod_case pc = { .run = "slow",
				     .announce = 1u << 3,
				     .step_us = { 500, 500, 500, 5000 },
				     .lockstep = 0 };

	ck_assert_uint_ge(run_pod(&pc, 3), 1);
}
END_TEST

/* ---- the passed-target rule, step by step ------------------------- */

static void wait_info(ckpt *c, uint64_t request, ckpt_watch_info *info)
{
	double t0 = tu_now_s();

	for (;;) {
		ck_assert_int_eq(ckpt_watch_state(c, info), 0);
		if (info->pod_state == 2 && info->pod_request >= request)
			return;
		ck_assert_msg(tu_now_s() - t0 < PATIENCE_S,
			      "no pod request %" PRIu64
			      " (state %u, at %" PRIu64 ")",
			      request, info->pod_state, info->pod_request);
		usleep(5000);
	}
}

/* Asks steps from..to (inclusive); 1 must come exactly at `to`. */
static void ask_until(ckpt *c, uint32_t h, uint64_t from, uint64_t to)
{
	ckpt_save_advice a;
	uint64_t s;

	for (s = from; s < to; s++)
		ck_assert_msg(ckpt_should_save(c, s, &a) == 0,
			      "host %u: save at %" PRIu64 " before %" PRIu64, h,
			      s, to);
	ck_assert_int_eq(ckpt_should_save(c, to, &a), 1);
	ck_assert_uint_eq(a.flags, CKPT_ADVICE_POD);
	ck_assert_int_eq(a.reason, CKPT_REASON_REQUESTED);
	ck_assert_int_ne(a.deadline_ns, 0);
	ck_assert_int_eq(pod_save(c, h, to, &a), 0);
	ck_assert_int_eq(ckpt_should_save(c, to, &a), 0);
}

START_TEST(pod_missed_target)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	char *dir0 = tu_path("%s/missed/host0", tu_tmpdir());
	char *dir1 = tu_path("%s/missed/host1", tu_tmpdir());
	char r0[128], r1[128];
	ckpt *a = pod_open(dir0, "missed", 0, 2, r0, sizeof(r0));
	ckpt *b = pod_open(dir1, "missed", 1, 2, r1, sizeof(r1));
	ckpt_watch_info ia, ib;
	ckpt_watch_opts o;
	struct bucket_view v;
	uint64_t s, t1, t2;
	char *commit;
	double t0;

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	fast_opts(&o);
	o.flags = CKPT_WATCH_NO_METADATA;
	ck_assert_int_eq(ckpt_watch_start(a, &o), 0);
	ck_assert_int_eq(ckpt_watch_start(b, &o), 0);
	/* host 0 at step 10 (5 ms a step), host 1 far ahead at 100000 */
	for (s = 1; s <= 10; s++) {
		ck_assert_int_eq(ckpt_should_save(a, s, NULL), 0);
		usleep(5000);
	}
	ck_assert_int_eq(ckpt_should_save(b, 1, NULL), 0);
	ck_assert_int_eq(ckpt_should_save(b, 99999, NULL), 0);
	usleep(5000);
	ck_assert_int_eq(ckpt_should_save(b, 100000, NULL), 0);
	wait_info(a, 0, &ia);
	wait_info(b, 0, &ib);

	/* host 0 is asked to save: request 1, a target near its step */
	ck_assert_int_eq(ckpt_request_save(a, (int64_t)time(NULL) * 1000000000 +
						      60000000000LL),
			 0);
	wait_info(a, 1, &ia);
	t1 = ia.pod_target;
	ck_assert_uint_eq(ia.pod_request, 1);
	ck_assert_uint_gt(t1, 10);
	ck_assert_uint_lt(t1, 99999);
	/* host 1 is past it: it raises request 2 from its own step */
	wait_info(b, 2, &ib);
	t2 = ib.pod_target;
	ck_assert_uint_eq(ib.pod_request, 2);
	ck_assert_uint_gt(t2, 100000);
	ck_assert_uint_eq(ib.pod_requests_made, 1);
	wait_info(a, 2, &ia);
	ck_assert_uint_eq(ia.pod_target, t2);
	ck_assert_uint_eq(ia.pod_requests_made, 1);

	/* both save t2, and nothing before it */
	ask_until(a, 0, 11, t2);
	ask_until(b, 1, 100001, t2);
	commit = gk_object("missed", t2, "COMMIT");
	for (t0 = tu_now_s(); gk_exists(gc, BUCKET, commit) != 1; usleep(10000))
		ck_assert_msg(tu_now_s() - t0 < PATIENCE_S, "%s never committed",
			      commit);
	bucket_view(gc, "missed", &v);
	ck_assert_int_eq(v.commits, 1);
	ck_assert_uint_eq(v.nreq, 2);
	ck_assert_uint_eq(jint(v.last, "target"), t2);
	ck_assert_uint_eq(jint(v.last, "supersedes"), 1);
	ck_assert_uint_eq(jint(v.last, "host"), 1);
	ck_assert_str_eq(json_string_value(json_object_get(v.last, "why")),
			 "missed");
	ck_assert_str_eq(json_string_value(json_object_get(v.last, "reason")),
			 "requested");
	/* the journals say so: host 1 missed request 1, both saved t2 */
	{
		struct jscan j;
		char want[64];

		snprintf(want, sizeof(want), "1:%" PRIu64, t1);
		ck_assert_uint_eq(journal_scan(dir1, t2, &j) & 3, 3);
		ck_assert_str_eq(j.missed, want);
		ck_assert_uint_eq(journal_scan(dir0, t2, &j) & 3, 3);
		ck_assert_str_eq(j.missed, "");
	}
	/* the STOP policy: both are told to stop once no later request
	 * came (no deadline on this: the pod thread decides) */
	for (t0 = tu_now_s(); !ckpt_should_stop(a) || !ckpt_should_stop(b);
	     usleep(1000))
		ck_assert_msg(tu_now_s() - t0 < PATIENCE_S, "never told to stop");
	printf("missed: request 1 target %" PRIu64 ", request 2 target %" PRIu64
	       "\n",
	       t1, t2);
	json_decref(v.last);
	ck_assert_int_eq(ckpt_close(a), 0);
	ck_assert_int_eq(ckpt_close(b), 0);
	free(commit);
	free(dir0);
	free(dir1);
	gcs_client_free(gc);
}
END_TEST

/* A bucket that accepts connections and never answers: ckpt_close does
 * not wait for the pod watcher's request to time out (its client's
 * deadline is 10 s; close cancels it). */
START_TEST(pod_close_hung_bucket)
{
	char *dir = tu_path("%s/hung/host0", tu_tmpdir());
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	char host[64], remote[128], *old;
	ckpt_watch_info info;
	ckpt_watch_opts o;
	double t0, dt;
	int fd;
	ckpt *c;

	/* listening, never accepting: connects succeed, nothing answers */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fd, 64), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(host, sizeof(host), "127.0.0.1:%u", ntohs(sa.sin_port));
	old = strdup(getenv("STORAGE_EMULATOR_HOST"));
	setenv("STORAGE_EMULATOR_HOST", host, 1);
	c = pod_open(dir, "hung", 0, 2, remote, sizeof(remote));
	ck_assert_ptr_nonnull(c);
	fast_opts(&o);
	o.flags = CKPT_WATCH_NO_METADATA;
	ck_assert_int_eq(ckpt_watch_start(c, &o), 0);
	usleep(300000); /* its first read is in flight, unanswered */
	ck_assert_int_eq(ckpt_watch_state(c, &info), 0);
	ck_assert_uint_ne(info.pod_state, 2); /* never ready */
	t0 = tu_now_s();
	ck_assert_int_eq(ckpt_close(c), 0);
	dt = tu_now_s() - t0;
	printf("hung bucket: ckpt_close took %.3f s\n", dt);
	ck_assert_msg(dt < 5, "ckpt_close waited %.1f s on a hung bucket", dt);
	setenv("STORAGE_EMULATOR_HOST", old, 1);
	free(old);
	close(fd);
	free(dir);
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { pod_missed_target, pod_one_announces,
				       pod_two_announce, pod_slow_host,
				       pod_close_hung_bucket };

	return gk_main(BUCKET, "watch_pod", 600, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
