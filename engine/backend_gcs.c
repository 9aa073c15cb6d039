/*
 * backend_gcs.c - the Cloud Storage backend: a root at gs://BUCKET/PREFIX
 * served through the gcs/ client (JSON API over libcurl).
 *
 * Design note. A key maps to the object PREFIX + key; the layout is the
 * on-disk one (step-N/hH-fF.shard, step-N/hH.index, step-N/COMMIT, latest),
 * so a location has few, large objects. Each eng_loc owns one client (the
 * client is single-threaded; locations are opened per operation, and the
 * reader opens its own for ranged reads). Durability is per call: a
 * create/replace/delete is done when the server answered.
 *
 *   commit.c / root.c / gc.c / reader --eng_backend--> gb_* (this file)
 *        --> gcs_list_each / gcs_get / gcs_read / gcs_put / gcs_delete
 *        --> curl multi --> JSON API (or STORAGE_EMULATOR_HOST)
 *
 * Mapping: list = objects.list with delimiter '/' (paged inside the
 * client, one callback per entry); create = multipart upload with
 * ifGenerationMatch=0, whose 412 is CKPT_E_EXISTS (exactly one of two
 * committers wins); replace = stat, then a put under the generation seen
 * (retried when another writer moved it meanwhile), which is atomic;
 * get = one download checked against x-goog-hash (a wrong crc32c is
 * CKPT_E_CORRUPT and nothing is returned); 404 = -ENOENT. Every other
 * failure carries the client's message (object, HTTP status, server
 * message), never a token. No lock: `latest` is guarded by its generation.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcs.h"
#include "internal.h"

#define GB_REPLACE_TRIES 8
#define GB_APPEND_TRIES 32

static struct gcs_client *gb_client(eng_loc *l)
{
	return (struct gcs_client *)l->priv;
}

/* Parallel transfers of one client: CKPT_GCS_STREAMS, default 8. The
 * deadline of one operation, retries included: CKPT_GCS_DEADLINE seconds
 * (default: the client's). */
unsigned eng_gcs_streams(void)
{
	const char *e = getenv("CKPT_GCS_STREAMS");
	long v = e ? strtol(e, NULL, 10) : 0;

	return v > 0 && v <= 256 ? (unsigned)v : 8;
}

int eng_gcs_client_new(struct gcs_client **out, const char *where, char *errbuf)
{
	struct gcs_config cfg = { 0 };
	const char *dl = getenv("CKPT_GCS_DEADLINE");
	int r;

	cfg.streams = eng_gcs_streams();
	/* per operation, retries included (0: the client's 600 s) */
	cfg.deadline_s = dl ? strtod(dl, NULL) : 0;
	r = gcs_client_new(out, &cfg);
	if (r < 0)
		return eng_err(errbuf, r == -ENOMEM ? r : -EIO,
			       "%s: cannot set up the Cloud Storage client: %s",
			       where, ckpt_strerror(r));
	return 0;
}

/* A gcs/ code as an engine code: 404 stays -ENOENT, a checksum mismatch
 * is corruption, a failed precondition an existing object; library codes
 * outside the errno range become -EIO (the message says which). */
int eng_gcs_code(int r)
{
	switch (r) {
	case GCS_E_PRECONDITION:
		return CKPT_E_EXISTS;
	case GCS_E_CHECKSUM:
		return CKPT_E_CORRUPT;
	case GCS_E_PROTOCOL:
	case GCS_E_HTTP:
	case GCS_E_TRANSPORT:
	case GCS_E_SESSION:
		return -EIO;
	default:
		return r;
	}
}

static int gb_fail(eng_loc *l, char *errbuf, int r, const char *what,
		   const char *key)
{
	const char *m = gcs_errmsg(gb_client(l));

	r = eng_gcs_code(r);
	return eng_err(errbuf, r, "gs://%s/%s%s: %s: %s", l->bucket, l->prefix,
		       key, what, m && *m ? m : ckpt_strerror(r));
}

static char *gb_name(eng_loc *l, const char *key)
{
	return eng_path("%s%s", l->prefix, key);
}

/* "" or a key ending in '/' */
static char *gb_dir(eng_loc *l, const char *prefix)
{
	size_t n = strlen(prefix);

	if (n == 0 || prefix[n - 1] == '/')
		return eng_path("%s%s", l->prefix, prefix);
	return eng_path("%s%s/", l->prefix, prefix);
}

