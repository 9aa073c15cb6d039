/*
 * notice.c - what happens around the save a notice asks for: the policy
 * after it (stop or continue) and its record in the event journal.
 *
 * Design note. save.c tells watch.c when a save starts (which notice it
 * answers is remembered in w->cur); the writer tells this file when it is
 * over, twice, before the handle stops being busy: under the handle's
 * mutex (eng_watch_save_done: the outcome, the CONTINUE save scheduled)
 * and after it (eng_watch_save_log: the journal lines, file and network
 * I/O off the lock, then stop_now). So when ckpt_should_stop() says stop
 * the journal has the save, and ckpt_wait() returns after both.
 *
 *   save.c: eng_watch_save_started --> w->cur (which notice, deadline)
 *   writer.c: save over --> eng_watch_save_done --> stop_now | resave_at
 *                       --> eng_watch_save_log  --> events.c
 *   training loop: ckpt_should_stop(), ckpt_should_save() (resave_at)
 *
 * Policies (ckpt_watch_opts.after_save): STOP sets stop_now once the save
 * is durable. CONTINUE asks for one more save of the same notice at
 * deadline - (the save's measured duration * 5/4 + 50 ms), when that is
 * still ahead. A notice's save that failed is asked for again at once
 * while its deadline has not passed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "events.h"
#include "plan.h"
#include "save_internal.h"
#include "watch_internal.h"

CKPT_API int ckpt_should_stop(const ckpt *c)
{
	const struct eng_watch *w = c ? c->watch : NULL;

	return w ? atomic_load_explicit(&w->stop_now, memory_order_acquire) : 0;
}

/* Time the next save of this size needs here: the longer of the one
 * just done and the planner's estimate, with a quarter and 50 ms more. */
static int64_t resave_need_ns(struct ckpt *c, const eng_job *job,
			      const struct eng_notice_save *n)
{
	int64_t dur = n->done_ns - n->start_ns;
	int64_t pred = (int64_t)(eng_plan_estimate(c, job->payload_total,
						   job->codec, c->remote_only) *
				 1e9);

	if (pred > dur)
		dur = pred;
	return dur + dur / 4 + 50000000;
}

void eng_watch_save_done(struct ckpt *c, eng_job *job)
{
	struct eng_watch *w = c->watch;
	struct eng_notice_save *n = w ? &w->cur : NULL;
	int64_t need;

	eng_plan_save_done(c, job);
	if (!n || !n->notice || n->step != job->step)
		return;
	n->done_ns = eng_unix_ns();
	n->status = job->status;
	w->done = *n;
	w->done_pending = 1;
	if (job->status) {
		/* ask again while there is time */
		if (!n->deadline_ns || n->deadline_ns > n->done_ns) {
			atomic_store(&w->resave_reason, n->reason);
			atomic_store(&w->resave_deadline_ns, n->deadline_ns);
			atomic_store(&w->resave_notice_ns, n->notice_ns);
			atomic_store(&w->resave_event, n->event);
			atomic_store_explicit(&w->resave_at_ns, n->done_ns,
					      memory_order_release);
		}
		return;
	}
	if (atomic_load(&w->after_save) == CKPT_AFTER_STOP)
		return; /* stop_now once journaled (eng_watch_save_log) */
	need = resave_need_ns(c, job, n);
	if (!n->resave && n->deadline_ns &&
	    n->deadline_ns - need > n->done_ns) {
		atomic_store(&w->resave_reason, n->reason);
		atomic_store(&w->resave_deadline_ns, n->deadline_ns);
		atomic_store(&w->resave_notice_ns, n->notice_ns);
		atomic_store(&w->resave_event, n->event);
		atomic_store_explicit(&w->resave_at_ns, n->deadline_ns - need,
				      memory_order_release);
	}
}

