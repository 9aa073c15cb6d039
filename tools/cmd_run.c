/*
 * cmd_run.c - ckptctl run: run a training command until it finishes,
 * restarting it after a failure or a stop after a checkpoint.
 *
 * Design note: the shell loop `while ! train; do sleep 1; done` done
 * right. One child at a time, started with the environment the contract
 * of issue 7 names (CKPT_LOCATION, CKPT_RESUME_STEP = the latest committed
 * step at the location, read afresh before each start, CKPT_RESTART_COUNT,
 * CKPT_RUN_ID). With --remote (a directory's Cloud Storage copy) the step
 * is the newest of both, and CKPT_RESUME_LOCATION says where it is: a
 * notice's save the planner sent straight to the bucket is there only,
 * and so is everything after the node was recreated. Its exit decides:
 *   0                      done: exit 0;
 *   75 (CKPT_EXIT_RESTART) it stopped on purpose after a durable
 *                          checkpoint forced by a notice: restart, not a
 *                          failure, once no stop is announced any more
 *                          (see below), without backoff;
 *   anything else          a failure: restart after a jittered, doubling
 *                          backoff, until --max-restarts failures.
 * SIGINT, SIGTERM and SIGCHLD are blocked and read from a signalfd, so the
 * loop never races a signal: SIGTERM/SIGINT are forwarded to the child
 * (unless the terminal sent them, which reached the child already: same
 * process group), and no restart follows; run then exits with the child's
 * status. The child is started with posix_spawnp (run has threads: no
 * code of ours runs between fork and exec) and an environment built
 * before; a failed exec ends run at once (127): restarting cannot help.
 *
 * Why wait after a 75: the child stopped because the VM is about to stop
 * (maintenance-event not NONE, preempted TRUE, an upcoming window
 * scheduled). A new child would see the same notice at once, save and stop
 * again, and one killed by the VM between its start and that save would
 * lose steps. So run keeps its own watcher (a handle that saves nothing)
 * and restarts once the metadata server shows no announced stop; if the
 * watcher has no answer (not on GCE), it restarts at once. When the VM
 * does stop, run stops with it; the next boot starts run again.
 *
 * Every start, exit, restart, stop and give-up is one line of the event
 * journal at the location (ckpt_event_append, source "run").
 *
 *   run --posix_spawnp--> child (env) --exit--> decide --> journal --> again
 *    ^-- signalfd: SIGCHLD, SIGTERM/SIGINT (forwarded)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "cli.h"

/* run's watcher retries a failing key within this, so the answer it
 * needs after a 75 is fresh (a local server: one request a key at most
 * every 2 s while failing). */
#define RUN_BACKOFF_MAX_MS 2000
/* How long a restart waits for the watcher's first (or a fresh) answer. */
#define FIRST_REPLY_NS (5 * (int64_t)1000000000)