struct gb_list {
	size_t skip;
	eng_list_fn fn;
	void *arg;
	size_t seen;
	int stopped;
};

static int gb_list_one(void *arg, const struct gcs_object *o, const char *p)
{
	struct gb_list *w = arg;
	const char *full = o ? o->name : p;
	eng_list_ent e = { 0 };
	char name[512];
	size_t n;

	if (!full || strlen(full) <= w->skip)
		return 0; /* the prefix itself ("dir/" placeholder) */
	n = strlen(full) - w->skip;
	if (p && full[w->skip + n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(name) || memchr(full + w->skip, '/', n))
		return 0; /* not a direct child: ignore */
	memcpy(name, full + w->skip, n);
	name[n] = 0;
	e.name = name;
	e.is_prefix = p != NULL;
	e.size = o ? o->size : 0;
	w->seen++;
	w->stopped = w->fn(w->arg, &e);
	return w->stopped;
}

static int gb_list(eng_loc *l, const char *prefix, unsigned flags,
		   eng_list_fn fn, void *arg, char *errbuf)
{
	char *dir = gb_dir(l, prefix);
	struct gb_list w = { 0, fn, arg, 0, 0 };
	int r;

	(void)flags; /* sizes come with every listed object */
	if (!dir)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	w.skip = strlen(dir);
	r = gcs_list_each(gb_client(l), l->bucket, dir, "/", gb_list_one, &w);
	if (r && !w.stopped) /* the client failed, not the callback */
		r = gb_fail(l, errbuf, r, "list", prefix);
	/* An empty listing is what a missing directory is on POSIX. */
	if (r == 0 && w.seen == 0 && *prefix)
		r = eng_err(errbuf, CKPT_E_NOTFOUND,
			    "gs://%s/%s: nothing there", l->bucket, dir);
	free(dir);
	return r;
}

static int gb_size(eng_loc *l, const char *key, uint64_t *size)
{
	struct gcs_object o = { 0 };
	char *name = gb_name(l, key);
	int r;

	if (!name)
		return -ENOMEM;
	r = gcs_stat(gb_client(l), l->bucket, name, &o);
	if (r == 0)
		*size = o.size;
	gcs_object_clear(&o);
	free(name);
	return r < 0 ? eng_gcs_code(r) : 0;
}

static const char *gb_why(eng_loc *l)
{
	return gcs_errmsg(gb_client(l));
}

static int gb_get(eng_loc *l, const char *key, uint64_t max_len, uint8_t **out,
		  size_t *out_len, char *errbuf)
{
	struct gcs_object o = { 0 };
	char *name = gb_name(l, key);
	void *data = NULL;
	size_t len = 0;
	int r;

	*out = NULL;
	*out_len = 0;
	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = gcs_get(gb_client(l), l->bucket, name, max_len ? max_len : 1, &data,
		    &len, &o);
	gcs_object_clear(&o);
	free(name);
	if (r == -EFBIG) {
		free(data);
		return eng_err(errbuf, CKPT_E_CORRUPT,
			       "gs://%s/%s%s: more than the %llu bytes allowed",
			       l->bucket, l->prefix, key,
			       (unsigned long long)max_len);
	}
	if (r < 0) {
		free(data);
		if (r == -ENOENT)
			return eng_err(errbuf, r,
				       "gs://%s/%s%s: no such object",
				       l->bucket, l->prefix, key);
		return gb_fail(l, errbuf, r, "download", key);
	}
	*out = data;
	*out_len = len;
	return 0;
}

static int gb_read_range(eng_loc *l, const char *key, uint64_t off, void *buf,
			 size_t n, char *errbuf)
{
	char *name = gb_name(l, key);
	size_t got = 0;
	int r;

	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = n ? gcs_read(gb_client(l), l->bucket, name, off, n, buf, &got) : 0;
	free(name);
	if (r < 0)
		return gb_fail(l, errbuf, r, "read", key);
	if (got < n)
		return eng_err(errbuf, -EIO,
			       "gs://%s/%s%s: read at offset %llu: %zu bytes "
			       "of %zu (object too short)",
			       l->bucket, l->prefix, key,
			       (unsigned long long)off, got, n);
	return 0;
}

static int gb_create(eng_loc *l, const char *key, const void *buf, size_t len,
		     char *errbuf)
{
	char *name = gb_name(l, key);
	int r;

	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = gcs_put(gb_client(l), l->bucket, name, buf, len, GCS_CREATE_ONLY,
		    NULL);
	free(name);
	if (r == GCS_E_PRECONDITION)
		return eng_err(errbuf, CKPT_E_EXISTS,
			       "gs://%s/%s%s: already exists", l->bucket,
			       l->prefix, key);
	return r < 0 ? gb_fail(l, errbuf, r, "create", key) : 0;
}

static int gb_replace(eng_loc *l, const char *key, const void *buf, size_t len,
		      char *errbuf)
{
	char *name = gb_name(l, key);
	int r = 0, i;

	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	for (i = 0; i < GB_REPLACE_TRIES; i++) {
		struct gcs_object o = { 0 };
		struct gcs_cond cond = GCS_NO_COND;

		r = gcs_stat(gb_client(l), l->bucket, name, &o);
		if (r < 0 && r != -ENOENT)
			break;
		cond.if_generation_match = r == 0 ? o.generation : 0;
		gcs_object_clear(&o);
		r = gcs_put(gb_client(l), l->bucket, name, buf, len, cond,
			    NULL);
		if (r != GCS_E_PRECONDITION)
			break;
	}
	free(name);
	return r < 0 ? gb_fail(l, errbuf, r, "replace", key) : 0;
}

/* Read, extend, write back under the generation read; a writer that got
 * in between makes the write fail its precondition, and the append starts
 * again from a fresh read (after a short random pause, so two appenders
 * in step part). A fresh read that already ends with the bytes is our own
 * earlier write whose reply was lost: the client retried it and met its
 * own generation. */
static void gb_pause_ms(unsigned ms)
{
	struct timespec d = { 0, (long)(ms % 1000) * 1000000L };

	d.tv_nsec += (long)((unsigned)eng_mono_ns() % 1000u) * 1000L;
	while (nanosleep(&d, &d) < 0 && errno == EINTR)
		;
}

static int gb_append(eng_loc *l, const char *key, const void *buf,
		     size_t len, uint64_t max_len, char *errbuf)
{
	char *name = gb_name(l, key);
	int r = 0, i;

	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	for (i = 0; i < GB_APPEND_TRIES; i++) {
		struct gcs_object o = { 0 };
		struct gcs_cond cond = GCS_NO_COND;
		void *old = NULL;
		uint8_t *nb = NULL;
		size_t n = 0;

		if (i > 0)
			gb_pause_ms(1 + (unsigned)i * 5);
		r = gcs_get(gb_client(l), l->bucket, name, max_len, &old, &n,
			    &o);
		if (r == -ENOENT) {
			o.generation = 0; /* absent: create only */
			n = 0;
			r = 0;
		}
		if (r == 0 && i > 0 && n >= len && len > 0 &&
		    !memcmp((uint8_t *)old + n - len, buf, len)) {
			/* the last write did land, and its reply was lost
			 * (the retried request met its own generation) */
			free(old);
			gcs_object_clear(&o);
			break;
		}
		if (r == 0)
			nb = realloc(old, n + len ? n + len : 1);
		if (r < 0 || !nb) {
			free(old);
			gcs_object_clear(&o);
			free(name);
			if (r == -EFBIG)
				return eng_err(errbuf, CKPT_E_CORRUPT,
					       "gs://%s/%s%s: more than the "
					       "%llu bytes allowed",
					       l->bucket, l->prefix, key,
					       (unsigned long long)max_len);
			return r < 0 ? gb_fail(l, errbuf, r, "append", key) :
				       eng_err(errbuf, -ENOMEM,
					       "out of memory");
		}
		memcpy(nb + n, buf, len);
		cond.if_generation_match = o.generation;
		gcs_object_clear(&o);
		r = gcs_put(gb_client(l), l->bucket, name, nb, n + len, cond,
			    NULL);
		free(nb);
		if (r != GCS_E_PRECONDITION)
			break;
	}
	free(name);
	if (r == GCS_E_PRECONDITION)
		return eng_err(errbuf, -EAGAIN,
			       "gs://%s/%s%s: append: other writers changed "
			       "the object %d times in a row",
			       l->bucket, l->prefix, key, GB_APPEND_TRIES);
	return r < 0 ? gb_fail(l, errbuf, r, "append", key) : 0;
}

static int gb_remove(eng_loc *l, const char *key, char *errbuf)
{
	char *name = gb_name(l, key);
	int r;

	if (!name)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = gcs_delete(gb_client(l), l->bucket, name, 0, GCS_NO_COND);
	free(name);
	if (r == -ENOENT)
		return r;
	return r < 0 ? gb_fail(l, errbuf, r, "delete", key) : 0;
}

static int gb_sync(eng_loc *l, const char *prefix, char *errbuf)
{
	(void)l;
	(void)prefix;
	(void)errbuf;
	return 0; /* every call was durable when it returned */
}

struct gb_rm {
	eng_loc *l;
	uint64_t bytes;
	char **names;
	int64_t *gens;
	size_t n, cap;
};

static int gb_rm_one(void *arg, const struct gcs_object *o, const char *p)
{
	struct gb_rm *w = arg;

	(void)p;
	if (!o)
		return 0;
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 64;
		char **nn = realloc(w->names, cap * sizeof(*nn));

		if (!nn)
			return -ENOMEM;
		w->names = nn;
		int64_t *ng = realloc(w->gens, cap * sizeof(*ng));

		if (!ng)
			return -ENOMEM;
		w->gens = ng;
		w->cap = cap;
	}
	w->names[w->n] = strdup(o->name);
	if (!w->names[w->n])
		return -ENOMEM;
	w->gens[w->n++] = o->generation;
	w->bytes += o->size;
	return 0;
}

