/*
 * plan.c - the fastest way to a durable checkpoint within a notice's
 * deadline, from throughputs measured on this host.
 *
 * Design note. A save takes about max(raw / encode speed, stored / write
 * throughput) + a small fixed cost: workers encode while the writer
 * writes, so the slower of the two sets the pace. Both sides are measured
 * per codec and per destination (plan.h says where), kept as a running
 * mean, and probed once at ckpt_watch_start when no save has measured
 * them. A probe's ratio (synthetic bf16 data) stands only until a real
 * save measures the codec.
 *
 * When the loop starts the save a notice asked for (ckpt_save_ex with the
 * notice's reason), eng_plan_before_save:
 *   1. keeps the handle's codec if its predicted time, times SAFETY, fits
 *      the time left, else takes the codec predicted fastest;
 *   2. with a periodic save in flight: lets it finish if it and the new
 *      save both fit, else cancels it (the writer then removes its partial
 *      output, as for any failed save: no COMMIT, nothing visible), unless
 *      neither fits and it is nearer its end than the new save would be;
 *      then waits for it, takes its status (the plan collected it, so the
 *      loop's save is not refused with CKPT_E_PREVIOUS) and journals it;
 *   3. records the plan (ckpt_plan_get, the journal's save line).
 * The destination: a gs:// location's own; a directory's (the upload to
 * its remote, if any, resumes after the reboot) unless the directory has
 * a remote, one host saves, the remote's throughput has been measured and
 * the save is predicted faster there than on the disk (each with its
 * best codec; the remote's pace comes from a probe at ckpt_watch_start,
 * plan_remote.c, since a directory's uploads only show the disk's pace
 * when the network is faster): then the save goes straight to the remote
 * through a direct sink (c->rsink, the one gs:// alone uses, made at the
 * first such save) and is committed in the bucket only; the directory
 * gets no step. The restart takes the newest of both (ckptctl run
 * --remote).
 *
 *   encode.c --eng_plan_enc--> counters     save.c --before_save--> plan
 *   writer (save over) --eng_plan_save_done--> measurements, outcome
 *   sink_gcs (upload committed) --eng_plan_upload_done--> remote_bps
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "events.h"
#include "plan.h"
#include "save_internal.h"
#include "watch_internal.h"

#define SAFETY 1.25            /* predicted time * SAFETY must fit */
#define FIXED_S 0.02           /* commit, fsyncs, mkdir */
#define MIN_MEASURE (1u << 20) /* smaller saves measure nothing */
#define PROBE_BYTES (32u << 20)
#define PROBE_CHUNK (4u << 20)

/* Used until something is measured: a plausible disk and network. */
static const double default_write_bps[2] = { 200e6, 50e6 };

int eng_plan_open(struct ckpt *c)
{
	struct eng_plan *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	c->plan = p;
	return 0;
}

void eng_plan_close(struct ckpt *c)
{
	if (!c->plan)
		return;
	eng_plan_probe_remote_stop(c);
	pthread_mutex_destroy(&c->plan->mu);
	free(c->plan);
	c->plan = NULL;
}

void eng_plan_enc(struct ckpt *c, int codec, uint64_t ns, uint64_t raw,
		  uint64_t stored)
{
	struct eng_plan *p = c->plan;

	if (!p || codec < 0 || codec >= CKPT_CODEC_COUNT)
		return;
	atomic_fetch_add_explicit(&p->enc_ns[codec], ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&p->enc_raw[codec], raw,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&p->enc_stored[codec], stored,
				  memory_order_relaxed);
}

/* Workers that encode at once. */
static double parallel(const struct ckpt *c)
{
	unsigned n = eng_ncpus();

	return (double)(c->nworkers < n ? c->nworkers : n);
}

/* Running mean over saves; the first save's replaces a probe's. */
static void update(double *v, double x, int saves)
{
	*v = saves && *v > 0 ? (*v + x) / 2 : x;
}

/* ---- estimates -------------------------------------------------------- */