static const char help_run[] =
	"Usage: ckptctl run [OPTIONS] -- CMD [ARGS...]\n"
	"\n"
	"Run a training command until it exits 0, restarting it after a failure\n"
	"or after it stopped on purpose behind a checkpoint. Each start gets:\n"
	"  CKPT_LOCATION       the --location argument (unset without one)\n"
	"  CKPT_REMOTE         the --remote argument (unset without one)\n"
	"  CKPT_RESUME_STEP    the latest committed step there (with --remote,\n"
	"                      the newer of both), empty if none (read again\n"
	"                      before every start)\n"
	"  CKPT_RESUME_LOCATION where that step is committed: the location, or\n"
	"                      the remote when it is newer there\n"
	"  CKPT_RESTART_COUNT  0 for the first start, then 1, 2, ...\n"
	"  CKPT_RUN_ID         one id for all starts of this run (kept from the\n"
	"                      environment if already set)\n"
	"The command's exit status decides:\n"
	"  0    done; run exits 0\n"
	"  75   it stopped after a durable checkpoint forced by a notice\n"
	"       (CKPT_EXIT_RESTART): restarted at once, not counted as a\n"
	"       failure; while the metadata server still announces a stop\n"
	"       (maintenance-event not NONE, preempted TRUE, an upcoming window\n"
	"       scheduled) run waits for it to clear, since the VM is about to\n"
	"       stop anyway (it waits 5 s at most for a fresh answer)\n"
	"  else a failure (any other status, or killed by a signal): restarted\n"
	"       after a backoff that doubles from MIN to MAX seconds, each delay\n"
	"       drawn in [d/2, d]\n"
	"SIGTERM and SIGINT are forwarded to the command (a Ctrl-C from the\n"
	"terminal reaches it directly); no restart follows, and run exits with\n"
	"the command's status. With a location, every start, exit, restart,\n"
	"forwarded signal and give-up is written to its event journal (see\n"
	"'ckptctl events'). Messages go to stderr.\n"
	"\n"
	"Options:\n"
	"  -n, --max-restarts N     give up after N failures (default 10)\n"
	"  -b, --backoff MIN[,MAX]  seconds (default 1,60)\n"
	"  -l, --location LOC       checkpoint location (DIR or gs://BUCKET/PREFIX)\n"
	"  -r, --remote gs://B/P    the Cloud Storage copy of a DIR location\n"
	"                           (ckpt_settings.remote)\n"
	"  -H, --host N             this host's index, for the journal (default 0)\n"
	"  -u, --upcoming-poll MS   how often run's own watcher asks\n"
	"                           instance/upcoming-maintenance (default 60000)\n"
	"  -h, --help               show this help\n"
	"\n"
	"Exit status: 0 the command finished, 1 gave up after too many failures\n"
	"(or the location is unusable), 2 usage error, 127 the command could not\n"
	"be run; after SIGTERM/SIGINT, the command's status (128+N if it was\n"
	"killed by signal N).\n"
	"\n"
	"Examples:\n"
	"  ckptctl run --location /ckpt/run1 -- python3 train.py\n"
	"  ckptctl run -n 3 -b 5,300 -l gs://my-bucket/run1 -- ./train\n"
	"  ckptctl run -l /ckpt/run1 -r gs://my-bucket/run1 -- ./train\n";

struct run {
	char **cmd;
	const char *location; /* NULL: none */
	const char *remote;   /* NULL: none */
	uint32_t host;
	uint64_t max_failures;
	double backoff_min, backoff_max;
	char run_id[40];
	int sigfd;
	sigset_t oldmask;
	int stopping; /* the signal that stops restarts, 0 none */
	ckpt *watch;  /* to see whether a stop is announced */
	char *watch_tmp;
	uint64_t rnd;
};

/* ---- the event journal ---- */

/* Appends {source: run, action, run_id, ...fields} when there is a
 * location; a failure is reported and otherwise ignored (the journal
 * must never stop the training). Releases `fields`. */
static void journal(const struct run *r, const char *action, json_t *fields)
{
	json_t *j;
	char *line;
	int rc;

	if (!r->location) {
		json_decref(fields);
		return;
	}
	j = cli_jcheck(json_object());
	cli_jset(j, "source", cli_jstr("run"));
	cli_jset(j, "action", cli_jstr(action));
	cli_jset(j, "run_id", cli_jstr(r->run_id));
	if (fields)
		json_object_update(j, fields);
	json_decref(fields);
	line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!line)
		cli_jcheck(NULL);
	rc = ckpt_event_append(r->location, r->host, line);
	if (rc)
		cli_err("cannot write the event journal at %s: %s", r->location,
			cli_libmsg(ckpt_errmsg(NULL), rc));
	free(line);
}

/* ---- options ---- */

static int parse_seconds(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0) || v > 86400)
		return -1;
	*out = v;
	return 0;
}

