/*
 * test_maint_e2e.c - end to end: examples/toy_train under `ckptctl run`,
 * the scripted metadata server (tests/servers/fake_metadata.py) announcing
 * a stop, the VM "stopping" at the deadline, the run resuming.
 *
 * Each scenario: a reference run of the toy without checkpoints gives the
 * digest of an uninterrupted run; then `ckptctl run --location DIR` starts
 * the toy (16 MiB of state, compressed notice windows of WINDOW_MS, scaled
 * by $CKPT_TEST_TIMEOUT_MULT, and a --hold-file that keeps it from
 * finishing before the notice on a slow machine: it waits before step
 * STEPS - 30, answering notices, until the VM is back); once it trains,
 * the server announces the
 * stop (maintenance-event TERMINATE_ON_HOST_MAINTENANCE, preempted TRUE,
 * an upcoming window starting WINDOW_MS ahead) or the test sends SIGTERM
 * to `ckptctl run`, which forwards it. At the deadline the test kills
 * every toy process still alive (the VM stops), then ends the event (or,
 * for SIGTERM, starts `ckptctl run` again, as the next boot would). Checked:
 * no toy was alive at the deadline (the checkpoint was durable and the
 * toy stopped in time), exactly one save with the notice's reason, the
 * resume at exactly the step after it, every step 1..STEPS computed
 * exactly once over all processes (zero steps lost, none redone), the
 * final digest equal to the reference, and the journal's lines for the
 * save (deadline met) and the run (exit 75, restart, resume step).
 *
 * Faults: the same maintenance scenario after a series of server faults
 * (503 bursts, hangs, garbage, no Metadata-Flavor, resets, not HTTP,
 * truncated) hitting the watchers' open long-polls while the toy trains:
 * the watcher survives (the notice after them is handled as above) and
 * the toy's step times before and during the faults are printed, never
 * asserted (the machine is shared). Also: `ckptctl watch --json` prints a
 * change and a notice; `ckptctl run` gives up after --max-restarts and
 * journals it; `ckptctl events` lists the journal.
 *
 * Skipped (77) without /usr/bin/python3. Waits are bounded by PATIENCE_S.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_gcs_util.h"
#include "testutil.h"

#define ME "instance/maintenance-event"
#define PR "instance/preempted"
#define UM "instance/upcoming-maintenance"
#define PATIENCE_S 60.0
#define STEPS 200 /* the toy holds before step STEPS - 30 until the end */
#define MAX_STEPS 300
#define WINDOW_MS 6000

/* ---- time, paths ---- */

static double mult(void)
{
	const char *m = getenv("CKPT_TEST_TIMEOUT_MULT");
	double v = m ? atof(m) : 1.0;

	return v > 0 ? v : 1.0;
}

/* The notice window, stretched like the test timeouts (sanitizers). */
static unsigned window_ms(void)
{
	return (unsigned)(WINDOW_MS * mult());
}

static void sleep_s(double s)
{
	struct timespec d;

	if (s <= 0)
		return;
	d.tv_sec = (time_t)s;
	d.tv_nsec = (long)((s - (double)d.tv_sec) * 1e9);
	while (nanosleep(&d, &d) < 0 && errno == EINTR)
		;
}

/* A program built beside the tests: $ENV (set by meson) or a default. */
static const char *program(const char *env, const char *rel)
{
	const char *p = getenv(env);
	static char buf[2][1024];
	static int n;
	const char *bd = getenv("CKPT_TEST_BUILDDIR");

	if (p && *p)
		return p;
	n ^= 1;
	snprintf(buf[n], sizeof(buf[n]), "%s/../%s", bd ? bd : ".", rel);
	return buf[n];
}

#define CKPTCTL() program("CKPT_CKPTCTL", "tools/ckptctl")
#define TOY() program("CKPT_TOY_TRAIN", "examples/toy_train")

/* ---- the metadata server ---- */

/* fake_metadata.py, as GCE_METADATA_HOST of ckptctl and the toy */
static void md_start(tu_server *s)
{
	tu_server_start(s, "fake_metadata.py", NULL);
	setenv("GCE_METADATA_HOST", s->host, 1);
}