static double est(const struct eng_plan_meas *m, uint64_t raw, int codec,
		  int dest)
{
	double enc = m->enc_bps[codec], ratio = m->ratio[codec];
	double w = dest == CKPT_PLAN_REMOTE ? m->remote_bps : m->local_bps;
	double te, tw;

	if (w <= 0)
		w = default_write_bps[dest == CKPT_PLAN_REMOTE];
	if (ratio <= 0)
		ratio = 1;
	te = enc > 0 ? (double)raw / enc : 0;
	tw = (double)raw * ratio / w;
	return (te > tw ? te : tw) + FIXED_S;
}

double eng_plan_estimate(struct ckpt *c, uint64_t raw, int codec, int dest)
{
	struct eng_plan_meas m;

	pthread_mutex_lock(&c->plan->mu);
	m = c->plan->m;
	pthread_mutex_unlock(&c->plan->mu);
	return est(&m, raw, codec, dest);
}

void eng_plan_name(const ckpt_plan *p, char out[32])
{
	snprintf(out, 32, "%s+%s",
		 p->dest == CKPT_PLAN_REMOTE ? "gcs" : "local",
		 ckpt_codec_name(p->codec) ? ckpt_codec_name(p->codec) : "?");
}

static void fill_meas(ckpt_plan *o, const struct eng_plan_meas *m)
{
	int k;

	o->local_bps = m->local_bps;
	o->remote_bps = m->remote_bps;
	for (k = 0; k < CKPT_CODEC_COUNT; k++) {
		o->encode_bps[k] = m->enc_bps[k];
		o->ratio[k] = m->ratio[k];
	}
}

/* ---- measuring ---------------------------------------------------------- */

void eng_plan_save_started(struct ckpt *c, eng_job *job)
{
	struct eng_plan *p = c->plan;
	int k = job->codec;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->step = job->step;
	p->codec = k;
	p->start_mono = eng_mono_ns();
	p->ns0 = atomic_load(&p->enc_ns[k]);
	p->raw0 = atomic_load(&p->enc_raw[k]);
	p->stored0 = atomic_load(&p->enc_stored[k]);
	if (c->remote_url && !job->to_remote) {
		p->upload_step = job->step;
		p->upload_start_mono = p->start_mono;
		p->upload_local_mono = 0;
	}
	pthread_mutex_unlock(&p->mu);
}

static void measure(struct ckpt *c, struct eng_plan *p, eng_job *job,
		    int64_t now)
{
	int k = job->codec, dest = c->remote_only || job->to_remote ?
					   CKPT_PLAN_REMOTE :
					   CKPT_PLAN_LOCAL;
	uint64_t ns = atomic_load(&p->enc_ns[k]) - p->ns0;
	uint64_t raw = atomic_load(&p->enc_raw[k]) - p->raw0;
	uint64_t stored = atomic_load(&p->enc_stored[k]) - p->stored0;
	double dur = (double)(now - p->start_mono) / 1e9, bytes = 0, te, bps;
	double *wr = dest ? &p->m.remote_bps : &p->m.local_bps;
	int *cnt = dest ? &p->remote_saves : &p->local_saves;
	uint32_t f;

	if (p->fixed || job->payload_total < MIN_MEASURE || !ns || !raw ||
	    dur <= 0)
		return;
	update(&p->m.enc_bps[k], (double)raw / ((double)ns / 1e9) * parallel(c),
	       p->saves[k]);
	update(&p->m.ratio[k], (double)stored / (double)raw, p->saves[k]);
	p->saves[k]++;
	for (f = 0; f < job->nfiles; f++)
		bytes += (double)job->files[f].size;
	bps = bytes / dur;
	te = (double)job->payload_total / p->m.enc_bps[k];
	/* the writes set the pace: a measurement; else a lower bound */
	if (te < dur / 2) {
		update(wr, bps, *cnt);
		(*cnt)++;
	} else if (bps > *wr) {
		*wr = bps;
	}
}

void eng_plan_save_done(struct ckpt *c, eng_job *job)
{
	struct eng_plan *p = c->plan;
	int64_t now = eng_mono_ns();

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	if (p->step == job->step)
		measure(c, p, job, now);
	if (p->upload_step == job->step)
		p->upload_local_mono = now;
	if (p->cur.event && p->cur.step == job->step && p->cur.status == 1) {
		ckpt_plan *o = &p->cur;

		o->status = job->status;
		if (job->status == 0) {
			o->durable_ns = eng_unix_ns();
			if (o->deadline_ns) {
				o->deadline_met = o->durable_ns <=
						  o->deadline_ns;
				o->margin_s = (double)(o->deadline_ns -
						       o->durable_ns) /
					      1e9;
			}
		}
	}
	pthread_mutex_unlock(&p->mu);
}

