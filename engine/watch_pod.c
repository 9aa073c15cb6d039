/*
 * watch_pod.c - pod-wide agreement on the step to save, through Cloud
 * Storage, with no coordinator (SPEC.md "Pod save requests").
 *
 * Design note. A pod is a handle with host_count > 1 whose location (or
 * settings.remote) is gs://BUCKET/PREFIX; ckpt_watch_start() starts one
 * thread here unless CKPT_WATCH_NO_POD. Save requests are small JSON
 * objects PREFIX/pod/request-NNNNNNNNNN numbered 1, 2, ... and created
 * only if absent (ifGenerationMatch=0), so of two hosts that raise request
 * n at once exactly one wins; the loser reads the winner's and adopts its
 * target. Numbers are dense: a host only creates the number after the
 * last one it has read, so every host reads them all, in order, and the
 * latest live request is the pod's current target.
 *
 *   metadata / SIGTERM / ckpt_request_save --> eng_watch_raise (slot seq)
 *       --> this thread: new local notice? --> target = step + margin
 *       --> create pod/request-n (412: read the winner's) --+
 *   every host, every pod_interval_ms: GET pod/request-next <--+
 *       --> adopt target (seqlock) --> ckpt_should_save(step == target)
 *   training thread: should_save records (step, time) --> step time
 *
 * The training thread only touches atomics here: eng_pod_should_save()
 * records the step and its time (an EWMA of the step time) and answers 1
 * at exactly the target; eng_pod_save_started() marks the target done.
 * While the pod runs, ckpt_should_save() leaves local notices to this
 * thread (they become requests) and keeps the periodic policy.
 *
 * Margin: target = s + 1 + ceil((now - t_s + 2 * interval + slack) / T),
 * with s the last step the loop asked about, t_s when, T the measured
 * step time: every host reads the next request at least once per
 * interval (one more for a read in flight when the request appeared) and
 * slack covers the round trips and jitter. Before two consecutive steps
 * are seen, a notice waits up to 2 intervals for a measurement, then
 * takes T = now - t_s (the step in progress is at least that long).
 *
 * A target this host has passed without saving it (it read the request
 * late, or the loop skipped a step) is never silently replaced by another
 * step: the host raises request n+1 with a new target from its own step
 * ("why": "missed", "supersedes": n), and every host, including those
 * that saved the old target, saves the new one. A request is history (not
 * adopted) when its target is below the first step this process asked
 * about (a restart resumed past it) or once it expired (deadline + 10
 * minutes). Cloud Storage operations: one GET per host per interval (a
 * 404 while nothing is asked), one list at start, one create per request.
 * Depends on: watch.c (struct eng_watch, slots), gcs/ (the client).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "events.h"
#include "gcs.h"
#include "save_internal.h"
#include "watch_internal.h"

#define POD_DIR "pod/"
#define POD_EXPIRE_NS (600LL * 1000000000) /* after the deadline */
#define POD_NODEADLINE_NS (3600LL * 1000000000)
#define POD_MAX_DOC 8192

enum { POD_OFF = 0, POD_STARTING, POD_READY, POD_FAILING };

/* One save request, as stored (SPEC.md "Pod save requests"). */
struct pod_req {
	uint64_t n, target, step, supersedes;
	int32_t reason;
	uint32_t host;
	int64_t notice_ns, deadline_ns, expires_ns, step_ns;
	char key[48], value[256], why[16];
};

struct eng_pod {
	struct ckpt *c;
	struct eng_watch *w;
	struct gcs_client *gc;
	char *bucket, *prefix;
	uint32_t host, hosts;
	int64_t interval_ns, slack_ns;
	int efd; /* wakes the thread: a notice, ckpt_close */
	pthread_t thr;
	atomic_int stop;

	/* the training thread's steps (written by eng_pod_should_save) */
	atomic_int have_step;
	atomic_ullong first_step, last_step;
	atomic_llong last_ns, step_ewma_ns;

	/* the current target, published under a sequence lock */
	atomic_uint gen;
	atomic_ullong target;
	atomic_int reason;
	atomic_llong deadline_ns, notice_ns;
	atomic_ullong event;
	atomic_ullong done; /* target whose save has started */
	/* STOP policy: the target's save is durable; stop_now once no
	 * later request came for 2 intervals + slack (eng_pod_hold_stop) */
	atomic_ullong stop_step;
	atomic_llong stop_ns;

