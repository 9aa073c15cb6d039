/*
 * events.c - the event journal: one JSON-lines file per host beside the
 * checkpoints (SPEC.md, "Event journal"), and its copy on the remote.
 *
 * Design note. A line is one JSON object, "time" and "host" first. For a
 * directory the line is appended to DIR/events/hHHHHH.jsonl with one
 * write(2) on an O_APPEND descriptor (so lines of several processes never
 * interleave) and fsynced; a line without its newline is a torn append and
 * readers skip it. If the directory has a remote, its URL is kept in
 * DIR/events/remote (written by a handle opened with settings.remote), so
 * every writer of the journal, the engine as well as `ckptctl run`, uploads
 * the whole file to REMOTE/events/hHHHHH.jsonl with the backend's replace.
 * Uploads are limited to one per file per second and process: a line
 * appended sooner marks the file dirty and the next append after the
 * second, or eng_events_flush() (ckpt_close), uploads it. For gs:// alone
 * the line goes through the backend's append: the object is read and
 * written back under the generation read, so the training process and
 * `ckptctl run` on one host never drop each other's lines.
 *
 *   watch.c / plan.c --eng_event_log(c, obj)--+
 *   ckpt_event_append(loc, host, json) -------+--> line --> DIR file
 *                                                   \--> remote (replace)
 *   ckpt_events_read(loc) --backend list/get--> lines per host
 *
 * Depends on: backend (locations), io (open/fsync through the I/O table).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "events.h"
#include "save_internal.h"

#define EV_LINE_MAX 65536
#define EV_FILE_MAX (256u << 20) /* a journal read whole */
#define EV_UPLOAD_GAP_NS 1000000000LL

int eng_events_time(int64_t unix_ns, char out[32])
{
	time_t s = (time_t)(unix_ns / 1000000000);
	struct tm tm;

	if (!gmtime_r(&s, &tm))
		return -EINVAL;
	/* the ranges tell the compiler the text fits */
	snprintf(out, 32, "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ",
		 (unsigned)(tm.tm_year + 1900) % 10000,
		 (unsigned)(tm.tm_mon + 1) % 100, (unsigned)tm.tm_mday % 100,
		 (unsigned)tm.tm_hour % 100, (unsigned)tm.tm_min % 100,
		 (unsigned)tm.tm_sec % 100,
		 (unsigned)(unix_ns / 1000000 % 1000));
	return 0;
}

int eng_events_line(uint32_t host, json_t *in, char **out, size_t *out_len,
		    char *errbuf)
{
	json_t *o = json_object(), *v;
	const char *k;
	char t[32], *s = NULL;
	size_t n;
	int r = -ENOMEM;

	*out = NULL;
	if (!o)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	v = json_object_get(in, "time");
	if (v)
		json_object_set(o, "time", v);
	else if (eng_events_time(eng_unix_ns(), t) == 0)
		json_object_set_new(o, "time", json_string(t));
	v = json_object_get(in, "host");
	if (v)
		json_object_set(o, "host", v);
	else
		json_object_set_new(o, "host", json_integer(host));
	json_object_foreach (in, k, v)
		if (strcmp(k, "time") && strcmp(k, "host") &&
		    json_object_set(o, k, v) < 0)
			goto out;
	s = json_dumps(o, JSON_COMPACT);
	if (!s)
		goto out;
	n = strlen(s);
	if (n + 1 > EV_LINE_MAX) {
		r = eng_err(errbuf, -EINVAL,
			    "event journal: a line of %zu bytes is over "
			    "the %d-byte limit",
			    n + 1, EV_LINE_MAX);
		goto out;
	}
	*out = realloc(s, n + 2);
	if (!*out)
		goto out;
	s = NULL;
	(*out)[n] = '\n';
	(*out)[n + 1] = 0;
	*out_len = n + 1;
	r = 0;
out:
	if (r == -ENOMEM)
		eng_err(errbuf, r, "out of memory");
	free(s);
	json_decref(o);
	return r;
}

