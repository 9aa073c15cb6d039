/*
 * bench_notice.c - from a maintenance notice to a durable checkpoint, the
 * way a training loop sees it. Public API only; the metadata server and
 * Cloud Storage come from the environment (GCE_METADATA_HOST,
 * STORAGE_EMULATOR_HOST): bench/run_notice.sh starts the loopback fakes
 * and announces TERMINATE_ON_HOST_MAINTENANCE once this program is ready.
 *
 * A synthetic model of --size bytes "trains" (one step every --step-ms,
 * ckpt_should_save asked at each) under the watcher, with the engine's
 * default policy and a --window s notice. On the notice the loop does
 * what README's Maintenance section says: ckpt_save_ex with the advice's
 * reason (the engine plans codec and in-flight saves), then stops. It
 * measures from the moment the engine saw the notice (advice.notice_ns):
 * to durable (local directory, or gs:// alone), to committed in Cloud
 * Storage (ckpt_upload_wait for a directory with a remote), the margin
 * left in the window, and, from those throughputs, the largest state
 * that would fit a 60 s, 30 s and 5-minute window on this machine.
 *
 * --warmup N periodic saves come first (each waited for, its upload too),
 * so the engine plans from saves it measured rather than from its probe.
 *
 * usage: bench_notice --loc DIR|gs://B/P [--remote gs://B/P] [--size 4G]
 *                     [--window 60] [--step-ms 20] [--ready FILE]
 *                     [--codec none|zstd|float] [--warmup N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "synth.h"

static double unix_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fits(const char *what, double bytes, double secs)
{
	static const int windows[] = { 30, 60, 300 };
	char b[32];
	int i;

	printf("largest state %s within", what);
	for (i = 0; i < 3; i++)
		printf(" %ds: %s%s", windows[i],
		       synth_fmt_bytes((uint64_t)(bytes / secs * windows[i]), b,
				       sizeof(b)),
		       i < 2 ? "," : "\n");
}

int main(int argc, char **argv)
{
	const char *loc = NULL, *remote = NULL, *ready = NULL;
	uint64_t size = 4ull << 30, step;
	unsigned window = 60, step_ms = 20, warmup = 0;
	int codec = CKPT_CODEC_FLOAT, err = 0, i, gcs;
	struct synth_model m;
	ckpt_tensor *desc;
	ckpt_settings s;
	ckpt_watch_opts o;
	ckpt_save_advice a;
	ckpt_save_opts so;
	ckpt_plan p;
	ckpt *c = NULL;
	double t_notice, t_durable, t_committed = 0, t0;
	char b1[32];

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--loc"))
			loc = argv[i + 1];
		else if (!strcmp(argv[i], "--remote"))
			remote = argv[i + 1];
		else if (!strcmp(argv[i], "--size"))
			err |= synth_parse_size(argv[i + 1], &size);
		else if (!strcmp(argv[i], "--window"))
			window = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--step-ms"))
			step_ms = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--ready"))
			ready = argv[i + 1];
		else if (!strcmp(argv[i], "--codec"))
			codec = ckpt_codec_from_name(argv[i + 1]);
		else if (!strcmp(argv[i], "--warmup"))
			warmup = (unsigned)atoi(argv[i + 1]);
		else
			err = 1;
	}
	if (i != argc || !loc || err || codec < 0 || !window) {
		fprintf(stderr,
			"usage: bench_notice --loc DIR|gs://B/P [--remote "
			"gs://B/P] [--size 4G] [--window 60] [--step-ms 20] "
			"[--ready FILE] [--codec none|zstd|float] "
			"[--warmup N]\n");
		return 2;
	}
	gcs = !strncmp(loc, "gs://", 5);
	if (synth_plan(&m, size, 0, SYNTH_EXACT) || synth_alloc(&m))
		return 1;
	synth_fill(&m, 1, 0);
	desc = calloc(m.count, sizeof(*desc));
	if (!desc)
		return 1;
	synth_to_ckpt(&m, desc);
	ckpt_settings_default(&s);
	s.codec = codec;
	s.remote = remote;
	if (ckpt_open(&c, loc, &s)) {
		fprintf(stderr, "ckpt_open: %s\n", ckpt_errmsg(NULL));
		return 1;
	}
	ckpt_watch_opts_default(&o);
	o.every_seconds = 0;
	o.maintenance_window_ms = window * 1000;
	if (ckpt_watch_start(c, &o)) {
		fprintf(stderr, "ckpt_watch_start: %s\n", ckpt_errmsg(NULL));
		return 1;
	}
	for (step = 1; step <= warmup; step++) {
		ckpt_save_opts_default(&so);
		so.reason = CKPT_REASON_PERIODIC;
		t0 = synth_now();
		err = ckpt_save_ex(c, step, desc, m.count, &so);
		if (!err)
			err = ckpt_wait(c);
		t_durable = synth_now();
		if (!err && remote)
			err = ckpt_upload_wait(c, -1);
		if (err) {
			fprintf(stderr, "warm-up save: %s\n", ckpt_errmsg(c));
			return 1;
		}
		printf("warm-up save %llu: durable in %.2f s, committed in "
		       "Cloud Storage in %.2f s\n",
		       (unsigned long long)step, t_durable - t0,
		       synth_now() - t0);
	}
	if (ready) {
		FILE *f = fopen(ready, "w");

		if (f)
			fclose(f);
	}
	/* the loop: a step, then the one cheap question */
	t0 = synth_now();
	for (step = warmup + 1;; step++) {
		usleep(step_ms * 1000);
		if (ckpt_should_save(c, step, &a) &&
		    a.reason != CKPT_REASON_PERIODIC)
			break;
		if (synth_now() - t0 > 600) {
			fprintf(stderr, "no notice within 600 s\n");
			return 1;
		}
	}
	t_notice = (double)a.notice_ns / 1e9;
	ckpt_save_opts_default(&so);
	so.reason = a.reason;
	err = ckpt_save_ex(c, step, desc, m.count, &so);
	if (!err)
		err = ckpt_wait(c);
	t_durable = unix_s();
	if (!err && remote) {
		err = ckpt_upload_wait(c, -1);
		t_committed = unix_s();
	}
	if (err) {
		fprintf(stderr, "save: %s\n", ckpt_errmsg(c));
		return 1;
	}
	ckpt_plan_get(c, &p);
	printf("state %s, %s%s%s, window %u s, stop asked: %s\n",
	       synth_fmt_bytes(m.total_bytes, b1, sizeof(b1)), loc,
	       remote ? " + " : "", remote ? remote : "", window,
	       ckpt_should_stop(c) ? "yes" : "no");
	printf("plan %s+%s%s: predicted %.2f s of %.2f s left, from disk "
	       "%.0f MB/s, Cloud Storage %.0f MB/s, %s encode %.0f MB/s "
	       "ratio %.3f\n",
	       p.dest == CKPT_PLAN_REMOTE ? "gcs" : "local",
	       ckpt_codec_name(p.codec),
	       p.inflight == CKPT_INFLIGHT_CANCEL ? " (periodic cancelled)" :
	       p.inflight == CKPT_INFLIGHT_FINISH ? " (periodic finished)" :
						    "",
	       p.predicted_s, p.left_s, p.local_bps / 1e6, p.remote_bps / 1e6,
	       ckpt_codec_name(p.codec), p.encode_bps[p.codec] / 1e6,
	       p.ratio[p.codec]);
	printf("notice -> durable %s: %.2f s; margin in the %u s window: "
	       "%.2f s (deadline %s)\n",
	       gcs ? "in Cloud Storage (gs:// alone)" : "local checkpoint",
	       t_durable - t_notice, window, p.margin_s,
	       p.deadline_met == 1 ? "met" : "MISSED");
	if (remote)
		printf("notice -> committed in Cloud Storage: %.2f s; margin "
		       "in the %u s window: %.2f s\n",
		       t_committed - t_notice, window,
		       window - (t_committed - t_notice));
	fits(gcs ? "committed in Cloud Storage" : "durable locally",
	     (double)m.total_bytes, t_durable - t_notice);
	if (remote)
		fits("committed in Cloud Storage (local first)",
		     (double)m.total_bytes, t_committed - t_notice);
	ckpt_close(c);
	synth_free(&m);
	free(desc);
	return 0;
}