static void md_call(const tu_server *s, const char *method, const char *path,
		    const char *body)
{
	char url[256], *resp = NULL;
	long st;

	snprintf(url, sizeof(url), "%s/_fake/%s", s->url, path);
	st = gt_http(method, url, body, &resp);
	ck_assert_msg(st == 200, "%s %s %s: HTTP %ld %s", method, path,
		      body ? body : "", st, resp ? resp : "");
	free(resp);
}

static void md_set(const tu_server *s, const char *key, const char *json_value)
{
	char body[1024];

	snprintf(body, sizeof(body), "{\"key\": \"%s\", \"value\": %s}", key,
		 json_value);
	md_call(s, "POST", "set", body);
}

/* Until n long-polls on key are open (every watcher is back), within
 * PATIENCE_S (scaled). The server's wait is asked in slices shorter than
 * the HTTP client's own 30 s timeout. */
static void md_wait_polls(const tu_server *s, const char *key, int n)
{
	double t0 = tu_now_s();
	char url[256], *resp = NULL;
	long st;

	for (;;) {
		snprintf(url, sizeof(url),
			 "%s/_fake/wait?long_polls=%d&key=%s&timeout=20",
			 s->url, n, key);
		st = gt_http("GET", url, NULL, &resp);
		if (st == 200 || st != 408 ||
		    tu_now_s() - t0 >= PATIENCE_S * mult())
			break;
		free(resp);
		resp = NULL;
	}
	ck_assert_msg(st == 200, "%d long-polls on %s not open after %.0f s: "
		      "HTTP %ld %s", n, key, tu_now_s() - t0, st,
		      resp ? resp : "");
	free(resp);
}

/* ---- processes ---- */

/* Starts argv with stdout to `out` and stderr to `err`, in a process
 * group of its own (so teardown reaches its children), killed if the test
 * dies. `no_location`: without CKPT_LOCATION in its environment. */
static pid_t spawn(const char *const *argv, const char *out, const char *err,
		   int no_location)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int o = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
		int e = open(err, O_WRONLY | O_CREAT | O_APPEND, 0644);

		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
			_exit(126);
		if (no_location)
			unsetenv("CKPT_LOCATION");
		unsetenv("CKPT_RESUME_STEP");
		unsetenv("CKPT_RUN_ID");
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* Wait status of pid within PATIENCE_S (scaled), else kill its group and
 * fail. */
static int wait_exit(pid_t pid, const char *what)
{
	double t0 = tu_now_s();
	int st;

	while (tu_now_s() - t0 < PATIENCE_S * mult()) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return st;
		usleep(20000);
	}
	tu_dump_stacks(pid, what);
	kill(-pid, SIGKILL);
	waitpid(pid, &st, 0);
	ck_abort_msg("%s did not finish in %.0f s", what, PATIENCE_S * mult());
	return -1;
}

static char *slurp(const char *path)
{
	uint8_t *b = NULL;
	size_t n = 0;

	if (tu_read_file(path, &b, &n))
		return strdup("");
	b = realloc(b, n + 1);
	ck_assert_ptr_nonnull(b);
	b[n] = 0;
	return (char *)b;
}

/* Until the file holds `needle`. */
static void log_wait(const char *path, const char *needle)
{
	double t0 = tu_now_s();

	while (tu_now_s() - t0 < PATIENCE_S * mult()) {
		char *s = slurp(path);
		int found = strstr(s, needle) != NULL;

		free(s);
		if (found)
			return;
		usleep(20000);
	}
	{ /* what the toy did say, and ckptctl run (run.err beside it) */
		const char *sl = strrchr(path, '/');
		char *s = slurp(path),
		     *e = tu_path("%.*s/run.err", sl ? (int)(sl - path) : 1,
				  sl ? path : ".");
		char *es = slurp(e);

		fprintf(stderr, "--- %s:\n%s--- %s:\n%s---\n", path, s, e, es);
		tu_dump_stacks(getpid(), "the test and everything it started");
		free(s);
		free(es);
		free(e);
	}
	ck_abort_msg("%s: no '%s' after %.0f s", path, needle,
		     PATIENCE_S * mult());
}

/* ---- the toy's output ---- */