void eng_plan_upload_done(struct ckpt *c, uint64_t step, uint64_t bytes)
{
	struct eng_plan *p = c ? c->plan : NULL;
	double dur, committed = -1;
	int64_t now;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	if (p->cur.event && p->cur.step == step)
		committed = (double)(eng_unix_ns() - p->cur_notice_ns) / 1e9;
	now = eng_mono_ns();
	dur = (double)(now - p->upload_start_mono) / 1e9;
	/* From the save's start. When the upload ended well after the
	 * local save (it had a backlog), the network set the pace: a
	 * measurement. Else it kept up with the disk: only a lower bound
	 * of the network (the probe's may be higher). */
	if (!p->fixed && step == p->upload_step && bytes >= MIN_MEASURE &&
	    dur > 0) {
		double local = p->upload_local_mono ?
				       (double)(p->upload_local_mono -
						p->upload_start_mono) /
					       1e9 :
				       dur;

		if (dur - local > local / 4) {
			update(&p->m.remote_bps, (double)bytes / dur,
			       p->remote_saves);
			p->remote_saves++;
		} else if ((double)bytes / dur > p->m.remote_bps) {
			p->m.remote_bps = (double)bytes / dur;
		}
	}
	pthread_mutex_unlock(&p->mu);
	if (committed >= 0) { /* a notice's save reached the bucket */
		json_t *o = json_object();

		json_object_set_new(o, "source", json_string("upload"));
		json_object_set_new(o, "step", json_integer((json_int_t)step));
		json_object_set_new(o, "committed_s", json_real(committed));
		eng_event_log(c, o);
	}
}

#define CLOSE_MARGIN_NS (3 * (int64_t)1000000000)

void eng_plan_close_upload(struct ckpt *c)
{
	int64_t left, t0;
	ckpt_plan o;
	json_t *j;
	int r;

	if (!c->plan || !c->remote_url || c->remote_only)
		return;
	eng_plan_snapshot(c, &o);
	if (!o.event || o.status != 0 || !o.deadline_ns ||
	    o.dest != CKPT_PLAN_LOCAL)
		return;
	left = o.deadline_ns - eng_unix_ns() - CLOSE_MARGIN_NS;
	if (left <= 0)
		return;
	t0 = eng_mono_ns();
	r = ckpt_upload_wait(c, (int)(left / 1000000 > INT32_MAX ?
					      INT32_MAX :
					      left / 1000000));
	j = json_object();
	json_object_set_new(j, "source", json_string("upload"));
	json_object_set_new(j, "action", json_string("close-wait"));
	json_object_set_new(j, "step", json_integer((json_int_t)o.step));
	json_object_set_new(j, "committed", json_boolean(r == 0));
	json_object_set_new(j, "waited_s",
			    json_real((double)(eng_mono_ns() - t0) / 1e9));
	if (r)
		json_object_set_new(j, "error", json_string(ckpt_strerror(r)));
	eng_event_log(c, j);
}

void eng_plan_remote_pace(struct ckpt *c, double bps)
{
	struct eng_plan *p = c->plan;

	pthread_mutex_lock(&p->mu);
	if (!p->fixed && bps > p->m.remote_bps)
		p->m.remote_bps = bps;
	pthread_mutex_unlock(&p->mu);
}

void eng_plan_inject(struct ckpt *c, const struct eng_plan_meas *m)
{
	pthread_mutex_lock(&c->plan->mu);
	c->plan->m = *m;
	c->plan->fixed = 1;
	pthread_mutex_unlock(&c->plan->mu);
}

/* ---- the probe ---------------------------------------------------------- */

