/*
 * train.c - the shape of a training loop that uses ckpt on a Cloud TPU VM,
 * in C against the public header only. Run it under `ckptctl run`:
 *
 *   ckptctl run --location /ckpt/run1 [--remote gs://B/P] -- ./train
 *
 * Design note. The "model" is a weight vector w and its momentum m (f32,
 * --mib MiB together) fitted by SGD to a fixed target; the gradient noise
 * of step s is a hash of (s, i), so the state after step s depends only on
 * the state before it, and a run that was stopped and resumed ends
 * bit-identical to one that never stopped (`done` prints a digest).
 *
 * The loop asks ckpt two cheap questions per step (atomics only):
 *   ckpt_should_save()  a periodic save (--every N steps) is due, or the
 *                       metadata server announced a stop (maintenance,
 *                       preemption, an upcoming window) or SIGTERM came:
 *                       save now with the advice's reason, and the
 *                       engine plans the save against the deadline;
 *   ckpt_should_stop()  the notice's save is durable: exit with
 *                       CKPT_EXIT_RESTART (75) and `ckptctl run` starts
 *                       the program again (once the VM is back), with
 *                       CKPT_RESUME_STEP set to the step saved.
 * A notice's save is waited for before the next step, so nothing is
 * computed that the stop would throw away. With a remote (CKPT_REMOTE,
 * gs://B/P) steps are saved to the directory and uploaded to the bucket
 * (a notice's save may go straight to the bucket when the engine measured
 * it faster); before exiting, the loop gives the upload what is left of
 * the window (it resumes after the restart otherwise).
 *
 * Environment (from `ckptctl run`): CKPT_LOCATION (none: train without
 * checkpoints), CKPT_REMOTE, CKPT_RESUME_STEP (empty: from scratch) and
 * CKPT_RESUME_LOCATION (where that step is: the location or the remote),
 * CKPT_RESTART_COUNT; GCE_METADATA_HOST names the metadata server. One
 * line per event on stdout:
 *   train: start pid=P resume=S restart=R     train: resumed S FROM
 *   train: step S                             train: save S REASON
 *   train: durable S SECONDS                  train: uploaded S SECONDS
 *   train: stop S                             train: done S digest=HEX
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"

static struct {
	uint64_t steps, mib, every, step_ms, window_ms;
	const char *remote; /* CKPT_REMOTE */
} opt = { .steps = 200, .mib = 16, .window_ms = 60000 };

static float *w, *m;
static uint64_t n, step;
static ckpt_tensor tensors[3];