struct toylog {
	unsigned count[MAX_STEPS + 2]; /* times each step was computed */
	double ms[MAX_STEPS + 2];      /* compute time of its last run */
	int saves;
	uint64_t save_step;
	char save_reason[32];
	int stops, resumes;
	uint64_t stop_step, resume_step, first_after_resume;
	int done;
	uint64_t done_step;
	char digest[32];
	pid_t pids[32];
	int npids;
};

static void parse_toy(const char *path, struct toylog *t)
{
	char *all = slurp(path), *save = NULL, *line;
	int after_resume = 0;

	memset(t, 0, sizeof(*t));
	for (line = strtok_r(all, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		unsigned long long s;
		double ms;
		int pid;
		char word[32];

		if (sscanf(line, "toy: step %llu %lf", &s, &ms) == 2) {
			ck_assert_uint_le(s, MAX_STEPS);
			t->count[s]++;
			t->ms[s] = ms;
			if (after_resume) {
				t->first_after_resume = s;
				after_resume = 0;
			}
		} else if (sscanf(line, "toy: save %llu %31s", &s, word) == 2) {
			t->saves++;
			t->save_step = s;
			snprintf(t->save_reason, sizeof(t->save_reason), "%s",
				 word);
		} else if (sscanf(line, "toy: stop %llu", &s) == 1) {
			t->stops++;
			t->stop_step = s;
		} else if (sscanf(line, "toy: resumed %llu", &s) == 1) {
			t->resumes++;
			t->resume_step = s;
			after_resume = 1;
		} else if (sscanf(line, "toy: done %llu digest=%31s", &s,
				  t->digest) == 2) {
			t->done++;
			t->done_step = s;
		} else if (sscanf(line, "toy: start pid=%d", &pid) == 1 &&
			   t->npids < 32) {
			t->pids[t->npids++] = pid;
		}
	}
	free(all);
}

/* The digest of an uninterrupted run, without checkpoints. */
static void reference(const char *dir, unsigned steps, char *digest, size_t len)
{
	char *out = tu_path("%s/ref.out", dir),
	     *err = tu_path("%s/ref.err", dir);
	char st[16];
	const char *argv[] = { TOY(), "--mib", "16", "--steps", st, NULL };
	struct toylog t;
	pid_t pid;
	int ws;

	snprintf(st, sizeof(st), "%u", steps);
	pid = spawn(argv, out, err, 1);
	ws = wait_exit(pid, "the reference run");
	ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
		      "reference run: status 0x%x", ws);
	parse_toy(out, &t);
	ck_assert_int_eq(t.done, 1);
	snprintf(digest, len, "%s", t.digest);
	free(out);
	free(err);
}

/* SIGKILLs every toy process still alive whose parent is `run` (the VM
 * stops); returns how many there were. */
static int kill_live_toys(const char *toy_out, pid_t run)
{
	struct toylog t;
	int killed = 0;

	parse_toy(toy_out, &t);
	for (int i = 0; i < t.npids; i++) {
		char *p = tu_path("/proc/%d/stat", t.pids[i]), *s = slurp(p);
		char *rp = strrchr(s, ')');
		int ppid = 0;
		char state = 0;

		if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 &&
		    ppid == run && state != 'Z') {
			kill(t.pids[i], SIGKILL);
			killed++;
			fprintf(stderr, "killed toy pid %d at the deadline\n",
				t.pids[i]);
		}
		free(s);
		free(p);
	}
	return killed;
}

/* ---- the journal ---- */

struct journal {
	int run_exit75, run_exit0, run_restart, run_start_resume;
	int save_ok; /* a save line of the expected reason, deadline met */
	uint64_t resume_at; /* "step" of the run's start after a 75 */
	const char *reason;
	uint64_t save_step;
};

