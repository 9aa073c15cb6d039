/*
 * journal.c - the upload journal: DIR/.upload/step-N.journal.
 *
 * Design note. One small JSON document per step being uploaded, replaced
 * atomically (temporary file, fsync, rename, directory fsync) at every
 * state change of the upload: a file's session opened, a file finished,
 * the index uploaded; the first at the start of the save, before any
 * byte is uploaded, with sizes not yet known (-1: the local index has
 * them once the save is complete). It holds what a restarted process needs to go on
 * where the server stopped: the remote location, each object's local name
 * and size, its session URI and the bytes confirmed when it was written.
 * Never a token: session URIs are the only secret-ish thing, and those are
 * what the protocol requires one to keep. The bytes themselves come from
 * the local shard files, which are durable before the journal exists.
 *
 *   {"v":1,"step":N,"remote":"gs://B/P","host":H,"hosts":K,
 *    "index_done":0,["error":"why the last attempt failed",]
 *    "files":[{"name":"h0-f0.shard","size":S,
 *    "session":"http://...","confirmed":C,"done":0}, ...]}
 *
 * Whether a process is uploading now: it holds DIR/.upload locked
 * (flock, shared) while its handle is open, so `ckptctl ls` can tell an
 * upload in progress from one that waits for the next ckpt_open.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "journal.h"

#define JDIR ".upload"

void eng_journal_free(eng_journal *j)
{
	uint32_t i;

	if (!j)
		return;
	for (i = 0; i < j->nfiles; i++)
		free(j->files[i].session);
	free(j->files);
	free(j->remote);
	free(j->error);
	memset(j, 0, sizeof(*j));
}

int eng_journal_write(const char *root, const eng_journal *j, char *errbuf)
{
	char name[48], *dir = eng_path("%s/" JDIR, root), *txt = NULL;
	json_t *o = NULL, *fa = NULL;
	uint32_t i;
	int r = -ENOMEM;

	if (!dir)
		goto out;
	o = json_object();
	fa = json_array();
	if (!o || !fa)
		goto out;
	json_object_set_new(o, "v", json_integer(1));
	json_object_set_new(o, "step", json_integer((json_int_t)j->step));
	json_object_set_new(o, "remote", json_string(j->remote));
	json_object_set_new(o, "host", json_integer(j->host));
	json_object_set_new(o, "hosts", json_integer(j->hosts));
	json_object_set_new(o, "index_done", json_integer(j->index_done));
	if (j->error)
		json_object_set_new(o, "error", json_string(j->error));
	for (i = 0; i < j->nfiles; i++) {
		const eng_jfile *f = &j->files[i];
		json_t *e = json_object();

		if (!e)
			goto out;
		json_object_set_new(e, "name", json_string(f->name));
		json_object_set_new(e, "size",
				    json_integer(f->size == UINT64_MAX ?
							 -1 :
							 (json_int_t)f->size));
		json_object_set_new(e, "session",
				    f->session ? json_string(f->session) :
						 json_null());
		json_object_set_new(e, "confirmed",
				    json_integer((json_int_t)f->confirmed));
		json_object_set_new(e, "done", json_integer(f->done));
		json_array_append_new(fa, e);
	}
	json_object_set(o, "files", fa);
	txt = json_dumps(o, JSON_COMPACT);
	if (!txt)
		goto out;
	r = eng_mkdir(dir, 0755);
	if (r < 0) {
		eng_err(errbuf, r, "%s: mkdir: %s", dir, ckpt_strerror(r));
		goto out;
	}
	snprintf(name, sizeof(name), "step-%" PRIu64 ".journal", j->step);
	r = eng_write_file_atomic(dir, name, txt, strlen(txt), errbuf);
out:
	if (r == -ENOMEM)
		eng_err(errbuf, r, "out of memory");
	free(txt);
	json_decref(fa);
	json_decref(o);
	free(dir);
	return r;
}

static uint64_t jint(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);

	return json_is_integer(v) && json_integer_value(v) >= 0 ?
		       (uint64_t)json_integer_value(v) :
		       0;
}

int eng_journal_read(const char *root, uint64_t step, eng_journal *j,
		     char *errbuf)
{
	char *path =
		eng_path("%s/" JDIR "/step-%" PRIu64 ".journal", root, step);
	uint8_t *buf = NULL;
	size_t len = 0, i;
	json_t *o = NULL, *fa, *rv;
	json_error_t je;
	int r;

	memset(j, 0, sizeof(*j));
	if (!path)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_read_file(path, 1u << 20, &buf, &len, errbuf);
	if (r < 0)
		goto out;
	o = json_loadb((const char *)buf, len, 0, &je);
	fa = o ? json_object_get(o, "files") : NULL;
	rv = o ? json_object_get(o, "remote") : NULL;
	if (!json_is_array(fa) || !json_is_string(rv) ||
	    jint(o, "step") != step) {
		r = eng_err(errbuf, CKPT_E_CORRUPT, "%s: not an upload journal",
			    path);
		goto out;
	}
	j->step = step;
	j->host = (uint32_t)jint(o, "host");
	j->hosts = (uint32_t)jint(o, "hosts");
	j->index_done = (int)jint(o, "index_done");
	j->remote = strdup(json_string_value(rv));
	j->files = calloc(json_array_size(fa) + 1, sizeof(*j->files));
	if (json_is_string(json_object_get(o, "error")))
		j->error =
			strdup(json_string_value(json_object_get(o, "error")));
	if (!j->remote || !j->files) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < json_array_size(fa); i++) {
		json_t *e = json_array_get(fa, i);
		json_t *nm = json_object_get(e, "name");
		json_t *se = json_object_get(e, "session");
		eng_jfile *f = &j->files[j->nfiles];

		if (!json_is_string(nm) ||
		    strlen(json_string_value(nm)) >= sizeof(f->name) ||
		    strchr(json_string_value(nm), '/')) {
			r = eng_err(errbuf, CKPT_E_CORRUPT,
				    "%s: file %zu has no valid name", path, i);
			goto out;
		}
		snprintf(f->name, sizeof(f->name), "%s", json_string_value(nm));
		f->size = json_integer_value(json_object_get(e, "size")) < 0 ?
				  UINT64_MAX :
				  jint(e, "size");
		f->confirmed = jint(e, "confirmed");
		f->done = (int)jint(e, "done");
		if (json_is_string(se)) {
			f->session = strdup(json_string_value(se));
			if (!f->session) {
				r = eng_err(errbuf, -ENOMEM, "out of memory");
				goto out;
			}
		}
		j->nfiles++;
	}
	r = 0;
out:
	if (r < 0)
		eng_journal_free(j);
	json_decref(o);
	free(buf);
	free(path);
	return r;
}

int eng_journal_remove(const char *root, uint64_t step)
{
	char *path =
		eng_path("%s/" JDIR "/step-%" PRIu64 ".journal", root, step);
	char *dir = eng_path("%s/" JDIR, root);
	int r = path && dir ? eng_unlink(path) : -ENOMEM;

	if (r == 0)
		eng_fsync_dir(dir);
	free(path);
	free(dir);
	return r == -ENOENT ? 0 : r;
}

int eng_journal_pending(const char *root, uint64_t step)
{
	char *path =
		eng_path("%s/" JDIR "/step-%" PRIu64 ".journal", root, step);
	FILE *f = path ? fopen(path, "r") : NULL;

	free(path);
	if (f)
		fclose(f);
	return f != NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int eng_journal_list(const char *root, uint64_t **steps, size_t *n)
{
	char *dir = eng_path("%s/" JDIR, root);
	DIR *d = dir ? opendir(dir) : NULL;
	struct dirent *e;
	uint64_t *v = NULL;
	size_t cap = 0;

	*steps = NULL;
	*n = 0;
	free(dir);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		unsigned long long s;
		char tail[16];

		if (sscanf(e->d_name, "step-%llu.journa%15s", &s, tail) != 2 ||
		    strcmp(tail, "l"))
			continue;
		if (*n == cap) {
			uint64_t *nv;

			cap = cap ? cap * 2 : 8;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				free(v);
				closedir(d);
				return -ENOMEM;
			}
			v = nv;
		}
		v[(*n)++] = s;
	}
	closedir(d);
	if (*n)
		qsort(v, *n, sizeof(*v), cmp_u64);
	*steps = v;
	return 0;
}

int eng_journal_hold(const char *root)
{
	char *dir = eng_path("%s/" JDIR, root);
	int fd, r = dir ? eng_mkdir(dir, 0755) : -ENOMEM;

	if (r < 0) {
		free(dir);
		return r;
	}
	fd = eng_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	free(dir);
	if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int eng_journal_held(const char *root)
{
	char *dir = eng_path("%s/" JDIR, root);
	int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	int held = 0;

	free(dir);
	if (fd < 0)
		return 0;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		held = errno == EWOULDBLOCK;
	close(fd); /* releases ours, if taken */
	return held;
}