static int parse_backoff(const char *arg, struct run *r)
{
	char *copy = strdup(arg), *comma;
	int bad;

	if (!copy)
		cli_jcheck(NULL);
	comma = strchr(copy, ',');
	if (comma)
		*comma++ = 0;
	bad = parse_seconds(copy, &r->backoff_min) ||
	      (comma && parse_seconds(comma, &r->backoff_max));
	free(copy);
	if (!comma && !bad && r->backoff_max < r->backoff_min)
		r->backoff_max = r->backoff_min;
	return bad || r->backoff_max < r->backoff_min ? -1 : 0;
}

/* ---- the location ---- */

/* The latest committed step at `loc` into *step. 1 found, 0 none, -1
 * after printing why. */
static int latest_at(const char *loc, uint64_t *step)
{
	ckpt_settings s;
	ckpt *h = NULL;
	int rc;

	ckpt_settings_default(&s);
	s.staging_bytes = 0;
	rc = ckpt_open(&h, loc, &s);
	if (rc) {
		cli_err("%s", cli_libmsg(ckpt_errmsg(NULL), rc));
		return -1;
	}
	rc = ckpt_latest(h, step);
	if (rc && rc != CKPT_E_NOTFOUND)
		cli_err("%s", cli_libmsg(ckpt_errmsg(h), rc));
	ckpt_close(h);
	return rc == 0 ? 1 : rc == CKPT_E_NOTFOUND ? 0 : -1;
}

/* The step to resume after into buf ("" if none) and where it is
 * committed into *where (the newer of location and remote; the location
 * when both have it). 0, or -1 after printing why. */
static int resume_step(const struct run *r, char *buf, size_t len,
		       const char **where)
{
	uint64_t a = 0, b = 0;
	int fa, fb = 0;

	buf[0] = 0;
	*where = r->location;
	if (!r->location)
		return 0;
	fa = latest_at(r->location, &a);
	if (fa >= 0 && r->remote)
		fb = latest_at(r->remote, &b);
	if (fa < 0 || fb < 0)
		return -1;
	if (fb && (!fa || b > a)) {
		a = b;
		fa = 1;
		*where = r->remote;
	}
	if (fa)
		snprintf(buf, len, "%" PRIu64, a);
	return 0;
}

/* ---- signals ---- */

static const char *sig_name(int sig)
{
	const char *d = sigabbrev_np(sig);

	return d ? d : "?";
}

/* Handles one signal from the signalfd. Returns SIGCHLD, the stop
 * signal, or 0. */
static int take_signal(struct run *r, pid_t child)
{
	struct signalfd_siginfo si;

	if (read(r->sigfd, &si, sizeof(si)) != sizeof(si))
		return 0;
	if (si.ssi_signo == SIGCHLD)
		return SIGCHLD;
	if (!r->stopping) {
		json_t *f = cli_jcheck(json_object());

		cli_jset(f, "signal", cli_ju64(si.ssi_signo));
		journal(r, "stop", f);
	}
	r->stopping = (int)si.ssi_signo;
	if (child > 0 && si.ssi_code != SI_KERNEL) {
		cli_err("SIG%s: forwarded to pid %d; no restart after it",
			sig_name((int)si.ssi_signo), (int)child);
		kill(child, (int)si.ssi_signo);
	} else if (child > 0) {
		cli_err("SIG%s: no restart after pid %d",
			sig_name((int)si.ssi_signo), (int)child);
	} else {
		cli_err("SIG%s: no more restarts", sig_name((int)si.ssi_signo));
	}
	return (int)si.ssi_signo;
}

/* Sleeps `s` seconds unless SIGTERM/SIGINT comes first (returns 1). */
static int nap(struct run *r, double s)
{
	int64_t end = cli_now_ns() + (int64_t)(s * 1e9), left;

	while ((left = end - cli_now_ns()) > 0 && !r->stopping) {
		struct pollfd p = { .fd = r->sigfd, .events = POLLIN };
		int ms = (int)(left / 1000000) + 1;

		if (poll(&p, 1, ms) > 0)
			take_signal(r, 0);
	}
	return r->stopping != 0;
}

