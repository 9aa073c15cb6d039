/*
 * watch.c - when to save: the periodic policy, notices, SIGTERM opt-in,
 * ckpt_should_save() and the watcher's public API.
 *
 * Design note. A handle always has a `struct eng_watch` (watch_internal.h),
 * so ckpt_should_save() works without a watcher (the periodic policy
 * only). ckpt_watch_start() sets the policy and starts the metadata
 * watcher thread (watch_md.c), which raises notices here through
 * eng_watch_raise(). The training loop's question reads atomics and the
 * vDSO clock only. A notice stays pending until a save with its reason
 * starts (save.c calls eng_watch_save_started under the handle's lock),
 * which also restarts the periodic clock and step count.
 *
 * SIGTERM is opt-in (ckpt_watch_sigterm): one process-wide handler bumps
 * an atomic sequence, records the time and writes the eventfds of the
 * handles that opted in (a fixed table of descriptors, so the handler
 * allocates and locks nothing), then chains to the previous handler.
 * ckpt_close() removes its descriptors and waits for a running handler to
 * leave before closing them. Depends on: handle (struct ckpt), watch_md.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "plan.h"
#include "save_internal.h"
#include "watch_internal.h"

/* The flag replaces no field: the settings keep their size. */
_Static_assert(sizeof(ckpt_settings) == 120, "ckpt_settings changed size");
/* after_save took the place of reserved members: the size is ABI. */
_Static_assert(sizeof(ckpt_watch_opts) == 136, "ckpt_watch_opts changed size");

#define SIG_FDS 64 /* descriptors of opted-in handles (2 per handle) */

static atomic_ullong g_sig_seq;
static atomic_llong g_sig_ns;
static atomic_int g_sig_fds[SIG_FDS];
static atomic_int g_in_handler;
static struct sigaction g_prev;
static pthread_mutex_t g_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_installed;

uint64_t eng_sigterm_seq(void)
{
	return atomic_load(&g_sig_seq);
}

int64_t eng_sigterm_ns(void)
{
	return atomic_load(&g_sig_ns);
}

static void efd_kick(int fd)
{
	uint64_t one = 1;

	if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is already nonzero, so readable */
	}
}

static void on_sigterm(int sig, siginfo_t *si, void *uc)
{
	int saved = errno, i;

	atomic_fetch_add(&g_in_handler, 1);
	atomic_store(&g_sig_ns, eng_unix_ns());
	atomic_fetch_add(&g_sig_seq, 1);
	for (i = 0; i < SIG_FDS; i++)
		efd_kick(atomic_load(&g_sig_fds[i]));
	atomic_fetch_sub(&g_in_handler, 1);
	errno = saved;
	if (g_prev.sa_flags & SA_SIGINFO) {
		if (g_prev.sa_sigaction)
			g_prev.sa_sigaction(sig, si, uc);
	} else if (g_prev.sa_handler != SIG_DFL &&
		   g_prev.sa_handler != SIG_IGN) {
		g_prev.sa_handler(sig);
	}
}

static void sig_fds_drop(const struct eng_watch *w)
{
	int i;

	for (i = 0; i < SIG_FDS; i++) {
		int fd = atomic_load(&g_sig_fds[i]);

		if (fd >= 0 && (fd == w->notify_efd || fd == w->wake_efd))
			atomic_store(&g_sig_fds[i], -1);
	}
	/* a handler that loaded one of them may still write it */
	while (atomic_load(&g_in_handler))
		sched_yield();
}