static void file_name(uint32_t host, char out[32])
{
	snprintf(out, 32, "h%05u.jsonl", host);
}

/* ---- uploads of a directory's journal --------------------------------- */

struct up_ent {
	char *path;   /* DIR/events/hHHHHH.jsonl */
	char *remote; /* gs://... of the directory */
	char key[48]; /* events/hHHHHH.jsonl */
	int64_t last_ns;
	int dirty;
	struct up_ent *next;
};

static pthread_mutex_t g_up_mu = PTHREAD_MUTEX_INITIALIZER;
static struct up_ent *g_up;

static int upload_file(const char *path, const char *remote, const char *key,
		       char *errbuf)
{
	eng_loc *l = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	int r = eng_read_file(path, EV_FILE_MAX, &buf, &len, errbuf);

	if (r == 0)
		r = eng_loc_open(remote, &l, errbuf);
	if (r == 0)
		r = l->be->replace(l, key, buf, len, errbuf);
	eng_loc_close(l);
	free(buf);
	return r;
}

/* The remote a directory's journal goes to (malloc'd), or NULL. */
static char *dir_remote(const char *dir)
{
	char *p = eng_path("%s/events/remote", dir), *s;
	uint8_t *buf = NULL;
	size_t len = 0;

	if (!p || eng_read_file(p, 4096, &buf, &len, NULL) < 0) {
		free(p);
		return NULL;
	}
	free(p);
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		len--;
	s = len && !memcmp(buf, "gs://", 5) ? strndup((char *)buf, len) : NULL;
	free(buf);
	return s;
}

/* Uploads now if the last upload of this file is a second old; else
 * leaves it dirty for later (a handle: flushed at close), or with `wait`
 * (ckpt_event_append, which has no later) sleeps out the second first.
 * Under g_up_mu: one upload at a time. */
static int upload_soon(const char *path, const char *remote, uint32_t host,
		       int wait, char *errbuf)
{
	struct up_ent *e;
	int64_t t = eng_unix_ns();
	int r = 0;

	pthread_mutex_lock(&g_up_mu);
	for (e = g_up; e; e = e->next)
		if (!strcmp(e->path, path) && !strcmp(e->remote, remote))
			break;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (e) {
			e->path = strdup(path);
			e->remote = strdup(remote);
		}
		if (!e || !e->path || !e->remote) {
			if (e) {
				free(e->path);
				free(e->remote);
			}
			free(e);
			pthread_mutex_unlock(&g_up_mu);
			return eng_err(errbuf, -ENOMEM, "out of memory");
		}
		snprintf(e->key, sizeof(e->key), "events/h%05u.jsonl", host);
		e->last_ns = t - EV_UPLOAD_GAP_NS;
		e->next = g_up;
		g_up = e;
	}
	e->dirty = 1;
	if (wait && t - e->last_ns < EV_UPLOAD_GAP_NS) {
		int64_t d = EV_UPLOAD_GAP_NS - (t - e->last_ns);
		struct timespec ts = { d / 1000000000, d % 1000000000 };

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		t = eng_unix_ns();
	}
	if (t - e->last_ns >= EV_UPLOAD_GAP_NS) {
		r = upload_file(e->path, e->remote, e->key, errbuf);
		e->last_ns = eng_unix_ns();
		e->dirty = r < 0;
	}
	pthread_mutex_unlock(&g_up_mu);
	return r;
}

int eng_events_flush(void)
{
	struct up_ent *e;
	int r = 0;

	pthread_mutex_lock(&g_up_mu);
	for (e = g_up; e; e = e->next) {
		int x;

		if (!e->dirty)
			continue;
		x = upload_file(e->path, e->remote, e->key, NULL);
		e->last_ns = eng_unix_ns();
		e->dirty = x < 0;
		if (x < 0 && r == 0)
			r = x;
	}
	pthread_mutex_unlock(&g_up_mu);
	return r;
}