/* Everything under the prefix, sub-prefixes included: listed first (no
 * delimiter), then deleted by generation (retryable); an object that went
 * away meanwhile is not an error. */
static int gb_remove_all(eng_loc *l, const char *prefix, uint64_t *bytes,
			 char *errbuf)
{
	char *dir = gb_dir(l, prefix);
	struct gb_rm w = { l, 0, NULL, NULL, 0, 0 };
	uint64_t freed = 0;
	size_t i;
	int r;

	if (!dir)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = gcs_list_each(gb_client(l), l->bucket, dir, NULL, gb_rm_one, &w);
	if (r < 0)
		r = r == -ENOMEM ? eng_err(errbuf, r, "out of memory") :
				   gb_fail(l, errbuf, r, "list", prefix);
	for (i = 0; r == 0 && i < w.n; i++) {
		r = gcs_delete(gb_client(l), l->bucket, w.names[i], w.gens[i],
			       GCS_NO_COND);
		if (r == -ENOENT || r == GCS_E_PRECONDITION) {
			r = 0;
			continue;
		}
		if (r < 0)
			r = gb_fail(l, errbuf, r, "delete",
				    w.names[i] + strlen(l->prefix));
	}
	for (i = 0; i < w.n; i++)
		free(w.names[i]);
	free(w.names);
	free(w.gens);
	free(dir);
	freed = w.bytes;
	if (bytes)
		*bytes = r == 0 ? freed : 0;
	return r;
}