/* ---- the child ---- */

/* The child's environment: this process's, with the contract's variables
 * set (or removed when they do not apply). Built before the child is
 * started: run has threads (its watcher, the journal), and a child of
 * fork() in a threaded process may only make async-signal-safe calls, so
 * no setenv() (it allocates) between fork and exec. NULL: out of memory. */
static char **child_env(const struct run *r, uint64_t restart,
			const char *resume, const char *where)
{
	static const char *const names[] = {
		"CKPT_LOCATION",      "CKPT_REMOTE",	    "CKPT_RESUME_STEP",
		"CKPT_RESUME_LOCATION", "CKPT_RESTART_COUNT", "CKPT_RUN_ID",
	};
	const size_t nn = sizeof(names) / sizeof(names[0]);
	char count[32];
	const char *vals[6];
	size_t n = 0, k = 0;
	char **env;

	snprintf(count, sizeof(count), "%" PRIu64, restart);
	vals[0] = r->location;
	vals[1] = r->remote;
	vals[2] = resume;
	vals[3] = *resume ? where : NULL;
	vals[4] = count;
	vals[5] = r->run_id;
	while (environ && environ[n])
		n++;
	env = calloc(n + nn + 1, sizeof(*env));
	if (!env)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		size_t j;

		for (j = 0; j < nn; j++) {
			size_t l = strlen(names[j]);

			if (!strncmp(environ[i], names[j], l) &&
			    environ[i][l] == '=')
				break;
		}
		if (j == nn && !(env[k++] = strdup(environ[i])))
			goto nomem;
	}
	for (size_t j = 0; j < nn; j++) {
		if (!vals[j])
			continue;
		if (asprintf(&env[k], "%s=%s", names[j], vals[j]) < 0)
			goto nomem;
		k++;
	}
	return env;
nomem:
	for (size_t i = 0; i < k; i++)
		free(env[i]);
	free(env);
	return NULL;
}

/* Starts the command with posix_spawnp (no code of ours runs in the
 * child), the signal mask run found and the environment above; returns
 * its pid, or -errno of a failed start or exec. */
static pid_t start(const struct run *r, uint64_t restart, const char *resume,
		   const char *where)
{
	char **env = child_env(r, restart, resume, where);
	posix_spawnattr_t a;
	pid_t pid = -1;
	int e;

	if (!env)
		return -ENOMEM;
	e = posix_spawnattr_init(&a);
	if (!e)
		e = posix_spawnattr_setsigmask(&a, &r->oldmask);
	if (!e)
		e = posix_spawnattr_setflags(&a, POSIX_SPAWN_SETSIGMASK);
	if (!e)
		e = posix_spawnp(&pid, r->cmd[0], NULL, &a, r->cmd, env);
	posix_spawnattr_destroy(&a);
	for (size_t i = 0; env[i]; i++)
		free(env[i]);
	free(env);
	return e ? -e : pid;
}

/* Waits for the child, forwarding signals; returns its wait status. */
static int wait_child(struct run *r, pid_t pid)
{
	int st;

	for (;;) {
		struct pollfd p = { .fd = r->sigfd, .events = POLLIN };
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return st;
		if (w < 0 && errno != EINTR) {
			cli_err("waitpid: %s", strerror(errno));
			return 1 << 8;
		}
		if (poll(&p, 1, -1) > 0)
			take_signal(r, pid);
	}
}

/* ---- is a stop announced? ---- */

/* A scheduled window in an upcoming-maintenance value (not one of the
 * "nothing scheduled" forms: {}, {"error": ...}, NONE). */
static int window_scheduled(const char *v)
{
	json_t *d = json_loads(v, 0, NULL);
	int yes = json_is_object(d) && !json_object_get(d, "error") &&
		  (json_object_get(d, "type") ||
		   json_object_get(d, "window_start_time"));

	json_decref(d);
	return yes;
}