int eng_events_set_remote(const char *dir, const char *remote, char *errbuf)
{
	char *p = eng_path("%s/events", dir), *cur;
	int r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	cur = dir_remote(dir);
	if (cur && !strcmp(cur, remote)) {
		free(cur);
		free(p);
		return 0;
	}
	free(cur);
	r = eng_mkdir(p, 0755);
	if (r < 0)
		eng_err(errbuf, r, "%s: mkdir: %s", p, ckpt_strerror(r));
	else
		r = eng_write_file_atomic(p, "remote", remote, strlen(remote),
					  errbuf);
	free(p);
	return r;
}

/* ---- appending -------------------------------------------------------- */

static int append_dir(const char *dir, uint32_t host, const char *line,
		      size_t len, int wait, char *errbuf)
{
	char name[32], *edir = eng_path("%s/events", dir), *path = NULL;
	char *remote = NULL;
	int fd = -1, created = 0, r;
	ssize_t w;

	file_name(host, name);
	if (!edir)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	path = eng_path("%s/%s", edir, name);
	if (!path) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	fd = eng_open(path, O_WRONLY | O_APPEND | O_CLOEXEC, 0);
	if (fd == -ENOENT) {
		r = eng_mkdir(dir, 0755);
		if (r == 0)
			r = eng_mkdir(edir, 0755);
		if (r < 0) {
			eng_err(errbuf, r, "%s: mkdir: %s", edir,
				ckpt_strerror(r));
			goto out;
		}
		fd = eng_open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
			      0644);
		created = 1;
	}
	if (fd < 0) {
		r = eng_err(errbuf, fd, "%s: open: %s", path,
			    ckpt_strerror(fd));
		goto out;
	}
	/* one write(2): appends of other processes never split a line */
	do
		w = write(fd, line, len);
	while (w < 0 && errno == EINTR);
	if (w != (ssize_t)len) {
		r = w < 0 ? -errno : -EIO;
		eng_err(errbuf, r, "%s: append of %zu bytes: %s", path, len,
			w < 0 ? strerror(errno) : "short write");
		goto out;
	}
	r = eng_fsync(fd);
	if (r == 0 && created)
		r = eng_fsync_dir(edir);
	if (r < 0) {
		eng_err(errbuf, r, "%s: fsync: %s", path, ckpt_strerror(r));
		goto out;
	}
	remote = dir_remote(dir);
	if (remote)
		r = upload_soon(path, remote, host, wait, errbuf);
out:
	if (fd >= 0)
		eng_close(fd);
	free(remote);
	free(path);
	free(edir);
	return r;
}

static int append_obj(const char *where, uint32_t host, const char *line,
		      size_t len, char *errbuf)
{
	char key[48];
	eng_loc *l = NULL;
	int r = eng_loc_open(where, &l, errbuf);

	snprintf(key, sizeof(key), "events/h%05u.jsonl", host);
	if (r == 0)
		r = l->be->append ?
			    l->be->append(l, key, line, len, EV_FILE_MAX,
					  errbuf) :
			    eng_err(errbuf, -ENOTSUP, "%s: no append", where);
	eng_loc_close(l);
	return r;
}

int eng_events_append_obj(const char *location, uint32_t host, json_t *obj,
			  int wait, char *errbuf)
{
	char *bucket = NULL, *prefix = NULL, *line = NULL;
	size_t len = 0;
	int kind = eng_loc_parse(location, &bucket, &prefix, errbuf), r;

	free(bucket);
	free(prefix);
	if (kind < 0)
		return kind;
	r = eng_events_line(host, obj, &line, &len, errbuf);
	if (r < 0)
		return r;
	r = kind == ENG_LOC_GCS ?
		    append_obj(location, host, line, len, errbuf) :
		    append_dir(location, host, line, len, wait, errbuf);
	free(line);
	return r;
}