static int journal_line(void *arg, uint32_t host, const char *line)
{
	struct journal *j = arg;
	json_t *o = json_loads(line, 0, NULL);
	const char *src, *act;

	fprintf(stderr, "journal h%u: %s\n", host, line);
	ck_assert_msg(json_is_object(o), "journal line: %s", line);
	src = json_string_value(json_object_get(o, "source"));
	act = json_string_value(json_object_get(o, "action"));
	ck_assert_ptr_nonnull(json_object_get(o, "time"));
	if (src && act && !strcmp(src, "run")) {
		json_int_t ex = json_integer_value(json_object_get(o, "exit"));

		if (!strcmp(act, "exit") && json_object_get(o, "exit") &&
		    ex == 75)
			j->run_exit75++;
		if (!strcmp(act, "exit") && json_object_get(o, "exit") &&
		    ex == 0)
			j->run_exit0++;
		if (!strcmp(act, "restart"))
			j->run_restart++;
		if (!strcmp(act, "start") && json_object_get(o, "step")) {
			j->run_start_resume++;
			j->resume_at = (uint64_t)json_integer_value(
				json_object_get(o, "step"));
		}
	} else if (act && !strcmp(act, "save")) {
		const char *r = json_string_value(json_object_get(o, "reason"));

		if (r && !strcmp(r, j->reason) &&
		    (uint64_t)json_integer_value(json_object_get(o, "step")) ==
			    j->save_step &&
		    json_is_true(json_object_get(o, "deadline_met")))
			j->save_ok++;
	}
	json_decref(o);
	return 0;
}

/* ---- the scenarios ---- */

enum stop_kind { S_MAINT, S_PREEMPT, S_SIGTERM, S_UPCOMING };

static const char *const reason_of[] = { "maintenance", "preempted", "sigterm",
					 "upcoming" };

/* The announcement; returns the deadline (CLOCK_MONOTONIC s). */
static double announce(const tu_server *s, enum stop_kind k, pid_t run)
{
	double t0 = tu_now_s(), w = window_ms() / 1e3;
	char doc[512], start[32], end[32];
	time_t ws;
	struct tm tm;

	switch (k) {
	case S_MAINT:
		md_set(s, ME, "\"TERMINATE_ON_HOST_MAINTENANCE\"");
		break;
	case S_PREEMPT:
		md_set(s, PR, "\"TRUE\"");
		break;
	case S_SIGTERM:
		ck_assert_int_eq(kill(run, SIGTERM), 0);
		break;
	case S_UPCOMING:
		/* RFC 3339 has whole seconds here: the window starts at the
		 * next second at least w ahead, which is the deadline */
		ws = time(NULL) + (time_t)w + 1;
		gmtime_r(&ws, &tm);
		strftime(start, sizeof(start), "%Y-%m-%dT%H:%M:%SZ", &tm);
		ws += 3600;
		gmtime_r(&ws, &tm);
		strftime(end, sizeof(end), "%Y-%m-%dT%H:%M:%SZ", &tm);
		snprintf(doc, sizeof(doc),
			 "{\"type\": \"SCHEDULED\", \"maintenance_status\": "
			 "\"PENDING\", \"can_reschedule\": \"true\", "
			 "\"window_start_time\": \"%s\", "
			 "\"window_end_time\": \"%s\"}",
			 start, end);
		md_set(s, UM, doc);
		return t0 + (double)(ws - 3600 - time(NULL));
	}
	return t0 + w;
}

/* The event is over (the VM is back). */
static void clear(const tu_server *s, enum stop_kind k)
{
	if (k == S_MAINT)
		md_set(s, ME, "\"NONE\"");
	else if (k == S_PREEMPT)
		md_set(s, PR, "\"FALSE\"");
	else if (k == S_UPCOMING)
		md_set(s, UM, "{}");
}

/* `hold`/`hold_step`: the toy's --hold-file and --hold-step. */
static void run_argv(const char **argv, const char *loc, char *steps, char *win,
		     const char *hold, const char *hold_step)
{
	int n = 0;

	argv[n++] = CKPTCTL();
	argv[n++] = "run";
	argv[n++] = "--location";
	argv[n++] = loc;
	argv[n++] = "--backoff";
	argv[n++] = "0.05,0.5";
	argv[n++] = "--upcoming-poll";
	argv[n++] = "100";
	argv[n++] = "--";
	argv[n++] = TOY();
	argv[n++] = "--mib";
	argv[n++] = "16";
	argv[n++] = "--steps";
	argv[n++] = steps;
	argv[n++] = "--step-ms";
	argv[n++] = "15";
	argv[n++] = "--codec";
	argv[n++] = "none";
	argv[n++] = "--maintenance-window-ms";
	argv[n++] = win;
	argv[n++] = "--preempted-window-ms";
	argv[n++] = win;
	argv[n++] = "--sigterm-window-ms";
	argv[n++] = win;
	argv[n++] = "--upcoming-ms";
	argv[n++] = "100";
	argv[n++] = "--backoff-max-ms";
	argv[n++] = "200";
	argv[n++] = "--hold-file";
	argv[n++] = hold;
	argv[n++] = "--hold-step";
	argv[n++] = hold_step;
	argv[n] = NULL;
}