CKPT_API int ckpt_watch_sigterm(ckpt *c)
{
	struct eng_watch *w = c ? c->watch : NULL;
	int i, n = 0, r = 0;

	if (!w)
		return eng_err(NULL, -EINVAL,
			       "ckpt_watch_sigterm: handle "
			       "is NULL");
	pthread_mutex_lock(&g_sig_mu);
	if (atomic_load(&w->sigterm_opted))
		goto out;
	if (!g_installed) {
		struct sigaction sa;

		for (i = 0; i < SIG_FDS; i++)
			atomic_store(&g_sig_fds[i], -1);
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_sigterm;
		sa.sa_flags = SA_SIGINFO | SA_RESTART;
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGTERM, &sa, &g_prev) < 0) {
			r = eng_err(NULL, -errno, "sigaction(SIGTERM): %s",
				    strerror(errno));
			goto out;
		}
		g_installed = 1;
	}
	for (i = 0; i < SIG_FDS && n < 2; i++) {
		int expect = -1;

		if (atomic_compare_exchange_strong(&g_sig_fds[i], &expect,
						   n ? w->wake_efd :
						       w->notify_efd))
			n++;
	}
	if (n < 2) {
		sig_fds_drop(w);
		r = eng_err(NULL, -ENOSPC,
			    "ckpt_watch_sigterm: more than %d "
			    "handles opted in",
			    SIG_FDS / 2);
		goto out;
	}
	/* signals before the opt-in are not this handle's */
	atomic_store(&w->sig_acked, atomic_load(&g_sig_seq));
	atomic_store(&w->sig_seen, atomic_load(&g_sig_seq));
	atomic_store(&w->sigterm_opted, 1);
	pthread_mutex_lock(&w->mu);
	w->info.sigterm = 1;
	pthread_mutex_unlock(&w->mu);
out:
	pthread_mutex_unlock(&g_sig_mu);
	return r;
}

CKPT_API void ckpt_watch_opts_default(ckpt_watch_opts *o)
{
	if (!o)
		return;
	memset(o, 0, sizeof(*o));
	o->every_seconds = 3600;
	o->time_scale = 1;
	o->timeout_sec = 60;
	o->http_slack_ms = 10000;
	o->upcoming_interval_ms = 60000;
	o->absent_recheck_ms = 600000;
	o->backoff_min_ms = 100;
	o->backoff_max_ms = 30000;
	o->maintenance_window_ms = 60000;
	o->preempted_window_ms = 30000;
	o->sigterm_window_ms = 300000;
	o->pod_interval_ms = 1000;
	o->pod_slack_ms = 2000;
	o->upcoming_lead_s = 600;
}

static int check_opts(const ckpt_watch_opts *o)
{
	size_t i;

	for (i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return eng_err(NULL, -EINVAL,
				       "watch opts.reserved[%zu] must be zero",
				       i);
	if (o->after_save != CKPT_AFTER_STOP &&
	    o->after_save != CKPT_AFTER_CONTINUE)
		return eng_err(NULL, -EINVAL,
			       "watch opts.after_save: unknown policy %d",
			       (int)o->after_save);
	if (o->flags &
	    ~(CKPT_WATCH_NO_METADATA | CKPT_WATCH_NO_PROBE | CKPT_WATCH_NO_POD))
		return eng_err(
			NULL, -EINVAL, "watch opts.flags: unknown bits 0x%x",
			o->flags & ~(CKPT_WATCH_NO_METADATA |
				     CKPT_WATCH_NO_PROBE | CKPT_WATCH_NO_POD));
	if (!o->time_scale || !o->timeout_sec || !o->upcoming_interval_ms ||
	    !o->backoff_min_ms || o->backoff_max_ms < o->backoff_min_ms)
		return eng_err(NULL, -EINVAL,
			       "watch opts: time_scale, timeout_sec, "
			       "upcoming_interval_ms and backoff_min_ms must "
			       "be nonzero, backoff_max_ms >= backoff_min_ms");
	if (o->timeout_sec > 3600)
		return eng_err(NULL, -EINVAL,
			       "watch opts.timeout_sec: %u is over an hour",
			       o->timeout_sec);
	return 0;
}

static const char *const md_keys[] = {
	"instance/maintenance-event",
	"instance/preempted",
	"instance/upcoming-maintenance",
};

int eng_watch_open(struct ckpt *c)
{
	struct eng_watch *w = calloc(1, sizeof(*w));
	size_t i;

	if (!w)
		return -ENOMEM;
	w->notify_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	w->wake_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->notify_efd < 0 || w->wake_efd < 0) {
		int r = -errno;

		if (w->notify_efd >= 0)
			close(w->notify_efd);
		free(w);
		return r;
	}
	pthread_mutex_init(&w->mu, NULL);
	w->c = c;
	ckpt_watch_opts_default(&w->o);
	atomic_store(&w->every_seconds, w->o.every_seconds);
	atomic_store(&w->time_scale, 1);
	atomic_store(&w->sigterm_window_ms, w->o.sigterm_window_ms);
	atomic_store(&w->last_save_mono, eng_mono_ns());
	w->info.nkeys = sizeof(md_keys) / sizeof(md_keys[0]);
	w->info.healthy = 1;
	for (i = 0; i < w->info.nkeys; i++)
		snprintf(w->info.keys[i].key, sizeof(w->info.keys[i].key), "%s",
			 md_keys[i]);
	c->watch = w;
	if (c->s.flags & CKPT_F_WATCH)
		return ckpt_watch_start(c, NULL);
	return 0;
}