	/* the thread's own */
	int listed;
	uint64_t next;      /* request number to read next */
	struct pod_req cur; /* the latest adopted (cur.n 0: none) */
	uint64_t seen[W_NSLOTS], sig_seen; /* local notices handled */
	int64_t resave_seen;               /* CONTINUE's resave_at_ns handled */
	int64_t hold_since;                /* a notice waits for a step time */
	uint64_t made, lost;
	/* journal lines of this tick, written after its agreement work so
	 * a slow journal (fsync, upload) delays no request */
	json_t *logq[8];
	unsigned nlog;
};

/* ---- the training thread ---------------------------------------- */

int eng_pod_should_save(struct eng_watch *w, uint64_t step, ckpt_save_advice *a)
{
	struct eng_pod *p = atomic_load_explicit(&w->pod, memory_order_acquire);
	uint64_t last, target;
	ckpt_save_advice adv;
	unsigned g;

	if (!p)
		return -1;
	last = atomic_load_explicit(&p->last_step, memory_order_relaxed);
	if (!atomic_load_explicit(&p->have_step, memory_order_relaxed)) {
		atomic_store(&p->first_step, step);
		atomic_store(&p->last_step, step);
		atomic_store(&p->last_ns, eng_mono_ns());
		atomic_store(&p->have_step, 1);
	} else if (step != last) {
		int64_t now = eng_mono_ns(), dt, e;

		dt = now -
		     atomic_load_explicit(&p->last_ns, memory_order_relaxed);
		e = atomic_load_explicit(&p->step_ewma_ns,
					 memory_order_relaxed);
		if (step == last + 1)
			atomic_store_explicit(&p->step_ewma_ns,
					      e ? e + (dt - e) / 4 : dt,
					      memory_order_relaxed);
		atomic_store(&p->last_ns, now);
		atomic_store(&p->last_step, step);
	}
	target = atomic_load_explicit(&p->target, memory_order_acquire);
	if (!target || step != target ||
	    atomic_load_explicit(&p->done, memory_order_relaxed) == target)
		return 0;
	/* due: read the request's fields under the sequence lock */
	do {
		g = atomic_load_explicit(&p->gen, memory_order_acquire);
		target = atomic_load(&p->target);
		memset(&adv, 0, sizeof(adv));
		adv.reason = atomic_load(&p->reason);
		adv.flags = CKPT_ADVICE_POD;
		adv.deadline_ns = atomic_load(&p->deadline_ns);
		adv.notice_ns = atomic_load(&p->notice_ns);
		adv.event = atomic_load(&p->event);
	} while ((g & 1) ||
		 g != atomic_load_explicit(&p->gen, memory_order_acquire));
	if (step != target || atomic_load(&p->done) == target)
		return 0;
	if (a)
		*a = adv;
	return 1;
}

void eng_pod_save_started(struct eng_watch *w, uint64_t step,
			  struct eng_notice_save *n)
{
	struct eng_pod *p = atomic_load(&w->pod);
	unsigned g;

	if (!p || step != atomic_load(&p->target))
		return;
	atomic_store(&p->done, step);
	if (n->notice)
		return; /* it answers this host's own notice */
	do {
		g = atomic_load(&p->gen);
		n->event = atomic_load(&p->event);
		n->notice_ns = atomic_load(&p->notice_ns);
		n->deadline_ns = atomic_load(&p->deadline_ns);
	} while ((g & 1) || g != atomic_load(&p->gen));
	n->notice = 1;
}

int eng_pod_hold_stop(struct eng_watch *w, uint64_t step)
{
	struct eng_pod *p = atomic_load(&w->pod);

	if (!p || step != atomic_load(&p->done))
		return 0;
	atomic_store(&p->stop_ns, eng_mono_ns());
	atomic_store(&p->stop_step, step);
	eng_pod_kick(w);
	return 1;
}