/* source and key of a notice by the reason of its save */
static void reason_source(int32_t reason, const char **source, const char **key)
{
	*key = NULL;
	switch (reason) {
	case CKPT_REASON_MAINTENANCE:
		*source = "metadata";
		*key = "instance/maintenance-event";
		break;
	case CKPT_REASON_PREEMPTED:
		*source = "metadata";
		*key = "instance/preempted";
		break;
	case CKPT_REASON_UPCOMING:
		*source = "metadata";
		*key = "instance/upcoming-maintenance";
		break;
	case CKPT_REASON_SIGTERM:
		*source = "sigterm";
		break;
	default:
		*source = "request";
		break;
	}
}

static void set_time(json_t *o, const char *name, int64_t ns)
{
	char t[32];

	if (ns && eng_events_time(ns, t) == 0)
		json_object_set_new(o, name, json_string(t));
}

void eng_watch_log_change(struct eng_watch *w, const char *key, const char *old,
			  const char *val, const char *etag, int save,
			  int64_t seen_ns, int64_t deadline_ns)
{
	json_t *o = json_object();

	set_time(o, "time", seen_ns);
	json_object_set_new(o, "source", json_string("metadata"));
	json_object_set_new(o, "key", json_string(key));
	json_object_set_new(o, "old", json_string(old));
	json_object_set_new(o, "new", json_string(val));
	json_object_set_new(o, "etag", json_string(etag));
	json_object_set_new(o, "action", json_string(save ? "save" : "none"));
	if (save)
		set_time(o, "deadline", deadline_ns);
	eng_event_log(w->c, o);
}

/* ---- a notice answered before a restart ------------------------------ */

struct answered {
	uint32_t host;
	const char *key, *etag, *reason;
	int seen, answered;
	int64_t deadline_ns;
	double save_s;
};

static int answered_line(void *arg, uint32_t host, const char *line)
{
	struct answered *a = arg;
	json_t *o;
	const char *act;

	if (host != a->host)
		return 0;
	o = json_loads(line, 0, NULL);
	act = json_string_value(json_object_get(o, "action"));
	if (act && !strcmp(act, "save")) {
		const char *src =
			json_string_value(json_object_get(o, "source"));
		const char *key = json_string_value(json_object_get(o, "key"));
		const char *etag =
			json_string_value(json_object_get(o, "etag"));
		const char *why =
			json_string_value(json_object_get(o, "reason"));

		if (src && key && etag && !strcmp(src, "metadata") &&
		    !strcmp(key, a->key) && !strcmp(etag, a->etag)) {
			/* the notice, seen by an earlier process */
			a->seen = 1;
			a->answered = 0;
			a->deadline_ns = eng_rfc3339_ns(json_string_value(
				json_object_get(o, "deadline")));
		} else if (a->seen && why && !strcmp(why, a->reason) &&
			   json_object_get(o, "step") &&
			   !json_object_get(o, "error")) {
			/* ... and the durable save that answered it */
			a->answered = 1;
			a->save_s =
				json_number_value(json_object_get(o, "save_s"));
		}
	}
	json_decref(o);
	return 0;
}

int eng_watch_answered(struct eng_watch *w, int slot, const char *key,
		       const char *etag, int64_t now_ns)
{
	struct ckpt *c = w->c;
	struct answered a = { 0 };
	int32_t reason = slot == W_MAINT   ? CKPT_REASON_MAINTENANCE :
			 slot == W_PREEMPT ? CKPT_REASON_PREEMPTED :
					     CKPT_REASON_UPCOMING;
	int64_t at;

	a.host = c->s.host_index;
	a.key = key;
	a.etag = etag;
	a.reason = ckpt_reason_name(reason);
	if (ckpt_events_read(c->root, answered_line, &a) < 0 || !a.answered)
		return 0;
	/* one more save just before its deadline, as long as the one that
	 * answered it took, with a quarter and 50 ms more */
	at = a.deadline_ns - (int64_t)(a.save_s * 1.25e9) - 50000000;
	if (a.deadline_ns && at > now_ns) {
		atomic_store(&w->resave_reason, reason);
		atomic_store(&w->resave_deadline_ns, a.deadline_ns);
		atomic_store(&w->resave_notice_ns, now_ns);
		atomic_store(&w->resave_event,
			     atomic_fetch_add(&w->events, 1) + 1);
		atomic_store_explicit(&w->resave_at_ns, at,
				      memory_order_release);
	}
	return 1;
}