void eng_watch_close(struct ckpt *c)
{
	struct eng_watch *w = c->watch;

	if (!w)
		return;
	if (atomic_load(&w->sigterm_opted)) {
		pthread_mutex_lock(&g_sig_mu);
		sig_fds_drop(w);
		pthread_mutex_unlock(&g_sig_mu);
	}
	if (w->thr_started) {
		atomic_store(&w->stop, 1);
		efd_kick(w->wake_efd);
		pthread_join(w->thr, NULL);
	}
	eng_pod_stop(w);
	close(w->notify_efd);
	close(w->wake_efd);
	pthread_mutex_destroy(&w->mu);
	free(w);
	c->watch = NULL;
}

CKPT_API int ckpt_watch_start(ckpt *c, const ckpt_watch_opts *o)
{
	struct eng_watch *w = c ? c->watch : NULL;
	int r;

	if (!w)
		return eng_err(NULL, -EINVAL,
			       "ckpt_watch_start: handle is "
			       "NULL");
	if (o) {
		r = check_opts(o);
		if (r < 0)
			return r;
	}
	if (atomic_exchange(&w->started, 1))
		return eng_err(NULL, CKPT_E_BUSY,
			       "ckpt_watch_start: already started");
	if (o)
		w->o = *o;
	atomic_store(&w->every_steps, w->o.every_steps);
	atomic_store(&w->every_seconds, w->o.every_seconds);
	atomic_store(&w->time_scale, w->o.time_scale);
	atomic_store(&w->sigterm_window_ms, w->o.sigterm_window_ms);
	atomic_store(&w->after_save, w->o.after_save);
	atomic_store(&w->last_save_mono, eng_mono_ns());
	if (!(w->o.flags & CKPT_WATCH_NO_PROBE))
		eng_plan_probe(c);
	r = eng_pod_start(c, w);
	if (r < 0) {
		atomic_store(&w->started, 0);
		return r;
	}
	if (w->o.flags & CKPT_WATCH_NO_METADATA)
		return 0;
	pthread_mutex_lock(&w->mu);
	w->info.running = 1;
	pthread_mutex_unlock(&w->mu);
	r = -pthread_create(&w->thr, NULL, eng_watch_md_main, w);
	if (r < 0) {
		pthread_mutex_lock(&w->mu);
		w->info.running = 0;
		pthread_mutex_unlock(&w->mu);
		return eng_err(NULL, r, "cannot start the watcher: %s",
			       strerror(-r));
	}
	w->thr_started = 1;
	return 0;
}

static void fill_advice(ckpt_save_advice *a, int reason, int64_t deadline,
			int64_t notice, uint64_t event)
{
	if (!a)
		return;
	memset(a, 0, sizeof(*a));
	a->reason = reason;
	a->deadline_ns = deadline;
	a->notice_ns = notice;
	a->event = event;
}