/* 1 with `why` set while the metadata server announces a stop, 0 when it
 * does not, -1 when the watcher has no answer (not on GCE), -2 when a key
 * has not answered yet, is failing now or was last polled before `since`
 * (unix ns): its value may be stale. */
static int stop_announced(const struct run *r, int64_t since, char *why,
			  size_t len)
{
	ckpt_watch_info in;
	int known = 0, asking = 0;

	if (!r->watch || ckpt_watch_state(r->watch, &in))
		return -1;
	for (uint32_t i = 0; i < in.nkeys && i < CKPT_WATCH_MAX_KEYS; i++) {
		const ckpt_watch_key *k = &in.keys[i];
		int stop = 0;

		if (k->state == CKPT_WKEY_ABSENT)
			known = 1;
		/* not answered yet, or failing now: its value may be old */
		if ((k->state == CKPT_WKEY_UNKNOWN && !k->errors) ||
		    k->state == CKPT_WKEY_ERROR)
			asking = 1;
		/* a polled key answers for the present only if asked after
		 * `since` (a long-poll that is up is always current) */
		if (!strcmp(k->key, "instance/upcoming-maintenance") &&
		    k->state == CKPT_WKEY_OK && k->ok_ns < since)
			asking = 1;
		if (!k->ok_ns)
			continue; /* never answered */
		known = 1;
		if (!strcmp(k->key, "instance/maintenance-event"))
			stop = strcmp(k->value, "NONE") != 0;
		else if (!strcmp(k->key, "instance/preempted"))
			stop = !strcmp(k->value, "TRUE");
		else if (!strcmp(k->key, "instance/upcoming-maintenance"))
			stop = window_scheduled(k->value);
		if (stop) {
			snprintf(why, len, "%s is %.200s", k->key, k->value);
			return 1;
		}
	}
	if (asking && in.running)
		return -2;
	return known ? 0 : -1;
}

/* After an exit 75: waits while a stop is announced. 1 if SIGTERM/SIGINT
 * came meanwhile. */
static int wait_stop_over(struct run *r)
{
	int64_t exited = cli_now_ns(), first = exited + FIRST_REPLY_NS;
	char why[300];
	int said = 0, a;

	/* a child that stopped right after run started, a key failing just
	 * now, upcoming-maintenance not asked since the child stopped (the
	 * child may have seen a window run has not): give the watcher a
	 * moment to get a fresh answer */
	while ((a = stop_announced(r, exited, why, sizeof(why))) == -2 &&
	       cli_now_ns() < first)
		if (nap(r, 0.05))
			return 1;
	for (; a == 1; a = stop_announced(r, exited, why, sizeof(why))) {
		if (!said)
			cli_err("waiting to restart: %s (the VM is about to "
				"stop)",
				why);
		said = 1;
		if (nap(r, 0.1))
			return 1;
	}
	if (said)
		cli_err("the announced stop is over");
	return r->stopping != 0;
}

/* ---- the loop ---- */

static double jitter(struct run *r, double d)
{
	/* xorshift64: jitter needs no quality, only independence of runs */
	r->rnd ^= r->rnd << 13;
	r->rnd ^= r->rnd >> 7;
	r->rnd ^= r->rnd << 17;
	return d / 2 + d / 2 * (double)(r->rnd >> 11) / (double)(1ull << 53);
}

static void describe(int st, char *buf, size_t len)
{
	if (WIFEXITED(st))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, len, "was killed by SIG%s",
			 sig_name(WTERMSIG(st)));
	else
		snprintf(buf, len, "ended (wait status 0x%x)", st);
}

