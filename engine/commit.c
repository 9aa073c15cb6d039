/*
 * commit.c - the commit record, listing, `latest`, retention and garbage
 * collection.
 *
 * Design note. A commit is built purely from what is on disk: every host's
 * index file (whose bytes are hashed here) and the sizes of the shard files
 * it lists (stat only: the whole-file hashes come from the index, computed
 * by the writer while writing). So any process holding a handle on the root
 * (a pod coordinator) can commit a step that other processes wrote. COMMIT
 * is written with tmp + fsync + rename + directory fsync, and only then is
 * `latest` moved and retention applied: a crash anywhere leaves either the
 * old or the new checkpoint fully valid.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "save_internal.h"

/*
 * Serializes writers of `latest` with the removal of stray temporary files
 * in the root (ckpt_gc), across threads and processes: flock on the root
 * directory. Returns an fd to close, or -1 (then unlocked, best effort).
 */
static int root_lock(const char *root)
{
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0)
		while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
			;
	return fd;
}

static void root_unlock(int fd)
{
	if (fd >= 0)
		close(fd); /* releases the flock */
}

int eng_commit_step(const char *root, uint32_t host_count, uint64_t step,
		    char *errbuf)
{
	char dname[32], iname[32], err[512];
	char *stepdir = NULL, *path = NULL;
	fmt_index *ix = NULL;
	fmt_commit cm;
	fmt_file_entry *files = NULL;
	fmt_slice *slices = NULL;
	size_t nfiles = 0, nslices = 0, h_loaded = 0, i;
	uint8_t *buf = NULL, *out = NULL;
	size_t len = 0, out_len = 0;
	struct timespec ts;
	struct stat st;
	uint64_t cur;
	uint32_t h;
	int r, lockfd;

	memset(&cm, 0, sizeof(cm));
	fmt_step_dirname(step, dname);
	stepdir = eng_path("%s/%s", root, dname);
	if (!stepdir) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	path = eng_path("%s/" FMT_COMMIT_NAME, stepdir);
	if (!path) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	if (stat(path, &st) == 0) {
		r = eng_err(errbuf, CKPT_E_EXISTS,
			    "%s: step %llu is already committed", path,
			    (unsigned long long)step);
		goto out;
	}
	if (stat(stepdir, &st) < 0) {
		r = eng_err(errbuf, CKPT_E_INCOMPLETE,
			    "%s: no such step directory (host 0 of %u has "
			    "not written its part)",
			    stepdir, host_count);
		goto out;
	}
	ix = calloc(host_count, sizeof(*ix));
	if (!ix) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	for (h = 0; h < host_count; h++) {
		fmt_index *x = &ix[h];
		size_t nf, j;

		fmt_index_name(h, iname);
		free(path);
		path = eng_path("%s/%s", stepdir, iname);
		if (!path) {
			r = eng_err(errbuf, -ENOMEM, "out of memory");
			goto out;
		}
		free(buf);
		buf = NULL;
		r = eng_read_file(path, FMT_MAX_META_BYTES, &buf, &len, errbuf);
		if (r == -ENOENT) {
			r = eng_err(errbuf, CKPT_E_INCOMPLETE,
				    "%s: host %u of %u has not written its "
				    "index",
				    path, h, host_count);
			goto out;
		}
		if (r < 0)
			goto out;
		err[0] = 0;
		r = fmt_index_decode(buf, len, x, err, sizeof(err));
		if (r < 0) {
			r = eng_err(errbuf, r, "%s: %s", path, err);
			goto out;
		}
		h_loaded = h + 1;
		if (x->step != step || x->host_index != h) {
			r = eng_err(errbuf, CKPT_E_CORRUPT,
				    "%s: records step %llu host %u, expected "
				    "step %llu host %u",
				    path, (unsigned long long)x->step,
				    x->host_index, (unsigned long long)step, h);
			goto out;
		}
		if (x->host_count != host_count) {
			r = eng_err(errbuf, CKPT_E_MISMATCH,
				    "%s: written for %u hosts, committing for "
				    "%u",
				    path, x->host_count, host_count);
			goto out;
		}
		nf = nfiles + 1 + x->nfiles;
		{
			fmt_file_entry *nfv =
				realloc(files, nf * sizeof(*files));

			if (!nfv) {
				r = eng_err(errbuf, -ENOMEM, "out of memory");
				goto out;
			}
			files = nfv;
		}
		memset(&files[nfiles], 0, sizeof(files[0]));
		memcpy(files[nfiles].name, iname, sizeof(iname));
		files[nfiles].size = len;
		files[nfiles].xxh3 = fmt_xxh3(buf, len);
		files[nfiles].host = h;
		files[nfiles].kind = CKPT_FILE_INDEX;
		nfiles++;
		for (j = 0; j < x->nfiles; j++) {
			fmt_file_entry *fe = &x->files[j];

			free(path);
			path = eng_path("%s/%s", stepdir, fe->name);
			if (!path) {
				r = eng_err(errbuf, -ENOMEM, "out of memory");
				goto out;
			}
			if (stat(path, &st) < 0) {
				r = errno == ENOENT ?
					    eng_err(errbuf, CKPT_E_INCOMPLETE,
						    "%s: host %u's shard file "
						    "is missing",
						    path, h) :
					    eng_err(errbuf, -errno,
						    "%s: stat: %s", path,
						    strerror(errno));
				goto out;
			}
			if ((uint64_t)st.st_size != fe->size) {
				r = eng_err(errbuf, CKPT_E_CORRUPT,
					    "%s: %llu bytes, host %u's index "
					    "says %llu",
					    path,
					    (unsigned long long)st.st_size, h,
					    (unsigned long long)fe->size);
				goto out;
			}
			files[nfiles] = *fe;
			files[nfiles].host = h;
			files[nfiles].kind = CKPT_FILE_SHARD;
			nfiles++;
		}
		nslices += x->ntensors;
	}

	slices = calloc(nslices ? nslices : 1, sizeof(*slices));
	if (!slices) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	nslices = 0;
	for (h = 0; h < host_count; h++)
		for (i = 0; i < ix[h].ntensors; i++) {
			slices[nslices].t = &ix[h].tensors[i];
			slices[nslices].host = h;
			cm.raw_bytes += ix[h].tensors[i].nbytes;
			nslices++;
		}
	r = fmt_slices_check(slices, nslices, &cm.tensor_count, err,
			     sizeof(err));
	if (r < 0) {
		r = eng_err(errbuf, r, "%s", err);
		goto out;
	}

	cm.step = step;
	cm.host_count = host_count;
	clock_gettime(CLOCK_REALTIME, &ts);
	cm.commit_unix_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	for (i = 0; i < nfiles; i++)
		cm.stored_bytes += files[i].size;
	cm.nfiles = nfiles;
	cm.files = files;
	r = fmt_commit_encode(&cm, &out, &out_len);
	cm.files = NULL;
	if (r < 0) {
		r = eng_err(errbuf, r, "%s: encoding the commit record: %s",
			    stepdir, ckpt_strerror(r));
		goto out;
	}
	r = eng_write_file_atomic(stepdir, FMT_COMMIT_NAME, out, out_len,
				  errbuf);
	if (r < 0) {
		/* If the rename happened but the directory fsync failed, the
		 * step would be visible without being known durable: take
		 * the record back so the error we return is the truth. */
		char *cpath = eng_path("%s/" FMT_COMMIT_NAME, stepdir);

		if (cpath)
			eng_unlink(cpath);
		free(cpath);
		goto out;
	}
	/* Only move `latest` forward: committing an old step late must not
	 * hide a newer one. `latest` is a hint (readers scan for the newest
	 * COMMIT), so failing to update it does not undo a durable commit:
	 * the message stays in the handle's last error, the commit succeeds. */
	lockfd = root_lock(root);
	if (eng_resolve_latest(root, &cur, NULL) < 0 || cur <= step)
		(void)eng_write_latest(root, step, errbuf);
	root_unlock(lockfd);
out:
	for (i = 0; i < h_loaded; i++)
		fmt_index_free(&ix[i]);
	free(ix);
	free(files);
	free(slices);
	free(buf);
	free(out);
	free(path);
	free(stepdir);
	return r;
}