void eng_watch_raise(struct eng_watch *w, int slot, int64_t notice_ns,
		     int64_t deadline_ns, int callback)
{
	static const int reasons[W_NSLOTS] = {
		[W_MAINT] = CKPT_REASON_MAINTENANCE,
		[W_PREEMPT] = CKPT_REASON_PREEMPTED,
		[W_UPCOMING] = CKPT_REASON_UPCOMING,
		[W_REQUESTED] = CKPT_REASON_REQUESTED,
	};
	struct eng_notice_slot *s = &w->slot[slot];
	uint64_t ev = atomic_fetch_add(&w->events, 1) + 1;

	atomic_store(&s->deadline_ns, deadline_ns);
	atomic_store(&s->notice_ns, notice_ns);
	atomic_store(&s->event, ev);
	atomic_fetch_add_explicit(&s->seq, 1, memory_order_release);
	efd_kick(w->notify_efd);
	eng_pod_kick(w);
	if (callback && w->o.on_notice) {
		ckpt_save_advice a;

		fill_advice(&a, reasons[slot], deadline_ns, notice_ns, ev);
		w->o.on_notice(w->o.arg, &a);
	}
}

void eng_watch_sigterm_seen(struct eng_watch *w)
{
	uint64_t seq = atomic_load(&g_sig_seq);
	int64_t t;
	ckpt_save_advice a;

	if (!atomic_load(&w->sigterm_opted) ||
	    atomic_exchange(&w->sig_seen, seq) == seq)
		return;
	t = atomic_load(&g_sig_ns);
	fill_advice(&a, CKPT_REASON_SIGTERM,
		    t + (int64_t)atomic_load(&w->sigterm_window_ms) * 1000000,
		    t, seq);
	eng_watch_log_sigterm(w, t, a.deadline_ns); /* queued: cheap */
	if (w->o.on_notice)
		w->o.on_notice(w->o.arg, &a);
}

CKPT_API int ckpt_request_save(ckpt *c, int64_t deadline_ns)
{
	if (!c || !c->watch)
		return -EINVAL;
	eng_watch_raise(c->watch, W_REQUESTED, eng_unix_ns(), deadline_ns, 0);
	return 0;
}

CKPT_API int ckpt_watch_fd(const ckpt *c)
{
	return c && c->watch ? c->watch->notify_efd : -1;
}

/* A deadline of 0 (none) sorts last. */
static int64_t sort_key(int64_t deadline)
{
	return deadline ? deadline : INT64_MAX;
}

/* An upcoming window is due only upcoming_lead_s before it starts; every
 * other notice at once. vDSO clock only (the training loop asks). */
int eng_watch_slot_due(const struct eng_watch *w, int slot)
{
	int64_t dl, lead;

	if (slot != W_UPCOMING || !w->o.upcoming_lead_s)
		return 1;
	dl = atomic_load(&w->slot[slot].deadline_ns);
	lead = (int64_t)w->o.upcoming_lead_s * 1000000000;
	return dl <= 0 || eng_unix_ns() >= dl - lead;
}