CKPT_API int ckpt_event_append(const char *location, uint32_t host,
			       const char *json)
{
	json_error_t jerr;
	json_t *o;
	int r;

	if (!location || !json)
		return eng_err(NULL, -EINVAL, "ckpt_event_append: %s is NULL",
			       location ? "json" : "location");
	if (strchr(json, '\n') || strlen(json) >= EV_LINE_MAX)
		return eng_err(NULL, -EINVAL,
			       "ckpt_event_append: the event must be one "
			       "line of at most %d bytes",
			       EV_LINE_MAX - 1);
	o = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!o || !json_is_object(o)) {
		json_decref(o);
		return eng_err(NULL, -EINVAL,
			       "ckpt_event_append: not a JSON object%s%s",
			       o ? "" : ": ", o ? "" : jerr.text);
	}
	r = eng_events_append_obj(location, host, o, 1, NULL);
	json_decref(o);
	return r;
}

/* ---- reading ---------------------------------------------------------- */

struct ev_file {
	uint32_t host;
	char name[32];
};

struct ev_list {
	struct ev_file *v;
	size_t n, cap;
	int oom;
};

/* hDIGITS.jsonl: the host number, or -1 */
static long host_of(const char *name)
{
	const char *p = name + 1;
	char *end;
	unsigned long h;

	if (name[0] != 'h' || *p < '0' || *p > '9')
		return -1;
	h = strtoul(p, &end, 10);
	if (strcmp(end, ".jsonl") || h > UINT32_MAX)
		return -1;
	return (long)h;
}

static int collect(void *arg, const eng_list_ent *e)
{
	struct ev_list *L = arg;
	long h = e->is_prefix ? -1 : host_of(e->name);

	if (h < 0 || strlen(e->name) >= sizeof(L->v[0].name))
		return 0;
	if (L->n == L->cap) {
		size_t cap = L->cap ? L->cap * 2 : 8;
		struct ev_file *v = realloc(L->v, cap * sizeof(*v));

		if (!v) {
			L->oom = 1;
			return 1;
		}
		L->v = v;
		L->cap = cap;
	}
	L->v[L->n].host = (uint32_t)h;
	snprintf(L->v[L->n].name, sizeof(L->v[0].name), "%s", e->name);
	L->n++;
	return 0;
}

static int by_host(const void *a, const void *b)
{
	const struct ev_file *x = a, *y = b;

	return x->host < y->host ? -1 : x->host > y->host;
}

/* Calls fn for each whole line of buf (modified in place). */
static int each_line(uint8_t *buf, size_t len, uint32_t host, ckpt_event_fn fn,
		     void *arg)
{
	size_t i = 0;

	while (i < len) {
		uint8_t *nl = memchr(buf + i, '\n', len - i);
		int r;

		if (!nl)
			break; /* torn last line */
		*nl = 0;
		if (nl > buf + i) {
			r = fn(arg, host, (const char *)buf + i);
			if (r)
				return r;
		}
		i = (size_t)(nl - buf) + 1;
	}
	return 0;
}

CKPT_API int ckpt_events_read(const char *location, ckpt_event_fn fn, void *arg)
{
	struct ev_list L = { 0 };
	char err[ENG_ERRMSG_MAX], key[64];
	eng_loc *l = NULL;
	size_t i;
	int r;

	if (!location || !fn)
		return eng_err(NULL, -EINVAL, "ckpt_events_read: %s is NULL",
			       location ? "fn" : "location");
	err[0] = 0;
	r = eng_loc_open(location, &l, err);
	if (r < 0)
		return eng_err(NULL, r, "%s", err);
	r = l->be->list(l, "events/", 0, collect, &L, err);
	if (r == CKPT_E_NOTFOUND || r == -ENOENT)
		r = 0;
	if (L.oom)
		r = eng_err(err, -ENOMEM, "out of memory");
	if (r == 0 && L.n) /* qsort's base must not be NULL, even empty */
		qsort(L.v, L.n, sizeof(*L.v), by_host);
	for (i = 0; r == 0 && i < L.n; i++) {
		uint8_t *buf = NULL;
		size_t n = 0;

		snprintf(key, sizeof(key), "events/%s", L.v[i].name);
		r = l->be->get(l, key, EV_FILE_MAX, &buf, &n, err);
		if (r == -ENOENT) { /* removed meanwhile */
			r = 0;
			continue;
		}
		if (r == 0)
			r = each_line(buf, n, L.v[i].host, fn, arg);
		free(buf);
	}
	free(L.v);
	eng_loc_close(l);
	if (r < 0 && err[0])
		eng_err(NULL, r, "%s", err);
	return r;
}