void eng_pod_kick(struct eng_watch *w)
{
	struct eng_pod *p = atomic_load(&w->pod);
	uint64_t one = 1;

	if (p && write(p->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: already readable */
	}
}

/* ---- requests as JSON ------------------------------------------- */

static char *req_encode(const struct pod_req *r)
{
	char notice[32], deadline[32];
	json_t *j;
	char *s;

	eng_events_time(r->notice_ns, notice);
	eng_events_time(r->deadline_ns, deadline);
	j = json_pack("{s:I, s:I, s:s, s:i, s:s, s:s, s:s, s:I, s:s?, s:I,"
		      " s:I, s:i, s:I, s:I, s:I, s:s}",
		      "request", (json_int_t)r->n, "target",
		      (json_int_t)r->target, "reason",
		      ckpt_reason_name(r->reason) ?
			      ckpt_reason_name(r->reason) :
			      "unspecified",
		      "reason_code", (int)r->reason, "key", r->key, "value",
		      r->value, "notice", notice, "notice_ns",
		      (json_int_t)r->notice_ns, "deadline",
		      r->deadline_ns ? deadline : NULL, "deadline_ns",
		      (json_int_t)r->deadline_ns, "expires_ns",
		      (json_int_t)r->expires_ns, "host", (int)r->host, "step",
		      (json_int_t)r->step, "step_ns", (json_int_t)r->step_ns,
		      "supersedes", (json_int_t)r->supersedes, "why", r->why);
	if (!j)
		return NULL;
	s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return s;
}

static int req_decode(const char *doc, size_t len, struct pod_req *r)
{
	json_t *j = json_loadb(doc, len, JSON_REJECT_DUPLICATES, NULL);
	json_int_t n = 0, target = 0, notice = 0, dl = 0, exp = 0, step = 0,
		   sup = 0, sns = 0;
	const char *key = "", *value = "", *why = "";
	int reason = 0, host = 0, bad;

	if (!j)
		return -1;
	bad = json_unpack(j,
			  "{s:I, s:I, s:i, s?s, s?s, s:I, s:I, s:I, s:i, s?I,"
			  " s?I, s?I, s?s}",
			  "request", &n, "target", &target, "reason_code",
			  &reason, "key", &key, "value", &value, "notice_ns",
			  &notice, "deadline_ns", &dl, "expires_ns", &exp,
			  "host", &host, "step", &step, "step_ns", &sns,
			  "supersedes", &sup, "why", &why);
	if (!bad && (n < 1 || target < 1 || reason < 0 ||
		     reason >= CKPT_REASON_COUNT || host < 0))
		bad = 1;
	if (!bad) {
		memset(r, 0, sizeof(*r));
		r->n = (uint64_t)n;
		r->target = (uint64_t)target;
		r->reason = reason;
		r->host = (uint32_t)host;
		r->notice_ns = notice;
		r->deadline_ns = dl;
		r->expires_ns = exp;
		r->step = (uint64_t)step;
		r->step_ns = sns;
		r->supersedes = (uint64_t)sup;
		snprintf(r->key, sizeof(r->key), "%s", key);
		snprintf(r->value, sizeof(r->value), "%s", value);
		snprintf(r->why, sizeof(r->why), "%s", why);
	}
	json_decref(j);
	return bad ? -1 : 0;
}

static char *req_name(const struct eng_pod *p, uint64_t n)
{
	return eng_path("%s" POD_DIR "request-%010" PRIu64, p->prefix, n);
}

/* ---- the pod thread --------------------------------------------- */

static void pod_log_flush(struct eng_pod *p)
{
	unsigned i;

	for (i = 0; i < p->nlog; i++)
		eng_event_log(p->c, p->logq[i]);
	p->nlog = 0;
}

/* One journal line (SPEC.md "Event journal"): source "pod", the action,
 * the request and, for a request this host created, what it carries. */
static void pod_log(struct eng_pod *p, const char *action,
		    const struct pod_req *r, int mine)
{
	json_t *o = json_object();
	char t[32];

	json_object_set_new(o, "source", json_string("pod"));
	json_object_set_new(o, "action", json_string(action));
	json_object_set_new(o, "request", json_integer((json_int_t)r->n));
	json_object_set_new(o, "target", json_integer((json_int_t)r->target));
	json_object_set_new(o, "from_host", json_integer(r->host));
	json_object_set_new(o, "reason",
			    json_string(ckpt_reason_name(r->reason)));
	if (r->deadline_ns) {
		eng_events_time(r->deadline_ns, t);
		json_object_set_new(o, "deadline", json_string(t));
	}
	json_object_set_new(
		o, "step",
		json_integer((json_int_t)atomic_load(&p->last_step)));
	if (mine) {
		json_object_set_new(o, "key", json_string(r->key));
		json_object_set_new(o, "new", json_string(r->value));
		json_object_set_new(o, "why", json_string(r->why));
		json_object_set_new(o, "step_s",
				    json_real((double)r->step_ns / 1e9));
		if (r->supersedes)
			json_object_set_new(
				o, "supersedes",
				json_integer((json_int_t)r->supersedes));
	}
	if (p->nlog == sizeof(p->logq) / sizeof(p->logq[0]))
		pod_log_flush(p);
	p->logq[p->nlog++] = o;
}

static void pod_info(struct eng_pod *p, uint32_t state)
{
	struct eng_watch *w = p->w;

	pthread_mutex_lock(&w->mu);
	w->info.pod_state = state;
	w->info.pod_request = p->cur.n;
	w->info.pod_target = p->cur.target;
	w->info.pod_requests_made = p->made;
	w->info.pod_requests_lost = (uint32_t)p->lost;
	pthread_mutex_unlock(&w->mu);
}

/* The highest request number already in the bucket: reading starts
 * after it (older requests are history, but the last one may still be
 * live: it is read again). */
static int pod_scan_one(void *arg, const struct gcs_object *o, const char *pf)
{
	uint64_t *max = arg;
	const char *s = o ? strrchr(o->name, '/') : NULL;
	unsigned long long n;
	char tail;

	(void)pf;
	if (s && sscanf(s + 1, "request-%llu%c", &n, &tail) == 1 && n > *max)
		*max = n;
	return 0;
}

static int pod_scan(struct eng_pod *p)
{
	char *dir = eng_path("%s" POD_DIR, p->prefix);
	uint64_t max = 0;
	int r;

	if (!dir)
		return -ENOMEM;
	r = gcs_list_each(p->gc, p->bucket, dir, "/", pod_scan_one, &max);
	free(dir);
	if (r < 0)
		return r;
	p->next = max ? max : 1;
	p->listed = 1;
	return 0;
}

/* The loop's step time estimate, 0 if none yet. */
static int64_t pod_step_ns(struct eng_pod *p, int64_t now)
{
	int64_t e = atomic_load(&p->step_ewma_ns);

	if (e > 0)
		return e;
	if (!p->hold_since)
		p->hold_since = now;
	if (now - p->hold_since < 2 * p->interval_ns)
		return 0;
	e = now - atomic_load(&p->last_ns);
	return e > 1000000 ? e : 1000000;
}

/* Publishes r under the sequence lock as the current target. */
static void pod_adopt(struct eng_pod *p, const struct pod_req *r)
{
	struct eng_watch *w = p->w;
	uint64_t ev = atomic_fetch_add(&w->events, 1) + 1;

	atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
	atomic_store(&p->reason, r->reason);
	atomic_store(&p->deadline_ns, r->deadline_ns);
	atomic_store(&p->notice_ns, r->notice_ns);
	atomic_store(&p->event, ev);
	atomic_store_explicit(&p->target, r->target, memory_order_release);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	p->cur = *r;
}

/* A request read (or just created by this host, `mine`): adopt it
 * unless it is history. */
static void pod_take(struct eng_pod *p, const struct pod_req *r, int mine)
{
	if (r->expires_ns && r->expires_ns < eng_unix_ns())
		return;
	if (r->target < atomic_load(&p->first_step))
		return;
	pod_adopt(p, r);
	pod_log(p, mine ? "request" : "adopt", r, mine);
}

/* Request n into *r: 0, -ENOENT if absent, 1 if malformed (skipped:
 * numbers stay dense), or another negative code (message in p->gc). */
static int pod_fetch(struct eng_pod *p, uint64_t n, struct pod_req *r)
{
	char *name = req_name(p, n);
	void *doc = NULL;
	size_t len = 0;
	int rc;

	if (!name)
		return -ENOMEM;
	rc = gcs_get(p->gc, p->bucket, name, POD_MAX_DOC, &doc, &len, NULL);
	free(name);
	if (rc == 0 && (req_decode(doc, len, r) < 0 || r->n != n))
		rc = 1;
	free(doc);
	return rc;
}

/* Reads requests p->next, p->next + 1, ... until one is absent. 0 or a
 * negative code. */
static int pod_read_new(struct eng_pod *p)
{
	for (;;) {
		struct pod_req r;
		int rc = pod_fetch(p, p->next, &r);

		if (rc == -ENOENT)
			return 0;
		if (rc < 0)
			return rc;
		if (rc == 0)
			pod_take(p, &r, 0);
		p->next++;
	}
}

/* Creates request p->next from r. 1 if ours won, 0 if another host's
 * was there first (read and taken), or a negative code. */
static int pod_publish(struct eng_pod *p, struct pod_req *r)
{
	struct pod_req other;
	char *name, *doc;
	int rc;

	r->n = p->next;
	p->hold_since = 0;
	doc = req_encode(r);
	name = req_name(p, r->n);
	rc = doc && name ? gcs_put(p->gc, p->bucket, name, doc, strlen(doc),
				   GCS_CREATE_ONLY, NULL) :
			   -ENOMEM;
	free(name);
	free(doc);
	if (rc == GCS_E_PRECONDITION) {
		/* 412: another host's, or ours from an attempt whose reply
		 * was lost (the client retried) */
		rc = pod_fetch(p, r->n, &other);
		if (rc < 0)
			return rc;
		if (rc == 0 && other.host == r->host &&
		    other.target == r->target &&
		    other.notice_ns == r->notice_ns)
			rc = 0;
		else
			rc = GCS_E_PRECONDITION;
	}
	if (rc == 0) {
		p->made++;
		p->next++;
		pod_take(p, r, 1);
		return 1;
	}
	if (rc != GCS_E_PRECONDITION)
		return rc;
	p->lost++;
	pod_log(p, "lost-race", r, 1);
	rc = pod_read_new(p);
	return rc < 0 ? rc : 0;
}

/* The target for a request raised now, 0 while the step time is not
 * known yet. */
static uint64_t pod_target(struct eng_pod *p, int64_t *step_ns)
{
	int64_t now = eng_mono_ns(), t = pod_step_ns(p, now), ahead;
	uint64_t s = atomic_load(&p->last_step);

	*step_ns = t;
	if (!t)
		return 0;
	ahead = now - atomic_load(&p->last_ns) + 2 * p->interval_ns +
		p->slack_ns;
	return s + 1 + (uint64_t)((ahead + t - 1) / t);
}

/* 1 if the current request will still be saved by this host: live, its
 * target ahead of the loop and not saved yet. */
static int pod_pending(struct eng_pod *p)
{
	uint64_t t = p->cur.target;

	return p->cur.n &&
	       (!p->cur.expires_ns || p->cur.expires_ns >= eng_unix_ns()) &&
	       atomic_load(&p->last_step) < t && atomic_load(&p->done) != t;
}

/* A deadline of 0 (none) sorts last. */
static int64_t dl_key(int64_t deadline)
{
	return deadline ? deadline : INT64_MAX;
}

/* The earliest-deadline local notice not handled yet, into r; 1 if any.
 * seqs receive the slot sequences to mark handled. */
static int pod_local(struct eng_pod *p, struct pod_req *r,
		     uint64_t seqs[W_NSLOTS], uint64_t *sig, int64_t *resave)
{
	static const int reason[W_NSLOTS] = {
		[W_MAINT] = CKPT_REASON_MAINTENANCE,
		[W_PREEMPT] = CKPT_REASON_PREEMPTED,
		[W_UPCOMING] = CKPT_REASON_UPCOMING,
		[W_REQUESTED] = CKPT_REASON_REQUESTED,
	};
	struct eng_watch *w = p->w;
	int i, best = -1;

	memset(r, 0, sizeof(*r));
	for (i = 0; i < W_NSLOTS; i++) {
		int64_t dl = atomic_load(&w->slot[i].deadline_ns);

		seqs[i] = atomic_load(&w->slot[i].seq);
		if (!eng_watch_slot_due(w, i)) { /* a window days ahead */
			seqs[i] = p->seen[i];
			continue;
		}
		if (seqs[i] == p->seen[i] ||
		    seqs[i] == atomic_load(&w->slot[i].acked) ||
		    (best >= 0 && dl_key(dl) >= dl_key(r->deadline_ns)))
			continue;
		best = i;
		r->reason = reason[i];
		r->deadline_ns = dl;
		r->notice_ns = atomic_load(&w->slot[i].notice_ns);
	}
	*sig = eng_sigterm_seq();
	if (atomic_load(&w->sigterm_opted) && *sig != p->sig_seen &&
	    *sig != atomic_load(&w->sig_acked)) {
		int64_t t = eng_sigterm_ns();
		int64_t dl = t + (int64_t)atomic_load(&w->sigterm_window_ms) *
					 1000000;

		if (best < 0 || dl < dl_key(r->deadline_ns)) {
			best = W_NSLOTS;
			r->reason = CKPT_REASON_SIGTERM;
			r->deadline_ns = dl;
			r->notice_ns = t;
			snprintf(r->key, sizeof(r->key), "SIGTERM");
		}
	}
	/* CONTINUE: the save again just before the deadline (plan.c) */
	*resave = atomic_load(&w->resave_at_ns);
	if (*resave && *resave != p->resave_seen && eng_unix_ns() >= *resave &&
	    best < 0) {
		best = W_NSLOTS + 1;
		r->reason = atomic_load(&w->resave_reason);
		r->deadline_ns = atomic_load(&w->resave_deadline_ns);
		r->notice_ns = atomic_load(&w->resave_notice_ns);
		snprintf(r->key, sizeof(r->key), "resave");
	}
	if (best < 0)
		return 0;
	if (best == W_REQUESTED) {
		snprintf(r->key, sizeof(r->key), "ckpt_request_save");
	} else if (best < W_REQUESTED) {
		pthread_mutex_lock(&w->mu);
		snprintf(r->key, sizeof(r->key), "%s", w->info.keys[best].key);
		snprintf(r->value, sizeof(r->value), "%s",
			 w->info.keys[best].value);
		pthread_mutex_unlock(&w->mu);
	}
	return 1;
}

static void pod_fill(struct eng_pod *p, struct pod_req *r, uint64_t target,
		     int64_t step_ns, uint64_t supersedes, const char *why)
{
	r->target = target;
	r->host = p->host;
	r->step = atomic_load(&p->last_step);
	r->step_ns = step_ns;
	r->supersedes = supersedes;
	r->expires_ns = (r->deadline_ns ? r->deadline_ns + POD_EXPIRE_NS :
					  r->notice_ns + POD_NODEADLINE_NS);
	snprintf(r->why, sizeof(r->why), "%s", why);
}

/* The current target was passed without a save: raise a later one. */
static int pod_missed(struct eng_pod *p)
{
	struct pod_req r;
	uint64_t t = p->cur.target, target;
	int64_t sns;

	while (p->cur.n && p->cur.target == t &&
	       atomic_load(&p->last_step) > t && atomic_load(&p->done) != t &&
	       (!p->cur.expires_ns || p->cur.expires_ns >= eng_unix_ns())) {
		int rc;

		target = pod_target(p, &sns);
		if (!target)
			return 0;
		pod_log(p, "missed", &p->cur, 0);
		r = p->cur;
		pod_fill(p, &r, target, sns, p->cur.n, "missed");
		rc = pod_publish(p, &r);
		if (rc < 0)
			return rc;
		t = p->cur.target;
	}
	return 0;
}

/* New local notices: covered by the pending request, or a new one. */
static int pod_notices(struct eng_pod *p)
{
	uint64_t seqs[W_NSLOTS], sig;
	int64_t resave;
	struct pod_req r;
	int64_t sns;
	int rc;

	while (pod_local(p, &r, seqs, &sig, &resave)) {
		if (!pod_pending(p)) {
			uint64_t target = pod_target(p, &sns);

			if (!target)
				return 0; /* wait for a step time */
			pod_fill(p, &r, target, sns, 0, "notice");
			rc = pod_publish(p, &r);
			if (rc < 0)
				return rc;
			if (rc == 0)
				continue; /* lost: does the winner cover it? */
		}
		memcpy(p->seen, seqs, sizeof(p->seen));
		p->sig_seen = sig;
		if (resave && eng_unix_ns() >= resave)
			p->resave_seen = resave;
		p->hold_since = 0;
	}
	return 0;
}

/* STOP policy: the target's save is durable (eng_pod_hold_stop); once
 * no later request came for 2 intervals + slack, the loop may stop. A
 * later request disarms it: its own save arms it again. */
static void pod_stop_check(struct eng_pod *p)
{
	uint64_t s = atomic_load(&p->stop_step);

	if (!s)
		return;
	if (s != p->cur.target) {
		atomic_store(&p->stop_step, 0);
		return;
	}
	if (eng_mono_ns() - atomic_load(&p->stop_ns) <
	    2 * p->interval_ns + p->slack_ns)
		return;
	atomic_store(&p->stop_step, 0);
	pod_log(p, "stop", &p->cur, 0);
	pod_log_flush(p); /* journaled before the loop is told */
	eng_events_drain(p->c);
	atomic_store_explicit(&p->w->stop_now, 1, memory_order_release);
}

static int pod_tick(struct eng_pod *p)
{
	int rc = 0;

	if (!p->listed)
		rc = pod_scan(p);
	/* nothing is judged before the loop's first step: a request whose
	 * target is below it is history (a restart resumed past it) */
	if (rc || !atomic_load(&p->have_step))
		return rc;
	rc = pod_read_new(p);
	if (!rc)
		pod_stop_check(p);
	if (!rc)
		rc = pod_missed(p);
	if (!rc)
		rc = pod_notices(p);
	return rc;
}

static void *pod_main(void *arg)
{
	struct eng_pod *p = arg;
	unsigned fails = 0;
	unsigned seed = (unsigned)eng_mono_ns() ^ p->host;

	while (!atomic_load(&p->stop)) {
		struct pollfd pfd = { .fd = p->efd, .events = POLLIN };
		int64_t wait = p->interval_ns;
		uint64_t junk;
		int rc = pod_tick(p);

		pod_log_flush(p);

		if (rc < 0) {
			/* back off: interval doubling, at most 32 intervals,
			 * drawn in [d/2, d] */
			int64_t d = p->interval_ns << (fails < 5 ? fails : 5);

			fails++;
			wait = d / 2 +
			       (int64_t)(rand_r(&seed) % 1000) * (d / 2000);
		} else {
			fails = 0;
		}
		if (p->hold_since && wait > p->interval_ns / 4)
			wait = p->interval_ns / 4;
		pod_info(p, rc < 0 ? POD_FAILING : POD_READY);
		if (poll(&pfd, 1, (int)(wait / 1000000) + 1) > 0 &&
		    read(p->efd, &junk, sizeof(junk)) < 0) {
			/* EAGAIN: another reader took it */
		}
	}
	return NULL;
}

/* ---- start / stop ----------------------------------------------- */

static void pod_free(struct eng_pod *p)
{
	if (p->gc)
		gcs_client_free(p->gc);
	if (p->efd >= 0)
		close(p->efd);
	free(p->bucket);
	free(p->prefix);
	free(p);
}

int eng_pod_start(struct ckpt *c, struct eng_watch *w)
{
	const char *where = c->remote_only ? c->root : c->remote_url;
	struct gcs_config cfg = { 0 };
	struct eng_pod *p;
	int r;

	if (c->s.host_count < 2 || !where || strncmp(where, "gs://", 5) ||
	    (w->o.flags & CKPT_WATCH_NO_POD))
		return 0;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->c = c;
	p->w = w;
	p->host = c->s.host_index;
	p->hosts = c->s.host_count;
	p->interval_ns =
		(int64_t)(w->o.pod_interval_ms ? w->o.pod_interval_ms : 1000) *
		1000000;
	p->slack_ns = (int64_t)w->o.pod_slack_ms * 1000000;
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r = p->efd < 0 ? -errno : 0;
	if (!r)
		r = eng_loc_parse(where, &p->bucket, &p->prefix, NULL);
	if (r >= 0) {
		/* short per-operation deadline: a hung bucket must not keep
		 * ckpt_close waiting long (the thread retries anyway) */
		cfg.deadline_s = 10;
		cfg.initial_backoff_s = 0.05;
		cfg.max_backoff_s = 1;
		cfg.connect_timeout_s = 5;
		cfg.stall_s = 5;
		cfg.streams = 1;
		r = gcs_client_new(&p->gc, &cfg);
	}
	if (r < 0) {
		pod_free(p);
		return eng_err(NULL, r, "%s: cannot start the pod watcher: %s",
			       where, ckpt_strerror(r));
	}
	pod_info(p, POD_STARTING);
	r = -pthread_create(&p->thr, NULL, pod_main, p);
	if (r < 0) {
		pod_info(p, POD_OFF);
		pod_free(p);
		return eng_err(NULL, r, "cannot start the pod watcher: %s",
			       strerror(-r));
	}
	atomic_store_explicit(&w->pod, p, memory_order_release);
	return 0;
}

void eng_pod_stop(struct eng_watch *w)
{
	struct eng_pod *p = atomic_exchange(&w->pod, NULL);
	uint64_t one = 1;

	if (!p)
		return;
	atomic_store(&p->stop, 1);
	if (write(p->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: already readable */
	}
	/* a request to a hung bucket ends now, not at its deadline */
	gcs_cancel(p->gc);
	pthread_join(p->thr, NULL);
	pod_free(p);
}
