/*
 * backend.c - locations: parsing "DIR" and "gs://BUCKET/PREFIX", opening
 * the backend that serves them, and unique temporary names.
 *
 * Design note. A root is named by a string everywhere in the engine (the
 * handle keeps what ckpt_open was given); a location is opened from it per
 * operation, which costs one small allocation for POSIX and one client
 * (no connection yet) for Cloud Storage (backend_gcs.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int eng_loc_parse(const char *where, char **bucket, char **prefix, char *errbuf)
{
	const char *s, *slash;
	size_t bl, pl;

	*bucket = NULL;
	*prefix = NULL;
	if (!where || !where[0])
		return eng_err(errbuf, -EINVAL, "empty checkpoint location");
	s = strstr(where, "://");
	if (!s || strchr(where, '/') < s)
		return ENG_LOC_POSIX;
	if (strncmp(where, "gs://", 5))
		return eng_err(errbuf, -EPROTONOSUPPORT,
			       "%s: unknown location scheme (a directory or "
			       "gs://BUCKET/PREFIX)",
			       where);
	s = where + 5;
	slash = strchr(s, '/');
	bl = slash ? (size_t)(slash - s) : strlen(s);
	if (bl == 0)
		return eng_err(errbuf, -EINVAL, "%s: no bucket name", where);
	slash = slash ? slash + 1 : s + bl;
	pl = strlen(slash);
	while (pl > 0 && slash[pl - 1] == '/')
		pl--;
	*bucket = strndup(s, bl);
	*prefix = malloc(pl + 2);
	if (!*bucket || !*prefix) {
		free(*bucket);
		free(*prefix);
		*bucket = *prefix = NULL;
		return eng_err(errbuf, -ENOMEM, "out of memory");
	}
	memcpy(*prefix, slash, pl);
	if (pl)
		(*prefix)[pl++] = '/';
	(*prefix)[pl] = 0;
	return ENG_LOC_GCS;
}

int eng_loc_open(const char *where, eng_loc **out, char *errbuf)
{
	eng_loc *l;
	char *bucket, *prefix;
	int kind = eng_loc_parse(where, &bucket, &prefix, errbuf);

	*out = NULL;
	if (kind < 0)
		return kind;
	l = calloc(1, sizeof(*l));
	if (!l) {
		free(bucket);
		free(prefix);
		return eng_err(errbuf, -ENOMEM, "out of memory");
	}
	if (kind == ENG_LOC_GCS) {
		int r;

		l->bucket = bucket;
		l->prefix = prefix;
		l->where = strdup(where);
		r = l->where ? eng_gcs_loc_init(l, errbuf) :
			       eng_err(errbuf, -ENOMEM, "out of memory");
		if (r < 0) {
			eng_loc_close(l);
			return r;
		}
		*out = l;
		return 0;
	}
	l->be = &eng_backend_posix;
	l->where = strdup(where);
	l->dir = strdup(where);
	if (!l->where || !l->dir) {
		eng_loc_close(l);
		return eng_err(errbuf, -ENOMEM, "out of memory");
	}
	*out = l;
	return 0;
}

void eng_loc_close(eng_loc *l)
{
	if (!l)
		return;
	if (l->priv)
		eng_gcs_loc_fini(l);
	free(l->where);
	free(l->dir);
	free(l->bucket);
	free(l->prefix);
	free(l);
}

int eng_loc_check(const char *where)
{
	eng_loc *l;
	int r = eng_loc_open(where, &l, NULL);

	eng_loc_close(l);
	return r;
}

char *eng_tmp_name(const char *dir, const char *name)
{
	static atomic_uint seq;
	unsigned rnd;

	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		rnd = (unsigned)ts.tv_nsec * 2654435761u;
	}
	rnd ^= atomic_fetch_add(&seq, 1) * 0x9e3779b9u;
	return eng_path("%s/%s.%ld-%08x" FMT_TMP_SUFFIX, dir, name,
			(long)getpid(), rnd);
}