CKPT_API int ckpt_should_save(const ckpt *c, uint64_t step,
			      ckpt_save_advice *advice)
{
	static const int reasons[W_NSLOTS] = {
		[W_MAINT] = CKPT_REASON_MAINTENANCE,
		[W_PREEMPT] = CKPT_REASON_PREEMPTED,
		[W_UPCOMING] = CKPT_REASON_UPCOMING,
		[W_REQUESTED] = CKPT_REASON_REQUESTED,
	};
	struct eng_watch *w = c ? c->watch : NULL;
	int best = -1, i, pod;
	int64_t best_dl = 0, best_notice = 0, period;
	uint64_t best_ev = 0, es, base;
	unsigned secs;

	fill_advice(advice, CKPT_REASON_UNSPECIFIED, 0, 0, 0);
	if (!w)
		return 0;
	/* on a pod, notices become save requests (watch_pod.c) */
	pod = eng_pod_should_save(w, step, advice);
	if (pod > 0)
		return 1;
	for (i = 0; pod < 0 && i < W_NSLOTS; i++) {
		struct eng_notice_slot *s = &w->slot[i];
		uint64_t seq =
			atomic_load_explicit(&s->seq, memory_order_acquire);
		int64_t dl;

		if (seq == atomic_load_explicit(&s->acked,
						memory_order_relaxed) ||
		    !eng_watch_slot_due(w, i))
			continue;
		dl = atomic_load(&s->deadline_ns);
		if (best < 0 || sort_key(dl) < sort_key(best_dl)) {
			best = reasons[i];
			best_dl = dl;
			best_notice = atomic_load(&s->notice_ns);
			best_ev = atomic_load(&s->event);
		}
	}
	if (pod < 0 &&
	    atomic_load_explicit(&w->sigterm_opted, memory_order_relaxed)) {
		uint64_t seq = atomic_load(&g_sig_seq);

		if (seq != atomic_load(&w->sig_acked)) {
			int64_t t = atomic_load(&g_sig_ns);
			int64_t dl = t + (int64_t)atomic_load(
						 &w->sigterm_window_ms) *
						 1000000;

			if (best < 0 || dl < sort_key(best_dl)) {
				best = CKPT_REASON_SIGTERM;
				best_dl = dl;
				best_notice = t;
				best_ev = seq;
			}
		}
	}
	if (best < 0 && pod < 0) { /* a pod's resave is a request */
		int64_t at = atomic_load_explicit(&w->resave_at_ns,
						  memory_order_acquire);

		if (at && eng_unix_ns() >= at) {
			best = atomic_load(&w->resave_reason);
			best_dl = atomic_load(&w->resave_deadline_ns);
			best_notice = atomic_load(&w->resave_notice_ns);
			best_ev = atomic_load(&w->resave_event);
		}
	}
	if (best >= 0) {
		fill_advice(advice, best, best_dl, best_notice, best_ev);
		return 1;
	}
	es = atomic_load_explicit(&w->every_steps, memory_order_relaxed);
	if (es) {
		if (!atomic_load(&w->have_step_base)) {
			int zero = 0;

			/* first question: count from the multiple below */
			if (atomic_compare_exchange_strong(&w->have_step_base,
							   &zero, 1))
				atomic_store(&w->last_save_step,
					     step - step % es);
		}
		base = atomic_load(&w->last_save_step);
		if (step >= base + es) {
			fill_advice(advice, CKPT_REASON_PERIODIC, 0, 0, 0);
			return 1;
		}
	}
	secs = atomic_load_explicit(&w->every_seconds, memory_order_relaxed);
	if (secs) {
		period = (int64_t)secs * 1000000000 /
			 atomic_load_explicit(&w->time_scale,
					      memory_order_relaxed);
		if (eng_mono_ns() - atomic_load(&w->last_save_mono) >= period) {
			fill_advice(advice, CKPT_REASON_PERIODIC, 0, 0, 0);
			return 1;
		}
	}
	return 0;
}

/* Which save answers which notice: remembered while it runs (under the
 * handle's mu). The CONTINUE save before the deadline counts as one. */
static void note_start(struct eng_watch *w, uint64_t step, int32_t reason,
		       int slot)
{
	struct eng_notice_save *n = &w->cur;
	int pending = 0;

	memset(n, 0, sizeof(*n));
	n->step = step;
	n->reason = reason;
	n->start_ns = eng_unix_ns();
	if (slot >= 0 && atomic_load(&w->slot[slot].seq) !=
				 atomic_load(&w->slot[slot].acked)) {
		pending = 1;
		n->event = atomic_load(&w->slot[slot].event);
		n->notice_ns = atomic_load(&w->slot[slot].notice_ns);
		n->deadline_ns = atomic_load(&w->slot[slot].deadline_ns);
	} else if (reason == CKPT_REASON_SIGTERM &&
		   atomic_load(&w->sigterm_opted) &&
		   atomic_load(&g_sig_seq) != atomic_load(&w->sig_acked)) {
		pending = 1;
		n->event = atomic_load(&g_sig_seq);
		n->notice_ns = atomic_load(&g_sig_ns);
		n->deadline_ns =
			n->notice_ns +
			(int64_t)atomic_load(&w->sigterm_window_ms) * 1000000;
	} else if (atomic_load(&w->resave_at_ns) &&
		   reason == atomic_load(&w->resave_reason)) {
		pending = 1;
		n->resave = 1;
		n->event = atomic_load(&w->resave_event);
		n->notice_ns = atomic_load(&w->resave_notice_ns);
		n->deadline_ns = atomic_load(&w->resave_deadline_ns);
		atomic_store(&w->resave_at_ns, 0);
	}
	n->notice = pending;
}