/* Seconds to write PROBE_BYTES to a temporary file in the root and sync. */
static double probe_disk(struct ckpt *c, uint8_t *buf)
{
	char *tmp = eng_tmp_name(c->root, ".probe");
	int fd, r = 0;
	int64_t t0;
	uint64_t off;
	double s = -1;

	if (!tmp)
		return -1;
	fd = eng_open(tmp,
		      O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC |
			      (c->direct ? O_DIRECT : 0),
		      0600);
	if (fd < 0) {
		free(tmp);
		return -1;
	}
	t0 = eng_mono_ns();
	for (off = 0; off < PROBE_BYTES && r == 0; off += PROBE_CHUNK)
		r = eng_pwrite_all(fd, buf, PROBE_CHUNK, off);
	if (r == 0)
		r = eng_fdatasync(fd);
	if (r == 0)
		s = (double)(eng_mono_ns() - t0) / 1e9;
	eng_close(fd);
	eng_unlink(tmp);
	free(tmp);
	return s;
}

/* Synthetic bf16 weights: a smooth spread of exponents, noisy mantissas. */
static void probe_data(uint8_t *buf, size_t n)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;
	size_t i;

	for (i = 0; i + 1 < n; i += 2) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* sign, exponent 113..124 (|w| ~ 1e-4 .. 0.06), mantissa */
		buf[i] = (uint8_t)x;
		buf[i + 1] = (uint8_t)(((x >> 8) & 0x80) |
				       (0x38 + (unsigned)((x >> 16) % 6)));
	}
}

void eng_plan_probe(struct ckpt *c)
{
	struct eng_plan *p = c->plan;
	struct eng_plan_meas m;
	fmt_codec_ctx *cx = NULL;
	uint8_t *buf, *out;
	double s;
	int k;

	if (!p || c->s.staging_bytes == 0)
		return;
	pthread_mutex_lock(&p->mu);
	m = p->m;
	pthread_mutex_unlock(&p->mu);
	if (!p->fixed && m.remote_bps <= 0) /* in its own thread */
		(void)eng_plan_probe_remote(c);
	if (p->fixed || (m.local_bps > 0 && m.enc_bps[c->s.codec] > 0))
		return;
	if (posix_memalign((void **)&buf, 4096, PROBE_CHUNK))
		return;
	out = malloc(PROBE_CHUNK + 65536);
	probe_data(buf, PROBE_CHUNK);
	if (!c->remote_only && m.local_bps <= 0) {
		s = probe_disk(c, buf);
		if (s > 0)
			m.local_bps = PROBE_BYTES / s;
	}
	if (c->s.codec != CKPT_CODEC_NONE)
		cx = fmt_codec_ctx_new();
	for (k = 0; out && k < CKPT_CODEC_COUNT; k++) {
		size_t stored = PROBE_CHUNK;
		int used = 0, r = 0;
		int64_t t0 = eng_mono_ns();

		if (m.enc_bps[k] > 0 || (k != CKPT_CODEC_NONE && !cx))
			continue;
		(void)fmt_xxh3(buf, PROBE_CHUNK);
		if (k != CKPT_CODEC_NONE)
			r = fmt_chunk_encode(cx, k, c->s.level, 2, buf,
					     PROBE_CHUNK, out,
					     PROBE_CHUNK + 65536, &used,
					     &stored);
		s = (double)(eng_mono_ns() - t0) / 1e9;
		if (r < 0 || s <= 0)
			continue;
		m.enc_bps[k] = PROBE_CHUNK / s * parallel(c);
		m.ratio[k] = used == CKPT_CODEC_NONE ?
				     1.0 :
				     (double)stored / PROBE_CHUNK;
	}
	fmt_codec_ctx_free(cx);
	free(out);
	free(buf);
	pthread_mutex_lock(&p->mu);
	if (!p->fixed) {
		if (p->m.local_bps <= 0)
			p->m.local_bps = m.local_bps;
		for (k = 0; k < CKPT_CODEC_COUNT; k++)
			if (p->m.enc_bps[k] <= 0) {
				p->m.enc_bps[k] = m.enc_bps[k];
				p->m.ratio[k] = m.ratio[k];
			}
	}
	pthread_mutex_unlock(&p->mu);
}

/* ---- planning ------------------------------------------------------------ */

static int codec_usable(const struct ckpt *c, int k)
{
	return k == CKPT_CODEC_NONE || c->nout > 0;
}