static void die(const char *what, int rc, const ckpt *c)
{
	const char *msg = ckpt_errmsg(c);

	fprintf(stderr, "train: %s: %s\n", what,
		msg && *msg ? msg : ckpt_strerror(rc));
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The gradient noise of element i at step s, in [-1, 1). */
static float noise(uint64_t s, uint64_t i)
{
	uint64_t z = (s << 32 ^ i) * 0xd6e8feb86659fd93ull;

	z ^= z >> 32;
	z *= 0xd6e8feb86659fd93ull;
	z ^= z >> 32;
	return (float)(int32_t)(uint32_t)z / 2147483648.0f;
}

static void train_step(uint64_t s)
{
	for (uint64_t i = 0; i < n; i++) {
		float target = (float)(i % 7) - 3.0f;
		float g = (w[i] - target) + 0.5f * noise(s, i);

		m[i] = 0.9f * m[i] + g;
		w[i] -= 0.001f * m[i];
	}
	step = s;
}

/* FNV-1a over the state's bytes and the step. */
static uint64_t digest(void)
{
	uint64_t h = 0xcbf29ce484222325ull ^ step;

	for (int t = 0; t < 2; t++) {
		const uint8_t *p = tensors[t].data;

		for (uint64_t i = 0; i < tensors[t].nbytes; i++)
			h = (h ^ p[i]) * 0x100000001b3ull;
	}
	return h;
}

static void describe_state(void)
{
	static uint64_t shape[1];

	shape[0] = n;
	tensors[0] = (ckpt_tensor){ .name = "w",
				    .dtype = CKPT_F32,
				    .ndim = 1,
				    .shape = shape,
				    .data = w,
				    .nbytes = n * 4 };
	tensors[1] = tensors[0];
	tensors[1].name = "m";
	tensors[1].data = m;
	tensors[2] = (ckpt_tensor){
		.name = "step", .dtype = CKPT_U64, .data = &step, .nbytes = 8
	};
}

static ckpt *open_location(const char *loc)
{
	ckpt_settings s;
	ckpt_watch_opts wo;
	ckpt *c;
	int rc;

	ckpt_settings_default(&s);
	s.staging_bytes = 2 * n * 4 + (4u << 20);
	s.keep_last = 3;
	s.remote = opt.remote;
	if ((rc = ckpt_open(&c, loc, &s)))
		die(loc, rc, NULL);
	ckpt_watch_opts_default(&wo);
	wo.every_steps = (uint32_t)opt.every;
	wo.every_seconds = 0;
	wo.maintenance_window_ms = (uint32_t)opt.window_ms;
	if ((rc = ckpt_watch_start(c, &wo)) || (rc = ckpt_watch_sigterm(c)))
		die("watch", rc, c);
	return c;
}

static void resume(const char *loc, uint64_t want)
{
	ckpt_reader *r;
	int rc;

	if ((rc = ckpt_reader_open(&r, loc, want, NULL)))
		die("resume", rc, NULL);
	for (int t = 0; t < 3; t++)
		if ((rc = ckpt_read(r, tensors[t].name, (void *)tensors[t].data,
				    tensors[t].nbytes)))
			die("resume", rc, NULL);
	ckpt_reader_close(r);
	if (step != want) {
		fprintf(stderr, "train: step %" PRIu64 " holds %" PRIu64 "\n",
			want, step);
		exit(1);
	}
	printf("train: resumed %" PRIu64 " %s\n", step, loc);
}

/* Saves the current step as advised; a notice's save is waited for. */
static void save(ckpt *c, const ckpt_save_advice *a)
{
	double t0 = now_s();
	ckpt_save_opts so;
	int rc;

	if (a->reason == CKPT_REASON_PERIODIC && (rc = ckpt_wait(c)))
		die("the previous save", rc, c);
	ckpt_save_opts_default(&so);
	so.reason = a->reason; /* the engine plans it against the deadline */
	printf("train: save %" PRIu64 " %s\n", step,
	       ckpt_reason_name(a->reason));
	if ((rc = ckpt_save_ex(c, step, tensors, 3, &so)))
		die("save", rc, c);
	if (a->reason == CKPT_REASON_PERIODIC)
		return; /* it completes while training goes on */
	if ((rc = ckpt_wait(c)))
		die("save", rc, c);
	printf("train: durable %" PRIu64 " %.3f\n", step, now_s() - t0);
	if (opt.remote && a->deadline_ns) {
		/* the rest of the window, less a second, for the upload */
		double left = (double)a->deadline_ns / 1e9 - now_s() - 1.0;

		if (left > 0 && !ckpt_upload_wait(c, (int)(left * 1e3)))
			printf("train: uploaded %" PRIu64 " %.3f\n", step,
			       now_s() - t0);
	}
}

/* --steps N --mib N --every N --step-ms MS --window-ms MS */
static void parse(int argc, char **argv)
{
	static const struct {
		const char *name;
		uint64_t *value;
	} flags[] = { { "--steps", &opt.steps },
		      { "--mib", &opt.mib },
		      { "--every", &opt.every },
		      { "--step-ms", &opt.step_ms },
		      { "--window-ms", &opt.window_ms } };
	int i, f, nf = (int)(sizeof(flags) / sizeof(flags[0]));

	for (i = 1; i + 1 < argc; i += 2) {
		for (f = 0; f < nf && strcmp(argv[i], flags[f].name); f++)
			;
		if (f == nf)
			break;
		*flags[f].value = strtoull(argv[i + 1], NULL, 10);
	}
	if (i < argc || !opt.mib) {
		fprintf(stderr,
			"usage: train [--steps N] [--mib N] [--every N] "
			"[--step-ms MS] [--window-ms MS]\n");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	const char *loc = getenv("CKPT_LOCATION"),
		   *rs = getenv("CKPT_RESUME_STEP"),
		   *from = getenv("CKPT_RESUME_LOCATION"),
		   *rc_s = getenv("CKPT_RESTART_COUNT");
	ckpt_save_advice a;
	ckpt *c = NULL;
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse(argc, argv);
	opt.remote = getenv("CKPT_REMOTE");
	if (opt.remote && !*opt.remote)
		opt.remote = NULL;
	n = opt.mib << 20 >> 3; /* two f32 vectors */
	w = calloc(n, 4);
	m = calloc(n, 4);
	if (!w || !m)
		die("memory", -ENOMEM, NULL);
	describe_state();
	printf("train: start pid=%d resume=%s restart=%s\n", (int)getpid(),
	       rs && *rs ? rs : "-", rc_s ? rc_s : "-");
	if (loc && *loc)
		c = open_location(loc); /* the watcher runs from here on */
	if (c && rs && *rs)
		resume(from && *from ? from : loc, strtoull(rs, NULL, 10));

	while (step < opt.steps) {
		train_step(step + 1);
		printf("train: step %" PRIu64 "\n", step);
		if (c && ckpt_should_save(c, step, &a))
			save(c, &a);
		if (c && ckpt_should_stop(c)) {
			printf("train: stop %" PRIu64 "\n", step);
			if ((rc = ckpt_close(c)))
				die("close", rc, NULL);
			return CKPT_EXIT_RESTART;
		}
		if (opt.step_ms)
			usleep((useconds_t)(opt.step_ms * 1000));
	}
	if (c) { /* the final state, unless that step is saved already */
		rc = ckpt_wait(c);
		if (!rc)
			rc = ckpt_save(c, step, tensors, 3);
		if (rc == CKPT_E_EXISTS)
			rc = 0;
		if (!rc && opt.remote)
			rc = ckpt_upload_wait(c, -1);
		if (rc)
			die("final save", rc, c);
		if ((rc = ckpt_close(c)))
			die("close", rc, NULL);
	}
	printf("train: done %" PRIu64 " digest=%016" PRIx64 "\n", step,
	       digest());
	free(w);
	free(m);
	return 0;
}