static int gb_lock(eng_loc *l)
{
	(void)l;
	return -1; /* objects: `latest` is replaced under its generation */
}

static void gb_unlock(eng_loc *l, int token)
{
	(void)l;
	(void)token;
}

static int gb_sink_new(struct ckpt *c, struct eng_sink **out)
{
	(void)c;
	*out = NULL;
	return eng_err(NULL, -EPROTONOSUPPORT,
		       "saving to gs:// is not built yet (upload sink)");
}

const eng_backend eng_backend_gcs = {
	.name = "gcs",
	.list = gb_list,
	.size = gb_size,
	.why = gb_why,
	.get = gb_get,
	.read_range = gb_read_range,
	.create = gb_create,
	.replace = gb_replace,
	.append = gb_append,
	.remove = gb_remove,
	.sync = gb_sync,
	.remove_all = gb_remove_all,
	.lock = gb_lock,
	.unlock = gb_unlock,
	.sink_new = gb_sink_new,
};

int eng_gcs_loc_init(eng_loc *l, char *errbuf)
{
	struct gcs_client *c;
	int r = eng_gcs_client_new(&c, l->where, errbuf);

	if (r < 0)
		return r;
	l->priv = c;
	l->be = &eng_backend_gcs;
	return 0;
}

void eng_gcs_loc_fini(eng_loc *l)
{
	gcs_client_free(gb_client(l));
	l->priv = NULL;
}