/* The codec: the job's if it fits with the margin, else the fastest. */
static int choose_codec(const struct ckpt *c, const struct eng_plan_meas *m,
			uint64_t raw, int codec, int dest, double left,
			double *pred)
{
	int k, best = codec;

	*pred = est(m, raw, codec, dest);
	if (*pred * SAFETY <= left)
		return codec;
	for (k = 0; k < CKPT_CODEC_COUNT; k++) {
		double t = est(m, raw, k, dest);

		if (codec_usable(c, k) && t < *pred) {
			*pred = t;
			best = k;
		}
	}
	return best;
}

static void log_inflight(struct ckpt *c, const char *action, uint64_t step,
			 int status, double remaining)
{
	json_t *o = json_object();

	json_object_set_new(o, "source", json_string("periodic"));
	json_object_set_new(o, "action", json_string(action));
	json_object_set_new(o, "step", json_integer((json_int_t)step));
	json_object_set_new(o, "predicted_s", json_real(remaining));
	if (status && status != CKPT_E_CANCELED)
		json_object_set_new(o, "error",
				    json_string(ckpt_strerror(status)));
	eng_event_log(c, o);
}

/* A periodic (or unspecified) save in flight: finish or cancel it, wait,
 * and take its status. Returns enum ckpt_plan_inflight. */
static int settle_inflight(struct ckpt *c, const struct eng_plan_meas *m,
			   int dest, double left, double pred)
{
	double rem;
	uint64_t step;
	int action, st;

	pthread_mutex_lock(&c->mu);
	if (!c->busy || !c->job || c->job->reason > CKPT_REASON_PERIODIC) {
		pthread_mutex_unlock(&c->mu);
		return CKPT_INFLIGHT_NONE;
	}
	step = c->job->step;
	rem = est(m,
		  c->bytes_total > c->bytes_written ?
			  c->bytes_total - c->bytes_written :
			  0,
		  c->job->codec, dest);
	if (rem + pred <= left / SAFETY)
		action = CKPT_INFLIGHT_FINISH;
	else if (pred <= left / SAFETY)
		action = CKPT_INFLIGHT_CANCEL;
	else
		action = rem < pred ? CKPT_INFLIGHT_FINISH :
				      CKPT_INFLIGHT_CANCEL;
	/* too late to cancel once its index is being published */
	if (action == CKPT_INFLIGHT_CANCEL &&
	    (c->job->finishing || c->job->status))
		action = CKPT_INFLIGHT_FINISH;
	if (action == CKPT_INFLIGHT_CANCEL) {
		c->job->status = CKPT_E_CANCELED;
		snprintf(c->job->msg, sizeof(c->job->msg),
			 "%s: save of step %llu cancelled: the save a notice "
			 "asked for needs the time",
			 c->job->stepdir, (unsigned long long)step);
		pthread_cond_broadcast(&c->slot_cv);
		pthread_cond_broadcast(&c->out_cv);
	}
	pthread_mutex_unlock(&c->mu);
	eng_writer_wake(c);
	if (c->plan->settled)
		c->plan->settled(c->plan->settled_arg, action);
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	st = c->status;
	c->uncollected = 0; /* the plan took it: not the loop's failure */
	pthread_mutex_unlock(&c->mu);
	log_inflight(c, action == CKPT_INFLIGHT_CANCEL ? "cancel" : "finish",
		     step, st, rem);
	return action;
}

/* A directory with a remote, one host: is the remote (with its best
 * codec) predicted faster than the disk? Only once the remote's
 * throughput is measured (an upload committed, or injected). */
static int remote_faster(const struct ckpt *c, const struct eng_plan_meas *m,
			 const eng_job *job, int codec_explicit, double left,
			 int *codec, double *pred)
{
	double pr;
	int k = job->codec;

	if (!c->remote_url || c->remote_only || c->s.host_count != 1 ||
	    m->remote_bps <= 0)
		return 0;
	if (codec_explicit)
		pr = est(m, job->payload_total, k, CKPT_PLAN_REMOTE);
	else
		k = choose_codec(c, m, job->payload_total, k, CKPT_PLAN_REMOTE,
				 left, &pr);
	if (pr >= *pred)
		return 0;
	*codec = k;
	*pred = pr;
	return 1;
}