void eng_watch_log_sigterm(struct eng_watch *w, int64_t seen_ns,
			   int64_t deadline_ns)
{
	json_t *o = json_object();

	set_time(o, "time", seen_ns);
	json_object_set_new(o, "source", json_string("sigterm"));
	json_object_set_new(o, "action", json_string("save"));
	set_time(o, "deadline", deadline_ns);
	eng_event_log(w->c, o);
}

void eng_watch_save_log(struct ckpt *c)
{
	struct eng_watch *w = c->watch;
	struct eng_notice_save n;
	ckpt_plan plan;
	const char *source, *key;
	json_t *o;
	int policy;

	if (!w)
		return;
	pthread_mutex_lock(&c->mu);
	n = w->done;
	policy = w->done_pending;
	w->done_pending = 0;
	pthread_mutex_unlock(&c->mu);
	if (!policy)
		return;
	reason_source(n.reason, &source, &key);
	o = json_object();
	json_object_set_new(o, "source", json_string(source));
	if (key)
		json_object_set_new(o, "key", json_string(key));
	json_object_set_new(o, "action", json_string("save"));
	json_object_set_new(o, "reason",
			    json_string(ckpt_reason_name(n.reason)));
	json_object_set_new(o, "step", json_integer((json_int_t)n.step));
	json_object_set_new(o, "event", json_integer((json_int_t)n.event));
	if (n.resave)
		json_object_set_new(o, "resave", json_true());
	set_time(o, "deadline", n.deadline_ns);
	eng_plan_snapshot(c, &plan);
	if (plan.event && plan.step == n.step) {
		static const char *const inflight[] = { NULL, "finish",
							"cancel" };
		char name[32];

		eng_plan_name(&plan, name);
		json_object_set_new(o, "plan", json_string(name));
		json_object_set_new(o, "predicted_s",
				    json_real(plan.predicted_s));
		if (plan.inflight > 0 && plan.inflight < 3)
			json_object_set_new(
				o, "inflight",
				json_string(inflight[plan.inflight]));
	}
	json_object_set_new(o, "durable_s",
			    json_real((double)(n.done_ns - n.notice_ns) / 1e9));
	json_object_set_new(o, "save_s",
			    json_real((double)(n.done_ns - n.start_ns) / 1e9));
	if (n.status) {
		json_object_set_new(o, "error",
				    json_string(ckpt_strerror(n.status)));
	} else if (n.deadline_ns) {
		json_object_set_new(o, "deadline_met",
				    json_boolean(n.done_ns <= n.deadline_ns));
		json_object_set_new(
			o, "margin_s",
			json_real((double)(n.deadline_ns - n.done_ns) / 1e9));
	}
	eng_event_log(c, o);
	if (n.status) {
		eng_events_drain(c); /* written before ckpt_wait() returns */
		return;
	}
	policy = atomic_load(&w->after_save);
	o = json_object();
	json_object_set_new(o, "source", json_string(source));
	json_object_set_new(
		o, "action",
		json_string(policy == CKPT_AFTER_STOP ? "stop" : "continue"));
	json_object_set_new(o, "step", json_integer((json_int_t)n.step));
	if (policy == CKPT_AFTER_CONTINUE && atomic_load(&w->resave_at_ns))
		set_time(o, "resave_at", atomic_load(&w->resave_at_ns));
	eng_event_log(c, o);
	eng_events_drain(c); /* the lines are written before "stop" */
	if (policy == CKPT_AFTER_STOP && !eng_pod_hold_stop(w, n.step))
		atomic_store_explicit(&w->stop_now, 1, memory_order_release);
}