/* Server faults hitting the watchers' open long-polls while the toy
 * trains, each followed by 10 steps; step times printed. */
static void faults(const tu_server *s, const char *toy_out, unsigned from_step)
{
	static const char *const kinds[] = {
		"{\"kind\": \"status\", \"code\": 503, \"count\": 20, "
		"\"key\": \"instance/\", \"open\": true}",
		"{\"kind\": \"hang\", \"hang_seconds\": 1.5, \"count\": 3, "
		"\"key\": \"instance/\", \"open\": true}",
		"{\"kind\": \"garbage\", \"count\": 6, \"key\": \"instance/\", "
		"\"open\": true}",
		"{\"kind\": \"no_flavor\", \"count\": 6, \"key\": "
		"\"instance/\", \"open\": true}",
		"{\"kind\": \"reset\", \"count\": 6, \"key\": \"instance/\", "
		"\"open\": true}",
		"{\"kind\": \"not_http\", \"count\": 6, \"key\": "
		"\"instance/\", \"open\": true}",
		"{\"kind\": \"truncated\", \"count\": 6, \"key\": "
		"\"instance/\", \"open\": true}",
	};
	unsigned step = from_step;
	char needle[64];
	double t1 = tu_now_s();

	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		md_call(s, "POST", "fault", kinds[i]);
		step += 10;
		snprintf(needle, sizeof(needle), "toy: step %u ", step);
		log_wait(toy_out, needle);
		fprintf(stderr, "fault %zu: through step %u at %.2f s\n", i,
			step, tu_now_s() - t1);
	}
	double t0;

	md_call(s, "DELETE", "fault", NULL);
	/* both watchers (toy's, run's) long-polling again */
	t0 = tu_now_s();
	md_wait_polls(s, ME, 2);
	md_wait_polls(s, PR, 2);
	fprintf(stderr, "faults over; watchers back in %.2f s\n", tu_now_s() - t0);
}

static void step_times(const struct toylog *t, unsigned a, unsigned b,
		       const char *label)
{
	double sum = 0, max = 0;

	for (unsigned i = a; i <= b; i++) {
		sum += t->ms[i];
		if (t->ms[i] > max)
			max = t->ms[i];
	}
	fprintf(stderr,
		"step time %s (steps %u-%u): mean %.2f ms, max %.2f ms\n",
		label, a, b, sum / (b - a + 1), max);
}