/* ---- the handle's journal --------------------------------------------- */

/*
 * A handle's lines are written by one journal thread, in the order they
 * were logged: the watcher thread must not wait for an fsync (the disk is
 * busiest exactly when a notice's save runs), and one queue keeps the
 * notice's line ahead of its save's. eng_events_drain() waits until the
 * queue is written (the writer, before ckpt_should_stop says stop).
 */
struct jq_item {
	json_t *obj;
	struct jq_item *next;
};

struct eng_jq {
	pthread_mutex_t mu;
	pthread_cond_t cv, drained;
	struct jq_item *head, *tail;
	int busy; /* the thread is writing one */
	int stop;
	pthread_t thr;
};

static void log_now(struct ckpt *c, json_t *obj);

static void *jq_main(void *arg)
{
	struct ckpt *c = arg;
	struct eng_jq *q = c->jq;

	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct jq_item *it;

		while (!q->head && !q->stop)
			pthread_cond_wait(&q->cv, &q->mu);
		it = q->head;
		if (!it)
			break;
		q->head = it->next;
		if (!q->head)
			q->tail = NULL;
		q->busy = 1;
		pthread_mutex_unlock(&q->mu);
		log_now(c, it->obj);
		free(it);
		pthread_mutex_lock(&q->mu);
		q->busy = 0;
		if (!q->head)
			pthread_cond_broadcast(&q->drained);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int eng_events_open(struct ckpt *c)
{
	struct eng_jq *q = calloc(1, sizeof(*q));
	int r;

	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	pthread_cond_init(&q->drained, NULL);
	c->jq = q;
	r = -pthread_create(&q->thr, NULL, jq_main, c);
	if (r < 0) {
		c->jq = NULL;
		pthread_cond_destroy(&q->drained);
		pthread_cond_destroy(&q->cv);
		pthread_mutex_destroy(&q->mu);
		free(q);
	}
	return r;
}

void eng_events_close(struct ckpt *c)
{
	struct eng_jq *q = c->jq;

	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	q->stop = 1; /* what is queued is still written */
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	pthread_join(q->thr, NULL);
	c->jq = NULL;
	pthread_cond_destroy(&q->drained);
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

void eng_events_drain(struct ckpt *c)
{
	struct eng_jq *q = c->jq;

	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	while (q->head || q->busy)
		pthread_cond_wait(&q->drained, &q->mu);
	pthread_mutex_unlock(&q->mu);
}

void eng_event_log(struct ckpt *c, json_t *obj)
{
	struct eng_jq *q = c->jq;
	struct jq_item *it;
	char t[32];

	if (!obj)
		return;
	/* the time it happened, not the time it is written */
	if (!json_object_get(obj, "time") && eng_events_time(eng_unix_ns(), t) == 0)
		json_object_set_new(obj, "time", json_string(t));
	it = q ? malloc(sizeof(*it)) : NULL;
	if (!it) {
		log_now(c, obj);
		return;
	}
	it->obj = obj;
	it->next = NULL;
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

static void log_now(struct ckpt *c, json_t *obj)
{
	char err[ENG_ERRMSG_MAX];
	int r = 0;

	err[0] = 0;
	if (c->remote_url && !c->remote_only &&
	    !atomic_exchange(&c->remote_noted, 1))
		r = eng_events_set_remote(c->root, c->remote_url, err);
	if (r == 0)
		r = eng_events_append_obj(c->root, c->s.host_index, obj, 0,
					  err);
	json_decref(obj);
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		eng_err(c->errmsg, r, "event journal: %s", err);
		pthread_mutex_unlock(&c->mu);
	}
}