void eng_watch_save_started(struct ckpt *c, uint64_t step, int32_t reason)
{
	struct eng_watch *w = c->watch;
	int slot = -1;

	if (!w)
		return;
	atomic_store(&w->last_save_mono, eng_mono_ns());
	atomic_store(&w->last_save_step, step);
	atomic_store(&w->have_step_base, 1);
	switch (reason) {
	case CKPT_REASON_MAINTENANCE:
		slot = W_MAINT;
		break;
	case CKPT_REASON_PREEMPTED:
		slot = W_PREEMPT;
		break;
	case CKPT_REASON_UPCOMING:
		slot = W_UPCOMING;
		break;
	case CKPT_REASON_REQUESTED:
		slot = W_REQUESTED;
		break;
	case CKPT_REASON_SIGTERM:
		break;
	}
	note_start(w, step, reason, slot);
	eng_pod_save_started(w, step, &w->cur);
	if (c->job)
		eng_plan_save_started(c, c->job);
	if (reason == CKPT_REASON_SIGTERM)
		atomic_store(&w->sig_acked, atomic_load(&g_sig_seq));
	if (slot >= 0)
		atomic_store(&w->slot[slot].acked,
			     atomic_load(&w->slot[slot].seq));
}

int eng_watch_is_notice(int32_t reason)
{
	return reason == CKPT_REASON_MAINTENANCE ||
	       reason == CKPT_REASON_PREEMPTED ||
	       reason == CKPT_REASON_SIGTERM ||
	       reason == CKPT_REASON_REQUESTED ||
	       reason == CKPT_REASON_UPCOMING;
}

void eng_watch_notice_of(struct ckpt *c, int32_t reason, int64_t *deadline,
			 int64_t *notice_ns, uint64_t *event)
{
	struct eng_watch *w = c->watch;
	int slot = reason == CKPT_REASON_MAINTENANCE ? W_MAINT :
		   reason == CKPT_REASON_PREEMPTED   ? W_PREEMPT :
		   reason == CKPT_REASON_UPCOMING    ? W_UPCOMING :
		   reason == CKPT_REASON_REQUESTED   ? W_REQUESTED :
						       -1;
	int64_t dl = 0;

	*notice_ns = 0;
	*event = 0;
	if (!w)
		return;
	if (slot >= 0 && atomic_load(&w->slot[slot].seq) !=
				 atomic_load(&w->slot[slot].acked)) {
		dl = atomic_load(&w->slot[slot].deadline_ns);
		*notice_ns = atomic_load(&w->slot[slot].notice_ns);
		*event = atomic_load(&w->slot[slot].event);
	} else if (reason == CKPT_REASON_SIGTERM &&
		   atomic_load(&w->sigterm_opted) &&
		   atomic_load(&g_sig_seq) != atomic_load(&w->sig_acked)) {
		*notice_ns = atomic_load(&g_sig_ns);
		*event = atomic_load(&g_sig_seq);
		dl = *notice_ns +
		     (int64_t)atomic_load(&w->sigterm_window_ms) * 1000000;
	} else if (atomic_load(&w->resave_at_ns) &&
		   reason == atomic_load(&w->resave_reason)) {
		dl = atomic_load(&w->resave_deadline_ns);
		*notice_ns = atomic_load(&w->resave_notice_ns);
		*event = atomic_load(&w->resave_event);
	}
	if (!*deadline)
		*deadline = dl;
}

CKPT_API int ckpt_watch_state(const ckpt *c, ckpt_watch_info *out)
{
	struct eng_watch *w = c ? c->watch : NULL;

	if (!w || !out)
		return eng_err(NULL, -EINVAL, "ckpt_watch_state: %s is NULL",
			       w ? "out" : "handle");
	pthread_mutex_lock(&w->mu);
	*out = w->info;
	pthread_mutex_unlock(&w->mu);
	out->notices = atomic_load(&w->events);
	return 0;
}