/* ------------------------------------------------------------------ */
/* Retention and garbage collection                                   */
/* ------------------------------------------------------------------ */

static uint64_t dir_bytes(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	uint64_t n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)) != NULL) {
		struct stat st;

		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) ==
			    0 &&
		    S_ISREG(st.st_mode))
			n += (uint64_t)st.st_size;
	}
	closedir(d);
	return n;
}

static int remove_step(const char *root, uint64_t step, int dry,
		       uint64_t *bytes, char *errbuf)
{
	char dname[32];
	char *dir, *commit;
	struct stat st;
	int r = 0;

	fmt_step_dirname(step, dname);
	dir = eng_path("%s/%s", root, dname);
	commit = eng_path("%s/%s/" FMT_COMMIT_NAME, root, dname);
	if (!dir || !commit) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	if (dry) {
		*bytes += dir_bytes(dir);
		goto out;
	}
	/* COMMIT first: a crash halfway leaves debris, never a step that
	 * claims files it no longer has. */
	if (stat(commit, &st) == 0) {
		r = eng_unlink(commit);
		if (r < 0 && r != -ENOENT) {
			r = eng_err(errbuf, r, "%s: unlink: %s", commit,
				    ckpt_strerror(r));
			goto out;
		}
		*bytes += (uint64_t)st.st_size;
	}
	r = eng_remove_tree(dir, bytes);
	if (r < 0)
		r = eng_err(errbuf, r, "%s: remove: %s", dir, ckpt_strerror(r));
out:
	free(dir);
	free(commit);
	return r;
}

