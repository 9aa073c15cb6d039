/*
 * toy_train.c - a toy training program that uses ckpt the way a real one
 * should on a Cloud TPU VM: the maintenance watcher, SIGTERM opt-in, an
 * early checkpoint on each notice, exit 75 after it, resume on restart.
 * Run it under `ckptctl run --location LOC -- toy_train ...`.
 *
 * Design note. The "model" is two f32 tensors, w and m (a few hundred MiB
 * together by default, --mib), and the step counter. Step s updates every
 * element from a hash of (s, i): m = 0.9 m + 0.1 noise(s, i), w -= 0.01 m.
 * So the state after step s depends only on s and the state before it,
 * and a run interrupted and resumed from a checkpoint must end
 * bit-identical to one that never stopped: `done` prints a digest of the
 * final state (also written to --digest FILE) to compare them.
 *
 * Protocol with `ckptctl run` (environment): CKPT_LOCATION (no location:
 * train without checkpoints, the reference run), CKPT_REMOTE (its Cloud
 * Storage copy, ckpt_settings.remote), CKPT_RESUME_LOCATION (where the
 * step to resume is: the location or the remote), CKPT_RESUME_STEP (the
 * step to resume after; empty: from scratch), CKPT_RESTART_COUNT. The
 * metadata server is GCE_METADATA_HOST, as for Google's clients.
 *
 * Each step: compute, ckpt_should_save() (atomics only); on a notice,
 * ckpt_save_ex() with the advice's reason and deadline, then ckpt_wait()
 * for durability: nothing is computed after the saved step, and
 * ckpt_should_stop() then says exit with CKPT_EXIT_RESTART (75). One line
 * per event on stdout, which the end-to-end tests read:
 *   toy: start pid=P resume=S restart=R   toy: resumed S
 *   toy: step S MS                        (compute time of the step)
 *   toy: save S REASON deadline_ms=D      toy: durable S MS
 *   toy: stop S                           toy: done S digest=HEX
 *   toy: held S                           (--hold-file: waiting after S)
 * Uses only the public API (ckpt.h).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

struct toy {
	/* options */
	uint64_t mib, steps, step_ms, every_steps, hold_step;
	const char *digest_file, *codec, *hold_file;
	ckpt_watch_opts wo;
	/* state */
	float *w, *m;
	uint64_t n, step;
	ckpt *c;
	const char *location;
	const char *remote;      /* CKPT_REMOTE, or NULL */
	const char *resume_from; /* CKPT_RESUME_LOCATION, else location */
};

static const char usage[] =
	"Usage: toy_train [OPTIONS]   (normally under ckptctl run)\n"
	"  --mib N                  state size in MiB (default 256)\n"
	"  --steps N                steps to train (default 100)\n"
	"  --step-ms MS             extra time per step (default 0)\n"
	"  --every-steps N          periodic save every N steps (default off)\n"
	"  --codec NAME             none, zstd or float (default: the handle's)\n"
	"  --digest FILE            write the final state's digest there\n"
	"  --hold-file FILE         before step --hold-step, wait while FILE\n"
	"  --hold-step S            exists (a stalled input pipeline), still\n"
	"                           answering notices\n"
	"  --maintenance-window-ms, --preempted-window-ms,\n"
	"  --sigterm-window-ms MS   notice windows (defaults 60000, 30000,\n"
	"                           300000)\n"
	"  --upcoming-ms MS         upcoming-maintenance poll interval\n"
	"  --backoff-max-ms MS      the watcher's longest backoff\n"
	"Environment: CKPT_LOCATION, CKPT_REMOTE, CKPT_RESUME_STEP,\n"
	"CKPT_RESUME_LOCATION, CKPT_RESTART_COUNT, GCE_METADATA_HOST,\n"
	"STORAGE_EMULATOR_HOST. Exit: 0 done, 75 stopped after a checkpoint,\n"
	"1 error, 2 usage.\n";

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int64_t unix_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what, int rc, const ckpt *c)
{
	const char *m = ckpt_errmsg(c);

	fprintf(stderr, "toy: %s: %s\n", what, m && *m ? m : ckpt_strerror(rc));
	exit(1);
}

