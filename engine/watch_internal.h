/*
 * watch_internal.h - state shared by watch.c (policy, ckpt_should_save,
 * SIGTERM, the public watcher API) and watch_md.c (the metadata watcher
 * thread).
 *
 * Design note. Everything ckpt_should_save() reads is an atomic: one
 * notice slot per source (maintenance-event, preempted,
 * upcoming-maintenance, requested) holds a sequence number bumped by the
 * writer after it stored the notice's deadline (release), and the sequence
 * acknowledged by the last save that started with that reason. SIGTERM
 * uses one process-wide sequence written by the signal handler. The
 * human-readable state (values, ETags, errors, counts) lives under `mu`
 * and is only copied out by ckpt_watch_state().
 *
 *   metadata server --HTTP--> watch_md.c thread --atomics--> slot[]
 *   SIGTERM handler --atomics + eventfd write------------------^
 *   training loop: ckpt_should_save() reads slot[], policy clock
 *   save.c: eng_watch_save_started() acknowledges, resets the clock
 */
#ifndef CKPT_WATCH_INTERNAL_H
#define CKPT_WATCH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ckpt.h"
#include "internal.h"

enum { W_MAINT = 0, W_PREEMPT, W_UPCOMING, W_REQUESTED, W_NSLOTS };

struct eng_notice_slot {
	atomic_ullong seq;   /* notices raised */
	atomic_ullong acked; /* seq when a save with this reason started */
	atomic_llong deadline_ns, notice_ns;
	atomic_ullong event; /* handle-wide number of the latest notice */
};

struct eng_watch {
	struct ckpt *c;  /* the handle (its journal) */
	int notify_efd; /* readable on a notice (ckpt_watch_fd) */
	int wake_efd;   /* wakes the watcher thread: stop, SIGTERM */

	/* policy, set by ckpt_watch_start (atomics: read by should_save) */
	atomic_uint every_steps, every_seconds, time_scale;
	atomic_uint sigterm_window_ms;
	atomic_llong last_save_mono; /* CLOCK_MONOTONIC ns */
	atomic_ullong last_save_step;
	atomic_int have_step_base;

	struct eng_notice_slot slot[W_NSLOTS];
	atomic_ullong events;     /* notices raised on this handle */
	atomic_int sigterm_opted; /* ckpt_watch_sigterm() called */
	atomic_ullong sig_acked;  /* process SIGTERM seq acknowledged */
	atomic_ullong sig_seen;   /* ... reported to on_notice */
	atomic_int started;       /* ckpt_watch_start() called */
	atomic_int stop;          /* the thread must return */

	/* after a notice's save (watch.c; policy in ckpt_watch_opts) */
	atomic_int after_save;     /* enum ckpt_after_save */
	atomic_int stop_now;       /* ckpt_should_stop() */
	atomic_llong resave_at_ns; /* CONTINUE: unix ns of the save
	                                just before the deadline, 0 none */
	atomic_llong resave_deadline_ns, resave_notice_ns;
	atomic_int resave_reason;
	atomic_ullong resave_event;
	/* the save in flight, set when it starts (under the handle's mu) */
	struct eng_notice_save {
		int notice; /* it answers a pending notice */
		int32_t reason;
		uint64_t event, step;
		int64_t notice_ns, deadline_ns, start_ns, done_ns;
		int status;
		int resave; /* the CONTINUE save before the deadline */
	} cur, done;        /* done: the last finished, for the journal */
	int done_pending;   /* `done` not yet journaled (under mu) */

	ckpt_watch_opts o; /* written before the thread starts */
	pthread_t thr;
	int thr_started;

	pthread_mutex_t mu; /* guards info */
	ckpt_watch_info info;

	_Atomic(struct eng_pod *) pod; /* pod agreement (watch_pod.c) */
};

/* watch.c */
/* The process-wide SIGTERM sequence and the unix ns of the latest one. */
uint64_t eng_sigterm_seq(void);
int64_t eng_sigterm_ns(void);
/* 0 while slot's notice is not due yet (an upcoming window more than
 * upcoming_lead_s ahead), else 1. */
int eng_watch_slot_due(const struct eng_watch *w, int slot);
/* Raises a notice on slot `slot` (watcher thread or ckpt_request_save):
 * stores the deadline, bumps the sequence, wakes the notify fd. Calls
 * on_notice when `callback` (never from a signal handler). */
void eng_watch_raise(struct eng_watch *w, int slot, int64_t notice_ns,
		     int64_t deadline_ns, int callback);
/* Calls on_notice for a SIGTERM the thread has just seen. */
void eng_watch_sigterm_seen(struct eng_watch *w);

/* notice.c: journals a change of a watched key (the watcher thread):
 * key, old and new value, ETag, and whether a save was asked for. */
void eng_watch_log_change(struct eng_watch *w, const char *key,
			  const char *old, const char *val, const char *etag,
			  int save, int64_t seen_ns, int64_t deadline_ns);
/* ... and a SIGTERM the watcher has seen. */
void eng_watch_log_sigterm(struct eng_watch *w, int64_t seen_ns,
			   int64_t deadline_ns);

/* notice.c: 1 if this host's journal shows the notice (key, ETag)
 * answered by a durable save before a restart; then, if its deadline
 * leaves time, a last save just before it is scheduled (as for
 * CKPT_AFTER_CONTINUE) and no new notice is raised. */
int eng_watch_answered(struct eng_watch *w, int slot, const char *key,
		       const char *etag, int64_t now_ns);

/* watch_md.c: RFC 3339 to unix ns (fractions dropped), 0 if invalid. */
int64_t eng_rfc3339_ns(const char *s);
/* watch_md.c: the thread's body (arg: struct eng_watch *). */
void *eng_watch_md_main(void *arg);

/* watch_pod.c: pod-wide agreement through save-request objects. start:
 * a thread if host_count > 1 and the root or remote is gs:// (else
 * nothing, 0); stop: joins it (ckpt_close). should_save: -1 no pod
 * (notices are local), 0 not now (notices are the pod's), 1 the agreed
 * step (advice filled); atomics only. save_started (under the handle's
 * mu): a save of the target marks it saved and, unless n already answers
 * a local notice, makes n answer the pod's. hold_stop (the STOP policy,
 * the save durable): 1 if the pod sets stop_now itself, once no later
 * request came for 2 intervals + slack. kick wakes the thread. */
struct eng_pod;
struct ckpt;
int eng_pod_start(struct ckpt *c, struct eng_watch *w);
void eng_pod_stop(struct eng_watch *w);
int eng_pod_should_save(struct eng_watch *w, uint64_t step,
			ckpt_save_advice *a);
void eng_pod_save_started(struct eng_watch *w, uint64_t step,
			  struct eng_notice_save *n);
int eng_pod_hold_stop(struct eng_watch *w, uint64_t step);
void eng_pod_kick(struct eng_watch *w);

#endif