/* Points the job at the remote: the direct sink (made at the first such
 * save) and REMOTE/step-N. The directory's upload sink gives back the
 * staged buffers it still holds, since this save does not pass it. */
static int to_remote(struct ckpt *c, eng_job *job)
{
	char dname[32], *sd;
	int r = 0;

	if (!c->rsink) {
		r = eng_gcs_sink_new(c, c->remote_url, 1, &c->rsink);
		if (r == 0)
			c->rsink->index = 0;
	}
	fmt_step_dirname(job->step, dname);
	sd = r == 0 ? eng_path("%s/%s", c->remote_url, dname) : NULL;
	if (!sd) {
		json_t *o = json_object();

		r = r ? r : -ENOMEM;
		json_object_set_new(o, "source", json_string("plan"));
		json_object_set_new(o, "action", json_string("remote-failed"));
		json_object_set_new(o, "step",
				    json_integer((json_int_t)job->step));
		json_object_set_new(o, "error", json_string(ckpt_strerror(r)));
		eng_event_log(c, o);
		return r;
	}
	free(job->stepdir);
	job->stepdir = sd;
	job->to_remote = 1;
	eng_gcs_reclaim(c);
	return 0;
}

void eng_plan_before_save(struct ckpt *c, eng_job *job, int codec_explicit)
{
	struct eng_plan *p = c->plan;
	struct eng_plan_meas m;
	int64_t deadline = job->deadline_ns, notice = 0, now;
	uint64_t event = 0;
	int dest = c->remote_only ? CKPT_PLAN_REMOTE : CKPT_PLAN_LOCAL;
	int codec = job->codec, inflight, local_codec;
	double left = INFINITY, pred, local_pred;
	ckpt_plan o;

	if (!p)
		return;
	eng_watch_notice_of(c, job->reason, &deadline, &notice, &event);
	pthread_mutex_lock(&p->mu);
	m = p->m;
	pthread_mutex_unlock(&p->mu);
	now = eng_unix_ns();
	if (deadline)
		left = (double)(deadline - now) / 1e9;
	if (codec_explicit)
		pred = est(&m, job->payload_total, codec, dest);
	else
		codec = choose_codec(c, &m, job->payload_total, codec, dest,
				     left, &pred);
	local_codec = codec;
	local_pred = pred;
	if (remote_faster(c, &m, job, codec_explicit, left, &codec, &pred))
		dest = CKPT_PLAN_REMOTE;
	inflight = settle_inflight(c, &m, dest, left, pred);
	if (dest == CKPT_PLAN_REMOTE && !c->remote_only &&
	    to_remote(c, job) < 0) {
		dest = CKPT_PLAN_LOCAL; /* journaled; the disk it is */
		codec = local_codec;
		pred = local_pred;
	}
	job->codec = codec;

	memset(&o, 0, sizeof(o));
	o.event = event ? event : 1;
	o.reason = job->reason;
	o.codec = codec;
	o.dest = dest;
	o.inflight = inflight;
	o.deadline_ns = deadline;
	o.planned_ns = now;
	o.state_bytes = job->payload_total;
	o.predicted_s = pred;
	o.left_s = deadline ? left : 0;
	o.step = job->step;
	o.status = 1;
	o.deadline_met = -1;
	fill_meas(&o, &m);
	pthread_mutex_lock(&p->mu);
	p->cur = o;
	p->cur_notice_ns = notice ? notice : now;
	pthread_mutex_unlock(&p->mu);
}

void eng_plan_snapshot(struct ckpt *c, ckpt_plan *out)
{
	struct eng_plan *p = c->plan;

	memset(out, 0, sizeof(*out));
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	*out = p->cur;
	if (!out->event) /* else the ones the plan used */
		fill_meas(out, &p->m);
	pthread_mutex_unlock(&p->mu);
}

CKPT_API int ckpt_plan_get(const ckpt *c, ckpt_plan *out)
{
	if (!c || !out)
		return eng_err(NULL, -EINVAL, "ckpt_plan_get: %s is NULL",
			       c ? "out" : "handle");
	eng_plan_snapshot((struct ckpt *)c, out);
	if (!out->event)
		out->deadline_met = -1;
	return 0;
}
