/*
 * events.h - the event journal inside the engine (events.c). Not API.
 *
 * The engine records what the watcher sees and what a notice's save did
 * by building a jansson object and handing it to eng_event_log (watch.c,
 * plan.c); ckpt_event_append is the same path from a JSON string.
 */
#ifndef CKPT_ENGINE_EVENTS_H
#define CKPT_ENGINE_EVENTS_H

#include <jansson.h>
#include <stdint.h>

struct ckpt;

/* RFC 3339 UTC with milliseconds: 2026-12-03T08:00:00.123Z */
int eng_events_time(int64_t unix_ns, char out[32]);
/* The journal line of `in` ("time" and "host" first, added when absent),
 * newline-terminated, malloc'd. */
int eng_events_line(uint32_t host, json_t *in, char **out, size_t *out_len,
		    char *errbuf);
/* Appends obj to LOCATION's journal of `host` (see ckpt_event_append).
 * A directory's upload that the rate limit puts off is waited for with
 * `wait`, else left for eng_events_flush(). */
int eng_events_append_obj(const char *location, uint32_t host, json_t *obj,
			  int wait, char *errbuf);
/* Records that DIR's journal is uploaded to `remote` (DIR/events/remote). */
int eng_events_set_remote(const char *dir, const char *remote, char *errbuf);
/* Uploads every journal whose upload was put off (rate limit). */
int eng_events_flush(void);
/* The handle's journal: appends obj (reference stolen) to c's location as
 * host c->s.host_index; failures go to the handle's message only (an
 * event that cannot be recorded never fails a save). */
void eng_event_log(struct ckpt *c, json_t *obj);

#endif