static int remove_root_tmp(const char *root, int dry, ckpt_gc_report *rep,
			   char *errbuf)
{
	DIR *d = opendir(root);
	struct dirent *de;
	size_t sl = strlen(FMT_TMP_SUFFIX);
	int r = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)) != NULL) {
		size_t n = strlen(de->d_name);
		struct stat st;
		char *p;

		if (n <= sl || strcmp(de->d_name + n - sl, FMT_TMP_SUFFIX))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) <
			    0 ||
		    !S_ISREG(st.st_mode))
			continue;
		if (!dry) {
			int e;

			p = eng_path("%s/%s", root, de->d_name);
			if (!p) {
				r = eng_err(errbuf, -ENOMEM, "out of memory");
				break;
			}
			e = eng_unlink(p);
			free(p);
			if (e == -ENOENT)
				continue;
			if (e < 0) {
				r = eng_err(errbuf, e, "%s/%s: unlink: %s",
					    root, de->d_name, ckpt_strerror(e));
				break;
			}
		}
		rep->debris_removed++;
		rep->bytes_freed += (uint64_t)st.st_size;
	}
	closedir(d);
	return r;
}

int eng_gc_run(const char *root, uint32_t keep_last, uint32_t keep_every,
	       unsigned flags, int debris, uint64_t skip_step,
	       ckpt_gc_fn fn, void *arg, ckpt_gc_report *report,
	       char *errbuf)
{
	ckpt_gc_report rep;
	eng_step_ent *v = NULL;
	unsigned char *drop = NULL;
	size_t n = 0, i, rank = 0;
	int dry = (flags & CKPT_GC_DRY_RUN) != 0, have_newest = 0, r;
	uint64_t newest = 0;

	memset(&rep, 0, sizeof(rep));
	r = eng_scan_steps(root, &v, &n, errbuf);
	if (r < 0)
		goto out;
	drop = calloc(n ? n : 1, 1);
	if (!drop) {
		r = eng_err(errbuf, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < n; i++)
		if (v[i].committed) {
			newest = v[i].step;
			have_newest = 1;
		}
	/* Decide first (committed steps, newest first; rank 0 is the
	 * newest), then remove in ascending step order, so that fn sees the
	 * steps in order. */
	for (i = n; i-- > 0;) {
		int keep;

		if (!v[i].committed)
			continue;
		keep = rank == 0 || keep_last == 0 || rank < keep_last ||
		       (keep_every && v[i].step % keep_every == 0);
		rank++;
		if (!keep && v[i].step != skip_step)
			drop[i] = 1;
	}
	if (debris && have_newest)
		for (i = 0; i < n; i++)
			if (!v[i].committed && v[i].step < newest &&
			    v[i].step != skip_step)
				drop[i] = 1;
	for (i = 0; i < n; i++) {
		uint64_t bytes = 0;

		if (!drop[i])
			continue;
		r = remove_step(root, v[i].step, dry, &bytes, errbuf);
		rep.bytes_freed += bytes; /* partial on failure */
		if (r < 0)
			goto out;
		if (v[i].committed)
			rep.steps_removed++;
		else
			rep.debris_removed++;
		if (fn)
			fn(arg, v[i].step, v[i].committed, bytes);
	}
	if (debris) {
		int lockfd = root_lock(root);

		r = remove_root_tmp(root, dry, &rep, errbuf);
		root_unlock(lockfd);
		if (r < 0)
			goto out;
	}
out:
	free(drop);
	free(v);
	if (report)
		*report = rep;
	return r;
}

/* ------------------------------------------------------------------ */
/* Public                                                             */
/* ------------------------------------------------------------------ */

/* The step this handle is saving, or UINT64_MAX. */
static uint64_t busy_step(struct ckpt *c)
{
	uint64_t s;

	pthread_mutex_lock(&c->mu);
	s = c->busy ? c->step : UINT64_MAX;
	pthread_mutex_unlock(&c->mu);
	return s;
}

static int fail(struct ckpt *c, int r, const char *msg)
{
	pthread_mutex_lock(&c->mu);
	eng_err(c->errmsg, r, "%s", msg);
	pthread_mutex_unlock(&c->mu);
	return r;
}

CKPT_API int ckpt_commit(ckpt *c, uint64_t step)
{
	char err[ENG_ERRMSG_MAX];
	int r;

	if (!c)
		return eng_err(NULL, -EINVAL, "ckpt_commit: handle is NULL");
	err[0] = 0;
	r = eng_commit_step(c->root, c->s.host_count, step, err);
	if (r < 0)
		return fail(c, r, err);
	/* Problems with the `latest` hint or retention do not undo a
	 * durable commit; their message is kept for ckpt_errmsg(). */
	if (c->s.keep_last || c->s.keep_every)
		eng_gc_run(c->root, c->s.keep_last, c->s.keep_every, 0, 0,
			   busy_step(c), NULL, NULL, NULL, err);
	if (err[0])
		(void)fail(c, 0, err);
	return 0;
}

CKPT_API int ckpt_list(ckpt *c, ckpt_step_info **out, size_t *count)
{
	char err[ENG_ERRMSG_MAX];
	eng_step_ent *v = NULL;
	ckpt_step_info *info = NULL;
	size_t n = 0, i, k = 0;
	int r;

	if (!c || !out || !count) {
		if (c)
			return fail(c, -EINVAL,
				    "ckpt_list: out or count is NULL");
		return eng_err(NULL, -EINVAL, "ckpt_list: handle is NULL");
	}
	*out = NULL;
	*count = 0;
	err[0] = 0;
	r = eng_scan_steps(c->root, &v, &n, err);
	if (r < 0)
		return fail(c, r, err);
	info = calloc(n ? n : 1, sizeof(*info));
	if (!info) {
		free(v);
		return fail(c, -ENOMEM, "out of memory");
	}
	for (i = 0; i < n; i++) {
		fmt_commit cm;

		if (!v[i].committed)
			continue;
		/* removed or damaged since the scan: not listed */
		if (eng_load_commit(c->root, v[i].step, &cm, NULL) < 0)
			continue;
		info[k].step = cm.step;
		info[k].host_count = cm.host_count;
		info[k].file_count = (uint32_t)cm.nfiles;
		info[k].tensor_count = cm.tensor_count;
		info[k].raw_bytes = cm.raw_bytes;
		info[k].stored_bytes = cm.stored_bytes;
		info[k].commit_unix_ns = cm.commit_unix_ns;
		fmt_commit_free(&cm);
		k++;
	}
	free(v);
	*out = info;
	*count = k;
	return 0;
}

CKPT_API int ckpt_latest(ckpt *c, uint64_t *step)
{
	char err[ENG_ERRMSG_MAX];
	int r;

	if (!c || !step) {
		if (c)
			return fail(c, -EINVAL, "ckpt_latest: step is NULL");
		return eng_err(NULL, -EINVAL, "ckpt_latest: handle is NULL");
	}
	err[0] = 0;
	r = eng_resolve_latest(c->root, step, err);
	if (r < 0)
		return fail(c, r, err);
	return 0;
}

CKPT_API int ckpt_gc(ckpt *c, uint32_t keep_last, uint32_t keep_every,
		     unsigned flags, ckpt_gc_fn fn, void *arg,
		     ckpt_gc_report *report)
{
	char err[ENG_ERRMSG_MAX];
	int r;

	if (report)
		memset(report, 0, sizeof(*report));
	if (!c)
		return eng_err(NULL, -EINVAL, "ckpt_gc: handle is NULL");
	if (flags & ~CKPT_GC_DRY_RUN)
		return fail(c, -EINVAL, "ckpt_gc: unknown flags");
	err[0] = 0;
	r = eng_gc_run(c->root, keep_last, keep_every, flags, 1, busy_step(c),
		       fn, arg, report, err);
	if (r < 0)
		return fail(c, r, err);
	return 0;
}

CKPT_API void ckpt_free(void *p)
{
	free(p);
}