/* splitmix64: the noise of element i at step s, in [-0.5, 0.5). */
static float noise(uint64_t s, uint64_t i)
{
	uint64_t z = s * 0x9e3779b97f4a7c15ull ^ (i + 0x632be59bd9b4e019ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (float)(z >> 40) / 16777216.0f - 0.5f;
}

static void train_step(struct toy *t, uint64_t s)
{
	for (uint64_t i = 0; i < t->n; i++) {
		t->m[i] = 0.9f * t->m[i] + 0.1f * noise(s, i);
		t->w[i] -= 0.01f * t->m[i];
	}
	t->step = s;
}

static uint64_t digest(const struct toy *t)
{
	const uint32_t *a = (const uint32_t *)t->w, *b = (const uint32_t *)t->m;
	uint64_t h = 0xcbf29ce484222325ull ^ t->step;

	for (uint64_t i = 0; i < t->n; i++) {
		h = (h ^ a[i]) * 0x100000001b3ull;
		h = (h ^ b[i]) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	return h;
}

/* The save's tensors: w, m and the step (a u64 scalar). */
static void tensors(struct toy *t, ckpt_tensor *v, uint64_t *shape)
{
	static const uint64_t scalar[1] = { 0 };

	shape[0] = t->n;
	memset(v, 0, 3 * sizeof(*v));
	v[0] = (ckpt_tensor){ .name = "w",
			      .dtype = CKPT_F32,
			      .ndim = 1,
			      .shape = shape,
			      .data = t->w,
			      .nbytes = t->n * 4 };
	v[1] = (ckpt_tensor){ .name = "m",
			      .dtype = CKPT_F32,
			      .ndim = 1,
			      .shape = shape,
			      .data = t->m,
			      .nbytes = t->n * 4 };
	v[2] = (ckpt_tensor){ .name = "step",
			      .dtype = CKPT_U64,
			      .ndim = 0,
			      .shape = scalar,
			      .data = &t->step,
			      .nbytes = 8 };
}

static void resume(struct toy *t, const char *step_s)
{
	uint64_t want = strtoull(step_s, NULL, 10), got = 0;
	ckpt_reader *r;
	int rc;

	rc = ckpt_reader_open(&r, t->resume_from, want, NULL);
	if (rc)
		die("resume", rc, NULL);
	if ((rc = ckpt_read(r, "w", t->w, t->n * 4)) ||
	    (rc = ckpt_read(r, "m", t->m, t->n * 4)) ||
	    (rc = ckpt_read(r, "step", &got, 8))) {
		fprintf(stderr, "toy: resume from step %" PRIu64 ": %s\n", want,
			ckpt_reader_errmsg(r));
		exit(1);
	}
	ckpt_reader_close(r);
	if (got != want) {
		fprintf(stderr,
			"toy: step %" PRIu64 " holds step %" PRIu64 "\n", want,
			got);
		exit(1);
	}
	t->step = got;
	printf("toy: resumed %" PRIu64 "\n", got);
}

static void open_location(struct toy *t)
{
	ckpt_settings s;
	uint64_t bytes = 2 * t->n * 4;
	int rc;

	ckpt_settings_default(&s);
	s.staging_bytes = bytes < (256ull << 20) ? bytes : 256ull << 20;
	if (s.staging_bytes < (4ull << 20))
		s.staging_bytes = 4ull << 20;
	s.threads = 2;
	s.files_per_host = 2;
	s.keep_last = 2;
	s.remote = t->remote;
	if (t->codec) {
		s.codec = ckpt_codec_from_name(t->codec);
		if (s.codec < 0) {
			fprintf(stderr, "toy: unknown codec '%s'\n", t->codec);
			exit(2);
		}
	}
	rc = ckpt_open(&t->c, t->location, &s);
	if (rc)
		die("open", rc, NULL);
	if ((rc = ckpt_watch_start(t->c, &t->wo)))
		die("watch", rc, t->c);
	if ((rc = ckpt_watch_sigterm(t->c)))
		die("sigterm opt-in", rc, t->c);
}

/* Saves step t->step as advised; waits for a notice's save to be durable
 * (nothing is computed after it). */
static void save(struct toy *t, const ckpt_save_advice *a)
{
	ckpt_tensor v[3];
	uint64_t shape[1];
	ckpt_save_opts so;
	const char *why = ckpt_reason_name(a->reason);
	double t0;
	int rc;

	if ((rc = ckpt_wait(t->c)))
		die("earlier save", rc, t->c);
	tensors(t, v, shape);
	ckpt_save_opts_default(&so);
	so.reason = a->reason;
	so.deadline_ns = a->deadline_ns;
	printf("toy: save %" PRIu64 " %s deadline_ms=%" PRId64 "\n", t->step,
	       why ? why : "?",
	       a->deadline_ns ? (a->deadline_ns - unix_ns()) / 1000000 : 0);
	t0 = now_ms();
	rc = ckpt_save_ex(t->c, t->step, v, 3, &so);
	if (rc)
		die("save", rc, t->c);
	if (a->reason == CKPT_REASON_PERIODIC)
		return;
	if ((rc = ckpt_wait(t->c)))
		die("save", rc, t->c);
	printf("toy: durable %" PRIu64 " %.1f\n", t->step, now_ms() - t0);
}

/* After a notice's save: nothing more is computed; exit 75. */
static int stop(struct toy *t)
{
	printf("toy: stop %" PRIu64 "\n", t->step);
	if (ckpt_close(t->c))
		die("close", 1, NULL);
	free(t->w);
	free(t->m);
	return CKPT_EXIT_RESTART;
}

/* --hold-file: before step --hold-step, waits while the file exists, as
 * a loop whose input pipeline stalls; notices are still answered (saved
 * at the last step computed). Returns 1 when the loop should stop. */
static int hold(struct toy *t)
{
	static const struct timespec tick = { 0, 10 * 1000000 };
	ckpt_save_advice a;
	int said = 0;

	if (!t->hold_file || t->step + 1 < t->hold_step)
		return 0;
	while (access(t->hold_file, F_OK) == 0) {
		if (!said++)
			printf("toy: held %" PRIu64 "\n", t->step);
		if (t->c && ckpt_should_save(t->c, t->step, &a) &&
		    a.reason != CKPT_REASON_PERIODIC)
			save(t, &a);
		if (t->c && ckpt_should_stop(t->c))
			return 1;
		nanosleep(&tick, NULL);
	}
	return 0;
}

static uint64_t num(const char *opt, const char *v)
{
	char *end;
	uint64_t x;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || end == v || *end) {
		fprintf(stderr, "toy: bad %s '%s'\n%s", opt, v, usage);
		exit(2);
	}
	return x;
}

static void parse(struct toy *t, int argc, char **argv)
{
	static const struct option o[] = {
		{ "mib", required_argument, NULL, 'M' },
		{ "steps", required_argument, NULL, 's' },
		{ "step-ms", required_argument, NULL, 'd' },
		{ "every-steps", required_argument, NULL, 'e' },
		{ "codec", required_argument, NULL, 'c' },
		{ "digest", required_argument, NULL, 'D' },
		{ "hold-file", required_argument, NULL, 'H' },
		{ "hold-step", required_argument, NULL, 'S' },
		{ "maintenance-window-ms", required_argument, NULL, 'W' },
		{ "preempted-window-ms", required_argument, NULL, 'P' },
		{ "sigterm-window-ms", required_argument, NULL, 'T' },
		{ "upcoming-ms", required_argument, NULL, 'U' },
		{ "backoff-max-ms", required_argument, NULL, 'B' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	t->mib = 256;
	t->steps = 100;
	ckpt_watch_opts_default(&t->wo);
	t->wo.every_seconds = 0;
	while ((c = getopt_long(argc, argv, "h", o, NULL)) != -1) {
		const char *n = optind > 1 ? argv[optind - 2] : "option";

		switch (c) {
		case 'M':
			t->mib = num(n, optarg);
			break;
		case 's':
			t->steps = num(n, optarg);
			break;
		case 'd':
			t->step_ms = num(n, optarg);
			break;
		case 'e':
			t->every_steps = num(n, optarg);
			break;
		case 'c':
			t->codec = optarg;
			break;
		case 'D':
			t->digest_file = optarg;
			break;
		case 'H':
			t->hold_file = optarg;
			break;
		case 'S':
			t->hold_step = num(n, optarg);
			break;
		case 'W':
			t->wo.maintenance_window_ms = (uint32_t)num(n, optarg);
			break;
		case 'P':
			t->wo.preempted_window_ms = (uint32_t)num(n, optarg);
			break;
		case 'T':
			t->wo.sigterm_window_ms = (uint32_t)num(n, optarg);
			break;
		case 'U':
			t->wo.upcoming_interval_ms = (uint32_t)num(n, optarg);
			break;
		case 'B':
			t->wo.backoff_max_ms = (uint32_t)num(n, optarg);
			if (t->wo.backoff_min_ms > t->wo.backoff_max_ms)
				t->wo.backoff_min_ms = t->wo.backoff_max_ms;
			break;
		case 'h':
			fputs(usage, stdout);
			exit(0);
		default:
			fputs(usage, stderr);
			exit(2);
		}
	}
	if (optind < argc || !t->mib) {
		fputs(usage, stderr);
		exit(2);
	}
	t->wo.every_steps = (uint32_t)t->every_steps;
}

int main(int argc, char **argv)
{
	struct toy t = { 0 };
	const char *rs = getenv("CKPT_RESUME_STEP"),
		   *rc_s = getenv("CKPT_RESTART_COUNT");
	ckpt_save_advice a;
	uint64_t first;
	FILE *f;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse(&t, argc, argv);
	t.location = getenv("CKPT_LOCATION");
	if (t.location && !*t.location)
		t.location = NULL;
	t.remote = getenv("CKPT_REMOTE");
	if (t.remote && !*t.remote)
		t.remote = NULL;
	t.resume_from = getenv("CKPT_RESUME_LOCATION");
	if (!t.resume_from || !*t.resume_from)
		t.resume_from = t.location;
	t.n = t.mib * (1ull << 20) / 8; /* two f32 tensors */
	t.w = malloc(t.n * 4);
	t.m = malloc(t.n * 4);
	if (!t.w || !t.m) {
		fprintf(stderr, "toy: out of memory\n");
		return 1;
	}
	printf("toy: start pid=%d resume=%s restart=%s\n", (int)getpid(),
	       rs && *rs ? rs : "-", rc_s ? rc_s : "-");
	/* the watcher (and SIGTERM) first, so a notice during the restore
	 * is not missed */
	if (t.location)
		open_location(&t);
	if (t.location && rs && *rs) {
		resume(&t, rs);
	} else {
		for (uint64_t i = 0; i < t.n; i++) {
			t.w[i] = 0.04f * noise(0, i);
			t.m[i] = 0;
		}
		t.step = 0;
	}
	for (first = t.step + 1; t.step < t.steps;) {
		uint64_t s = t.step + 1;
		double t0;

		if (hold(&t))
			return stop(&t);
		t0 = now_ms();
		train_step(&t, s);
		printf("toy: step %" PRIu64 " %.3f\n", s, now_ms() - t0);
		if (t.c && ckpt_should_save(t.c, s, &a))
			save(&t, &a);
		if (t.c && ckpt_should_stop(t.c))
			return stop(&t);
		if (t.step_ms) {
			struct timespec d = { (time_t)(t.step_ms / 1000),
					      (long)(t.step_ms % 1000) *
						      1000000 };
			nanosleep(&d, NULL);
		}
	}
	if (t.c) {
		int rc = ckpt_wait(t.c);
		ckpt_tensor v[3];
		uint64_t shape[1];

		/* the final state, unless its step is already saved */
		if (!rc && t.step >= first) {
			tensors(&t, v, shape);
			rc = ckpt_save(t.c, t.step, v, 3);
			if (rc == CKPT_E_EXISTS)
				rc = 0;
		}
		if (!rc)
			rc = ckpt_close(t.c);
		if (rc)
			die("final save", rc, NULL);
	}
	printf("toy: done %" PRIu64 " digest=%016" PRIx64 "\n", t.step,
	       digest(&t));
	if (t.digest_file) {
		f = fopen(t.digest_file, "w");
		if (!f || fprintf(f, "%016" PRIx64 "\n", digest(&t)) < 0 ||
		    fclose(f)) {
			fprintf(stderr, "toy: %s: %s\n", t.digest_file,
				strerror(errno));
			return 1;
		}
	}
	free(t.w);
	free(t.m);
	return 0;
}
