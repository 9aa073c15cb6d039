/*
 * plan_remote.c - Cloud Storage's own write pace, for the planner: a probe
 * at ckpt_watch_start on a directory with a remote.
 *
 * Design note. The planner sends a notice's save straight to the remote
 * when the network beats the disk (plan.c). The uploads of a directory's
 * remote cannot show that: they stream the staged buffers as the local
 * save produces them, so when the network is the faster one they end with
 * the local save and measure the disk (a lower bound of the network; see
 * eng_plan_upload_done). So, once per handle, a thread uploads
 * CKPT_PROBE_REMOTE_MIB (default 64; 0: no probe) of incompressible bytes
 * as one object per stream in parallel, the way a save's files go
 * (REMOTE/.probe/hHHHHH-PID-K, outside every step, removed at once), and
 * the time to the last finalized object gives the pace. A probe is short,
 * so it understates a fast network (connections warming up): the planner
 * errs towards the disk. ckpt_close cancels a probe still running (its
 * objects may then stay: outside every step, nothing reads them).
 *
 *   ckpt_watch_start --eng_plan_probe--> thread: upload x streams
 *       --all finalized--> eng_plan_remote_pace(bps) --> remove objects
 *   eng_plan_close --gcs_cancel--> join
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "gcs.h"
#include "plan.h"
#include "save_internal.h"

#define MAX_STREAMS 32

struct eng_rprobe {
	struct ckpt *c;
	pthread_t thr;
	struct gcs_client *gc;
	char *bucket, *prefix;
	uint64_t bytes; /* per object */
	unsigned n;
};

static uint64_t probe_bytes(void)
{
	const char *e = getenv("CKPT_PROBE_REMOTE_MIB");
	char *end;
	unsigned long long v;

	if (!e || !*e)
		return 64ull << 20;
	v = strtoull(e, &end, 10);
	if (*end || v > 4096)
		return 64ull << 20;
	return (uint64_t)v << 20;
}

static void *probe_main(void *arg)
{
	struct eng_rprobe *q = arg;
	struct gcs_upload *u[MAX_STREAMS] = { 0 };
	char *name[MAX_STREAMS] = { 0 };
	uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	uint64_t *buf = malloc(q->bytes);
	size_t pl = strlen(q->prefix);
	double bps = 0;
	int64_t t0;
	unsigned i, ok = 0;

	if (!buf)
		return NULL;
	for (i = 0; i < q->bytes / 8; i++) { /* xorshift: incompressible */
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = x;
	}
	t0 = eng_mono_ns();
	for (i = 0; i < q->n; i++) {
		struct gcs_upload_opts o = { .cond = GCS_NO_COND,
					     .size = q->bytes };

		name[i] = eng_path("%s%s.probe/h%05u-%d-%u", q->prefix,
				   pl && q->prefix[pl - 1] != '/' ? "/" : "",
				   q->c->s.host_index, (int)getpid(), i);
		if (!name[i] ||
		    gcs_upload_start(q->gc, q->bucket, name[i], &o, &u[i]) ||
		    gcs_upload_append(u[i], buf, q->bytes, NULL, NULL) ||
		    gcs_upload_finish(u[i], NULL))
			break;
	}
	if (i == q->n) {
		for (i = 0; i < q->n; i++)
			ok += gcs_op_wait(gcs_upload_op(u[i])) == 0;
		if (ok == q->n)
			bps = (double)(q->bytes * q->n) /
			      ((double)(eng_mono_ns() - t0) / 1e9);
	}
	for (i = 0; i < q->n; i++) {
		if (u[i])
			gcs_upload_free(u[i]);
		if (name[i])
			gcs_delete(q->gc, q->bucket, name[i], 0, GCS_NO_COND);
		free(name[i]);
	}
	free(buf);
	if (bps > 0) /* once its objects are gone */
		eng_plan_remote_pace(q->c, bps);
	return NULL;
}

static void rprobe_free(struct eng_rprobe *q)
{
	if (q->gc)
		gcs_client_free(q->gc);
	free(q->bucket);
	free(q->prefix);
	free(q);
}

int eng_plan_probe_remote(struct ckpt *c)
{
	struct gcs_config cfg = { 0 };
	struct eng_rprobe *q;
	uint64_t total = probe_bytes();
	int r;

	if (!c->plan || c->plan->rprobe || !total || !c->remote_url ||
	    c->remote_only || c->s.host_count != 1)
		return 0;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->c = c;
	q->n = eng_gcs_streams();
	if (q->n > MAX_STREAMS)
		q->n = MAX_STREAMS;
	if (q->n < 1)
		q->n = 1;
	q->bytes = total / q->n;
	q->bytes -= q->bytes % 8;
	if (q->bytes < 65536)
		q->bytes = 65536;
	r = eng_loc_parse(c->remote_url, &q->bucket, &q->prefix, NULL);
	if (r >= 0) {
		cfg.streams = q->n;
		cfg.deadline_s = 120;
		r = gcs_client_new(&q->gc, &cfg);
	}
	if (r >= 0)
		r = -pthread_create(&q->thr, NULL, probe_main, q);
	if (r < 0) {
		rprobe_free(q);
		return r;
	}
	c->plan->rprobe = q;
	return 0;
}

void eng_plan_probe_remote_stop(struct ckpt *c)
{
	struct eng_rprobe *q = c->plan ? c->plan->rprobe : NULL;

	if (!q)
		return;
	gcs_cancel(q->gc);
	pthread_join(q->thr, NULL);
	rprobe_free(q);
	c->plan->rprobe = NULL;
}
