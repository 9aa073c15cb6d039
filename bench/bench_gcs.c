/*
 * bench_gcs.c - one save of a synthetic model to a directory, to gs://,
 * or to both, timed: when ckpt_save returned, when the step was durable
 * and committed where ckpt_wait says, and (with a remote) when it was
 * committed in the bucket (ckpt_upload_wait). Public API only; the
 * server comes from the environment (STORAGE_EMULATOR_HOST, ...).
 *
 * usage: bench_gcs --mode local|both|gcs --dir DIR --remote gs://B/P
 *                  [--size BYTES] [--step N] [--codec none|float]
 * Prints one line: mode=... bytes=... save_s=... local_s=... bucket_s=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "synth.h"

int main(int argc, char **argv)
{
	const char *mode = "both", *dir = NULL, *remote = NULL;
	uint64_t size = 1ull << 30, step = 1;
	int codec = CKPT_CODEC_NONE, err, i;
	struct synth_model m;
	ckpt_tensor *desc;
	ckpt_settings s;
	ckpt_upload_status us;
	ckpt *c = NULL;
	double t0, t1, t2, t3;

	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--mode"))
			mode = argv[i + 1];
		else if (!strcmp(argv[i], "--dir"))
			dir = argv[i + 1];
		else if (!strcmp(argv[i], "--remote"))
			remote = argv[i + 1];
		else if (!strcmp(argv[i], "--size"))
			synth_parse_size(argv[i + 1], &size);
		else if (!strcmp(argv[i], "--step"))
			step = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--codec"))
			codec = strcmp(argv[i + 1], "none") ? CKPT_CODEC_FLOAT :
							      CKPT_CODEC_NONE;
	}
	if (i != argc || (strcmp(mode, "gcs") && !dir) ||
	    (strcmp(mode, "local") && !remote)) {
		fprintf(stderr, "usage: bench_gcs --mode local|both|gcs --dir "
				"DIR --remote gs://B/P [--size B] [--step N] "
				"[--codec none|float]\n");
		return 2;
	}
	if (synth_plan(&m, size, 0, SYNTH_EXACT) || synth_alloc(&m))
		return 1;
	synth_fill(&m, step, 0);
	desc = calloc(m.count, sizeof(*desc));
	if (!desc)
		return 1;
	synth_to_ckpt(&m, desc);
	ckpt_settings_default(&s);
	s.codec = codec;
	if (!strcmp(mode, "both"))
		s.remote = remote;
	err = ckpt_open(&c, !strcmp(mode, "gcs") ? remote : dir, &s);
	if (err) {
		fprintf(stderr, "ckpt_open: %s\n", ckpt_errmsg(NULL));
		return 1;
	}
	t0 = synth_now();
	err = ckpt_save(c, step, desc, m.count);
	t1 = synth_now();
	if (!err)
		err = ckpt_wait(c);
	t2 = synth_now();
	if (!err && !strcmp(mode, "both"))
		err = ckpt_upload_wait(c, -1);
	t3 = synth_now();
	if (err) {
		fprintf(stderr, "save: %s\n", ckpt_errmsg(c));
		return 1;
	}
	memset(&us, 0, sizeof(us));
	if (strcmp(mode, "local"))
		ckpt_upload_status_get(c, &us);
	printf("mode=%s bytes=%llu save_s=%.3f local_s=%.3f bucket_s=%.3f "
	       "MiB/s=%.0f retries=%llu\n",
	       mode, (unsigned long long)m.total_bytes, t1 - t0,
	       strcmp(mode, "gcs") ? t2 - t0 : 0.0,
	       strcmp(mode, "local") ? (strcmp(mode, "gcs") ? t3 : t2) - t0 :
				       0.0,
	       m.total_bytes / 1048576.0 /
		       ((strcmp(mode, "both") ? t2 : t3) - t0),
	       (unsigned long long)us.retries);
	ckpt_close(c);
	synth_free(&m);
	free(desc);
	return 0;
}
