/*
 * plan.h - the save a notice asks for, planned against its deadline from
 * throughputs measured on this host (plan.c). Not API.
 *
 * Measurements: encode.c adds the wall time, raw and stored bytes of
 * every chunk it encodes to the counters of the codec the save asked for;
 * when a save ends the writer turns the save's share into an encode speed
 * (for all workers) and a ratio, and the save's duration into the write
 * throughput of its destination (local disk, or Cloud Storage for a
 * gs:// location; the upload of a directory's remote when it commits).
 * ckpt_watch_start probes what no save has measured yet.
 */
#ifndef CKPT_ENGINE_PLAN_H
#define CKPT_ENGINE_PLAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ckpt.h"

struct ckpt;
struct eng_job;

/* Measurements a test may impose (eng_plan_inject): bytes per second. */
struct eng_plan_meas {
	double local_bps, remote_bps;
	double enc_bps[CKPT_CODEC_COUNT];
	double ratio[CKPT_CODEC_COUNT];
};

struct eng_plan {
	/* encode.c, per codec asked for (atomics: the hot path) */
	atomic_ullong enc_ns[CKPT_CODEC_COUNT];
	atomic_ullong enc_raw[CKPT_CODEC_COUNT];
	atomic_ullong enc_stored[CKPT_CODEC_COUNT];

	pthread_mutex_t mu; /* guards the rest */
	struct eng_plan_meas m;
	int saves[CKPT_CODEC_COUNT];   /* saves that measured a codec */
	int local_saves, remote_saves; /* ... and a destination */
	int fixed;                     /* injected: saves change nothing */
	/* the save in flight, from its start */
	uint64_t step;
	int32_t codec;
	int64_t start_mono;
	uint64_t ns0, raw0, stored0;
	uint64_t upload_step; /* directory + remote: its upload's step */
	int64_t upload_start_mono;
	int64_t upload_local_mono; /* ... when its local save ended */
	struct eng_rprobe *rprobe; /* plan_remote.c, while it runs */
	ckpt_plan cur; /* the last plan and its outcome (ckpt_plan_get) */
	int64_t cur_notice_ns; /* when its notice was seen */
	/* tests: called once the fate of a save in flight is decided,
	 * before waiting for it (with enum ckpt_plan_inflight) */
	void (*settled)(void *arg, int action);
	void *settled_arg;
};

int eng_plan_open(struct ckpt *c);
void eng_plan_close(struct ckpt *c);
/* encode.c: one chunk encoded for a save that asked for `codec`. */
void eng_plan_enc(struct ckpt *c, int codec, uint64_t ns, uint64_t raw,
		  uint64_t stored);
/* ckpt_watch_start: a small probe of what no save has measured. */
void eng_plan_probe(struct ckpt *c);
/* save.c, before a save with a notice's reason takes the handle: plans
 * it (may change job->codec unless codec_explicit), finishes or cancels
 * a periodic save in flight and waits for it; journals that. */
void eng_plan_before_save(struct ckpt *c, struct eng_job *job,
			  int codec_explicit);
/* watch.c hooks, under the handle's mu: a save starts / is over. */
void eng_plan_save_started(struct ckpt *c, struct eng_job *job);
void eng_plan_save_done(struct ckpt *c, struct eng_job *job);
/* sink_gcs.c: a directory's upload of `step` committed (bytes sent). */
void eng_plan_upload_done(struct ckpt *c, uint64_t step, uint64_t bytes);
/* The plan of the notice save in flight or last done (notice.c). */
void eng_plan_snapshot(struct ckpt *c, ckpt_plan *out);
/* "local+zstd" */
void eng_plan_name(const ckpt_plan *p, char out[32]);
/* Predicted seconds of a save of `raw` bytes with codec/dest. */
double eng_plan_estimate(struct ckpt *c, uint64_t raw, int codec, int dest);
/* plan_remote.c: a directory with a remote (one host) probes Cloud
 * Storage's own write pace in a thread (ckpt_watch_start); stop cancels
 * and joins it (eng_plan_close). */
int eng_plan_probe_remote(struct ckpt *c);
void eng_plan_probe_remote_stop(struct ckpt *c);
/* The probe's result: the network's pace, bytes per second. */
void eng_plan_remote_pace(struct ckpt *c, double bps);
/* ckpt_close, directory with a remote: after a notice's durable save,
 * waits for the upload until 3 s before the notice's deadline; journals
 * the outcome. */
void eng_plan_close_upload(struct ckpt *c);
/* tests: impose measurements (and keep them). */
void eng_plan_inject(struct ckpt *c, const struct eng_plan_meas *m);

#endif