static void scenario(enum stop_kind kind, int with_faults)
{
	const char *dir = tu_tmpdir();
	char *loc = tu_path("%s/ckpt", dir), *out = tu_path("%s/toy.out", dir),
	     *err = tu_path("%s/run.err", dir), ref[32], steps[16], win[16],
	     *log, *hold = tu_path("%s/hold", dir), hold_step[16];
	unsigned nsteps = with_faults ? 260 : STEPS;
	const char *argv[40];
	tu_server s;
	struct toylog t;
	struct journal j = { 0 };
	double deadline;
	pid_t run;
	int st, killed;

	md_start(&s);
	reference(dir, nsteps, ref, sizeof(ref));
	snprintf(steps, sizeof(steps), "%u", nsteps);
	snprintf(win, sizeof(win), "%u", window_ms());
	/* However slow the machine, the toy cannot finish before the
	 * notice: it waits before step nsteps - 30 (answering notices) until
	 * the VM is back */
	ck_assert_int_eq(tu_write_file(hold, "", 0), 0);
	snprintf(hold_step, sizeof(hold_step), "%u", nsteps - 30);
	run_argv(argv, loc, steps, win, hold, hold_step);
	run = spawn(argv, out, err, 0);
	log_wait(out, "toy: step 20 ");
	if (with_faults)
		faults(&s, out, 20);
	deadline = announce(&s, kind, run);
	sleep_s(deadline - tu_now_s());
	/* the VM stops now: a toy still running loses its steps */
	killed = kill_live_toys(out, run);
	ck_assert_int_eq(unlink(hold), 0);
	if (kind == S_SIGTERM) {
		st = wait_exit(run, "ckptctl run (SIGTERM)");
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 75,
			      "run after SIGTERM: status 0x%x", st);
		/* the next boot starts the run again */
		run = spawn(argv, out, err, 0);
	} else {
		clear(&s, kind);
	}
	st = wait_exit(run, "ckptctl run");
	log = slurp(err);
	fprintf(stderr, "--- ckptctl run said:\n%s---\n", log);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "ckptctl run: status 0x%x", st);
	free(log);

	parse_toy(out, &t);
	ck_assert_msg(killed == 0,
		      "%d toy process(es) still ran at the "
		      "deadline",
		      killed);
	ck_assert_int_eq(t.saves, 1);
	ck_assert_str_eq(t.save_reason, reason_of[kind]);
	ck_assert_int_eq(t.stops, 1);
	ck_assert_uint_eq(t.stop_step, t.save_step);
	ck_assert_int_eq(t.resumes, 1);
	ck_assert_uint_eq(t.resume_step, t.save_step);
	ck_assert_uint_eq(t.first_after_resume, t.save_step + 1);
	for (unsigned i = 1; i <= nsteps; i++)
		ck_assert_msg(t.count[i] == 1,
			      "step %u computed %u times (lost or redone)", i,
			      t.count[i]);
	ck_assert_uint_eq(t.count[nsteps + 1], 0);
	ck_assert_int_eq(t.done, 1);
	ck_assert_uint_eq(t.done_step, nsteps);
	ck_assert_str_eq(t.digest, ref);
	fprintf(stderr,
		"%s: saved step %llu, resumed at %llu, %u steps each "
		"computed once, digest %s as uninterrupted\n",
		reason_of[kind], (unsigned long long)t.save_step,
		(unsigned long long)t.first_after_resume, nsteps, t.digest);
	if (with_faults) {
		step_times(&t, 2, 20, "before the faults");
		step_times(&t, 21, 90, "during the faults");
	}

	j.reason = reason_of[kind];
	j.save_step = t.save_step;
	ck_assert_int_eq(ckpt_events_read(loc, journal_line, &j), 0);
	ck_assert_int_eq(j.save_ok, 1);
	ck_assert_int_eq(j.run_exit75, 1);
	ck_assert_int_eq(j.run_exit0, 1);
	ck_assert_int_eq(j.run_start_resume, 1);
	ck_assert_uint_eq(j.resume_at, t.save_step);
	ck_assert_int_eq(j.run_restart, kind == S_SIGTERM ? 0 : 1);
	tu_server_stop(&s);
	free(loc);
	free(out);
	free(err);
	free(hold);
}

START_TEST(test_maintenance)
{
	scenario(S_MAINT, 0);
}
END_TEST

START_TEST(test_preempted)
{
	scenario(S_PREEMPT, 0);
}
END_TEST

START_TEST(test_sigterm)
{
	scenario(S_SIGTERM, 0);
}
END_TEST

START_TEST(test_upcoming)
{
	scenario(S_UPCOMING, 0);
}
END_TEST

START_TEST(test_faults)
{
	scenario(S_MAINT, 1);
}
END_TEST

/* `ckptctl watch --json`: the first values, a change with its notice, a
 * failing key and the degraded watcher, each one line. */