static int supervise(struct run *r)
{
	uint64_t restarts = 0, failures = 0, streak = 0;
	char resume[32], prev_resume[32] = "", what[64];
	const char *where = NULL;
	int st;

	for (;;) {
		pid_t pid;
		json_t *f;

		if (resume_step(r, resume, sizeof(resume), &where))
			return 1;
		if (strcmp(resume, prev_resume))
			streak = 0; /* progress since the last start */
		snprintf(prev_resume, sizeof(prev_resume), "%s", resume);
		pid = start(r, restarts, resume, where);
		if (pid < 0) {
			cli_err("cannot run '%s': %s", r->cmd[0],
				strerror((int)-pid));
			f = cli_jcheck(json_object());
			cli_jset(f, "error", cli_jstr(strerror((int)-pid)));
			journal(r, "give-up", f);
			return 127;
		}
		cli_err("started %s (pid %d, restart %" PRIu64 ", %s%s%s%s)",
			r->cmd[0], (int)pid, restarts,
			*resume ? "resuming after step " : "from scratch",
			resume, *resume && where == r->remote ? " in " : "",
			*resume && where == r->remote ? where : "");
		f = cli_jcheck(json_object());
		if (*resume && where == r->remote)
			cli_jset(f, "from", cli_jstr(where));
		cli_jset(f, "pid", cli_ju64((uint64_t)pid));
		cli_jset(f, "restart", cli_ju64(restarts));
		if (*resume)
			cli_jset(f, "step",
				 cli_jcheck(json_integer(
					 strtoll(resume, NULL, 10))));
		journal(r, "start", f);

		st = wait_child(r, pid);
		describe(st, what, sizeof(what));
		f = cli_jcheck(json_object());
		cli_jset(f, "pid", cli_ju64((uint64_t)pid));
		cli_jset(f, "restart", cli_ju64(restarts));
		if (WIFEXITED(st))
			cli_jset(f, "exit",
				 cli_ju64((uint64_t)WEXITSTATUS(st)));
		else if (WIFSIGNALED(st))
			cli_jset(f, "signal", cli_ju64((uint64_t)WTERMSIG(st)));
		journal(r, "exit", f);

		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			cli_err("pid %d %s: done", (int)pid, what);
			return 0;
		}
		if (r->stopping) {
			cli_err("pid %d %s; stopped by SIG%s", (int)pid, what,
				sig_name(r->stopping));
			return WIFEXITED(st) ? WEXITSTATUS(st) :
					       128 + WTERMSIG(st);
		}
		if (WIFEXITED(st) && WEXITSTATUS(st) == CKPT_EXIT_RESTART) {
			cli_err("pid %d %s: stopped after a checkpoint; "
				"restarting (not a failure)",
				(int)pid, what);
			streak = 0;
			if (wait_stop_over(r))
				return CKPT_EXIT_RESTART;
		} else {
			double d;

			failures++;
			streak++;
			if (failures > r->max_failures) {
				cli_err("pid %d %s; giving up: %" PRIu64
					" failures, --max-restarts is %" PRIu64,
					(int)pid, what, failures,
					r->max_failures);
				f = cli_jcheck(json_object());
				cli_jset(f, "restart", cli_ju64(restarts));
				cli_jset(f, "error", cli_jstr(what));
				journal(r, "give-up", f);
				return 1;
			}
			d = r->backoff_min;
			for (uint64_t i = 1; i < streak && d < r->backoff_max;
			     i++)
				d *= 2;
			d = jitter(r, d > r->backoff_max ? r->backoff_max : d);
			cli_err("pid %d %s: failure %" PRIu64 " of %" PRIu64
				" allowed; restarting in %.1f s",
				(int)pid, what, failures, r->max_failures, d);
			f = cli_jcheck(json_object());
			cli_jset(f, "restart", cli_ju64(restarts + 1));
			cli_jset(f, "delay_s", cli_jcheck(json_real(d)));
			cli_jset(f, "failures", cli_ju64(failures));
			journal(r, "restart", f);
			if (nap(r, d)) {
				cli_err("stopped by SIG%s before the restart",
					sig_name(r->stopping));
				return WIFEXITED(st) ? WEXITSTATUS(st) :
						       128 + WTERMSIG(st);
			}
			restarts++;
			continue;
		}
		f = cli_jcheck(json_object());
		cli_jset(f, "restart", cli_ju64(restarts + 1));
		journal(r, "restart", f);
		restarts++;
	}
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "max-restarts", required_argument, NULL, 'n' },
		{ "backoff", required_argument, NULL, 'b' },
		CLI_JOURNAL_OPTS,
		{ "remote", required_argument, NULL, 'r' },
		{ "upcoming-poll", required_argument, NULL, 'u' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct run r = { .max_failures = 10,
			 .backoff_min = 1,
			 .backoff_max = 60,
			 .sigfd = -1 };
	const char *id = getenv("CKPT_RUN_ID");
	ckpt_watch_opts wo;
	uint32_t upcoming_ms = 60000;
	uint64_t v, rnd[2] = { 0, 0 };
	sigset_t block;
	int c, st, ret;

	/* "+": stop at the first operand, so CMD's options stay its own */
	while ((c = cli_getopt(argc, argv, "+:n:b:l:r:H:u:h", opts, help_run,
			       NULL, &st)) != -1) {
		switch (cli_journal_opt(c, optarg, &r.location, &r.host, &st)) {
		case 'n':
			if (cli_parse_u64(optarg, &r.max_failures, 0))
				return cli_usage("bad --max-restarts '%s'",
						 optarg);
			break;
		case 'b':
			if (parse_backoff(optarg, &r))
				return cli_usage("bad --backoff '%s' (seconds: "
						 "MIN[,MAX], MIN <= MAX)",
						 optarg);
			break;
		case 'r':
			r.remote = optarg;
			break;
		case 'u':
			if (cli_parse_u64(optarg, &v, 0) || !v ||
			    v > UINT32_MAX)
				return cli_usage("bad --upcoming-poll '%s'",
						 optarg);
			upcoming_ms = (uint32_t)v;
			break;
		case CLI_OPT_EXIT:
			return st;
		}
	}
	if (optind >= argc)
		return cli_usage("missing CMD (after --)");
	if (r.location && !*r.location)
		return cli_usage("empty --location");
	if (r.remote && (!r.location || strncmp(r.remote, "gs://", 5) ||
			 !strncmp(r.location, "gs://", 5)))
		return cli_usage("--remote gs://BUCKET/PREFIX goes with a "
				 "directory --location");
	r.cmd = argv + optind;
	if (getrandom(rnd, sizeof(rnd), 0) < 0)
		rnd[0] = (uint64_t)cli_now_ns() ^ (uint64_t)getpid() << 32;
	r.rnd = rnd[0] | 1;
	if (id && *id)
		snprintf(r.run_id, sizeof(r.run_id), "%.32s", id);
	else
		snprintf(r.run_id, sizeof(r.run_id), "%016" PRIx64,
			 rnd[1] ^ rnd[0]);

	/* signals: blocked before the watcher thread exists, so it keeps
	 * them blocked too; read from the signalfd only */
	sigemptyset(&block);
	sigaddset(&block, SIGCHLD);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &r.oldmask);
	r.sigfd = signalfd(-1, &block, SFD_CLOEXEC);
	if (r.sigfd < 0) {
		cli_err("signalfd: %s", strerror(errno));
		return 1;
	}
	ckpt_watch_opts_default(&wo);
	wo.every_seconds = 0;
	wo.upcoming_interval_ms = upcoming_ms;
	wo.backoff_max_ms = RUN_BACKOFF_MAX_MS;
	if (cli_watcher_open(&wo, &r.watch, &r.watch_tmp))
		cli_err("restarting without waiting for announced stops");
	ret = supervise(&r);
	cli_watcher_close(r.watch, r.watch_tmp);
	close(r.sigfd);
	sigprocmask(SIG_SETMASK, &r.oldmask, NULL);
	return ret;
}

CLI_DEFINE_COMMAND(run, "run a training command, restarting it as needed");