START_TEST(test_watch_cmd)
{
	const char *dir = tu_tmpdir();
	char *out = tu_path("%s/watch.out", dir),
	     *err = tu_path("%s/watch.err", dir), *all;
	const char *argv[] = { CKPTCTL(), "watch", "--json", NULL };
	tu_server s;
	pid_t w;
	int st;

	md_start(&s);
	w = spawn(argv, out, err, 1);
	log_wait(out, "\"key\":\"instance/preempted\",\"old\":null,"
		      "\"new\":\"FALSE\"");
	md_set(&s, ME, "\"TERMINATE_ON_HOST_MAINTENANCE\"");
	log_wait(out, "\"what\":\"value\",\"key\":\"instance/maintenance-"
		      "event\",\"old\":\"NONE\",\"new\":\"TERMINATE_ON_HOST_"
		      "MAINTENANCE\"");
	log_wait(out, "\"what\":\"notice\",\"reason\":\"maintenance\"");
	md_call(&s, "POST", "fault",
		"{\"kind\": \"status\", \"code\": 503, \"count\": 3, "
		"\"key\": \"instance/preempted\", \"open\": true}");
	log_wait(out, "\"what\":\"error\",\"key\":\"instance/preempted\","
		      "\"error\":\"HTTP 503\"");
	log_wait(out, "\"what\":\"health\",\"healthy\":false");
	ck_assert_int_eq(kill(w, SIGTERM), 0);
	st = wait_exit(w, "ckptctl watch");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	all = slurp(out);
	/* every line is one JSON object */
	for (char *p = all, *nl; *p; p = nl + 1) {
		json_t *o;

		nl = strchr(p, '\n');
		ck_assert_ptr_nonnull(nl);
		*nl = 0;
		o = json_loads(p, 0, NULL);
		ck_assert_msg(json_is_object(o), "not an object: %s", p);
		json_decref(o);
	}
	free(all);
	tu_server_stop(&s);
	free(out);
	free(err);
}
END_TEST

/* `ckptctl run` gives up after --max-restarts failures, backing off, and
 * journals every start, exit, restart and the give-up, which
 * `ckptctl events` lists. */
START_TEST(test_run_gives_up)
{
	const char *dir = tu_tmpdir();
	char *loc = tu_path("%s/ckpt", dir), *out = tu_path("%s/out", dir),
	     *err = tu_path("%s/err", dir), *ev = tu_path("%s/events", dir),
	     *text;
	const char *argv[] = { CKPTCTL(), "run",        "-n", "2",
			       "-b",      "0.01,0.02",  "-l", loc,
			       "--",      "/bin/false", NULL };
	const char *list[] = { CKPTCTL(), "events", loc, NULL };
	tu_server s;
	struct journal j = { .reason = "-" };
	tu_server fs;
	int st;

	md_start(&s);
	st = wait_exit(spawn(argv, out, err, 1), "ckptctl run");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	text = slurp(err);
	ck_assert_msg(strstr(text,
			     "giving up: 3 failures, --max-restarts is 2"),
		      "%s", text);
	free(text);
	ck_assert_int_eq(ckpt_events_read(loc, journal_line, &j), 0);
	ck_assert_int_eq(j.run_restart, 2);
	st = wait_exit(spawn(list, ev, err, 1), "ckptctl events");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	text = slurp(ev);
	fprintf(stderr, "%s", text);
	ck_assert_ptr_nonnull(strstr(text, "run       give-up"));
	ck_assert_ptr_nonnull(strstr(text, "run       restart"));
	ck_assert_ptr_nonnull(strstr(text, " exit=1"));
	free(text);

	/* the same journal on gs:// alone: one failure, no restart */
	gt_server_start(&fs, "maint");
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	argv[7] = list[2] = "gs://maint/run1"; /* -l */
	argv[3] = "0";                         /* -n */
	st = wait_exit(spawn(argv, out, err, 1), "ckptctl run (gs://)");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
	st = wait_exit(spawn(list, ev, err, 1), "ckptctl events (gs://)");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	text = slurp(ev);
	ck_assert_ptr_nonnull(strstr(text, "run       give-up"));
	free(text);
	tu_server_stop(&fs);
	tu_server_stop(&s);
	free(loc);
	free(out);
	free(err);
	free(ev);
}
END_TEST

Suite *maint_suite(void);

Suite *maint_suite(void)
{
	Suite *s = suite_create("maint_e2e");
	TCase *tc = tu_tcase("e2e", 120);

	tcase_add_test(tc, test_maintenance);
	tcase_add_test(tc, test_preempted);
	tcase_add_test(tc, test_sigterm);
	tcase_add_test(tc, test_upcoming);
	tcase_add_test(tc, test_faults);
	tcase_add_test(tc, test_watch_cmd);
	tcase_add_test(tc, test_run_gives_up);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main(maint_suite());
}
