/*
 * commit.c - the commit record, and the public entries on committed steps
 * (ckpt_commit, ckpt_list, ckpt_latest, ckpt_gc).
 *
 * Design note. A commit is built purely from what is stored: every host's
 * index document (whose bytes are hashed here) and the sizes of the shard
 * files it lists (a size query only: the whole-file hashes come from the
 * index, computed by the writer while writing). So any process holding a
 * handle on the root (a pod coordinator) can commit a step that other
 * processes wrote. COMMIT is created with the backend's create-if-absent
 * (POSIX: unique temporary + fsync + RENAME_NOREPLACE + directory fsync;
 * objects: ifGenerationMatch=0), so of two processes committing one step
 * exactly one succeeds and the other gets CKPT_E_EXISTS; only then is
 * `latest` moved and retention applied: a crash anywhere leaves either the
 * old or the new checkpoint fully valid.
 *
 *   indexes (get) + shard sizes (size) --> checks --> COMMIT (create)
 *       --> latest (replace, under the root lock, only forward)
 *       --> retention (gc.c)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "save_internal.h"

/* "step-N/name" in *key (malloc'd, the previous one freed). */
static int step_key(char **key, const char *dname, const char *name,
		    char *errbuf)
{
	free(*key);
	*key = eng_path("%s/%s", dname, name);
	return *key ? 0 : eng_err(errbuf, -ENOMEM, "out of memory");
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x > y ? -1 : x < y;
}

/*
 * Version 2 (dedup.c): every shard file host h's index refers to is in a
 * step that is committed now, with the recorded size, so a step never
 * commits referring to bytes that are gone (or being deleted: deleting a
 * step removes COMMIT first). Adds the steps to cm->refs (descending,
 * distinct) and raises cm->version to the index's.
 */
static int check_refs(eng_loc *l, const char *root, uint32_t h,
		      const fmt_index *x, fmt_commit *cm, char *errbuf)
{
	char rname[32], *key = NULL;
	uint64_t size, *v;
	int r = 0;

	if (x->version > cm->version)
		cm->version = x->version;
	for (size_t i = 0; i < x->nrefs && r == 0; i++) {
		const fmt_ref_entry *re = &x->refs[i];

		fmt_step_dirname(re->step, rname);
		r = step_key(&key, rname, FMT_COMMIT_NAME, errbuf);
		if (r == 0 && (r = l->be->size(l, key, &size)) == -ENOENT)
			r = eng_err(errbuf, CKPT_E_INCOMPLETE,
				    "%s/%s: host %u refers to step %llu, which "
				    "is not committed",
				    root, key, h, (unsigned long long)re->step);
		else if (r < 0) /* not an answer: out of memory, network */
			r = eng_err(errbuf, r, "%s/%s: cannot check it: %s",
				    root, key, ckpt_strerror(r));
		if (r == 0)
			r = step_key(&key, rname, re->name, errbuf);
		if (r == 0 && (r = l->be->size(l, key, &size)) < 0 &&
		    r != -ENOENT)
			r = eng_err(errbuf, r, "%s/%s: cannot check it: %s",
				    root, key, ckpt_strerror(r));
		else if (r == -ENOENT || (r == 0 && size != re->size))
			r = eng_err(errbuf, CKPT_E_INCOMPLETE,
				    "%s/%s: host %u refers to it: missing or "
				    "not %llu bytes",
				    root, key, h, (unsigned long long)re->size);
		if (r < 0)
			break;
		v = realloc(cm->refs, (cm->nrefs + 1) * sizeof(*v));
		if (!v) {
			r = eng_err(errbuf, -ENOMEM, "out of memory");
			break;
		}
		cm->refs = v;
		cm->refs[cm->nrefs++] = re->step;
	}
	free(key);
	if (r < 0 || cm->nrefs < 2)
		return r;
	qsort(cm->refs, cm->nrefs, sizeof(*cm->refs), cmp_desc);
	{
		size_t n = 1;

		for (size_t i = 1; i < cm->nrefs; i++)
			if (cm->refs[i] != cm->refs[n - 1])
				cm->refs[n++] = cm->refs[i];
		cm->nrefs = n;
	}
	return 0;
}

int eng_commit_step(const char *root, uint32_t host_count, uint64_t step,
		    char *errbuf)
{
	eng_loc *l = NULL;
	int r = eng_loc_open(root, &l, errbuf);

	if (r == 0)
		r = eng_commit_step_loc(l, host_count, step, errbuf);
	eng_loc_close(l);
	return r;
}

int eng_commit_step_loc(eng_loc *l, uint32_t host_count, uint64_t step,
			char *errbuf)
{
	const char *root = l->where;
	char dname[32], iname[32], err[512];
	char *key = NULL;
	fmt_index *ix = NULL;
	fmt_commit cm;
	fmt_file_entry *files = NULL;
	fmt_slice *slices = NULL;
	size_t nfiles = 0, nslices = 0, h_loaded = 0, i;
	uint8_t *buf = NULL, *out = NULL;
	size_t len = 0, out_len = 0;
	struct timespec ts;
	uint64_t size;
	uint32_t h;
	int r;

	memset(&cm, 0, sizeof(cm));
	fmt_step_dirname(step, dname);
	r = step_key(&key, dname, FMT_COMMIT_NAME, errbuf);
	if (r < 0)
		goto out;
	if (l->be->size(l, key, &size) == 0) {
		r = eng_err(errbuf, CKPT_E_EXISTS,
			    "%s/%s: step %llu is already committed", root, key,
			    (unsigned long long)step);
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
		r = step_key(&key, dname, iname, errbuf);
		if (r < 0)
			goto out;
		free(buf);
		buf = NULL;
		r = l->be->get(l, key, FMT_MAX_META_BYTES, &buf, &len, errbuf);
		if (r == -ENOENT || r == -ENOTDIR) {
			r = eng_err(errbuf, CKPT_E_INCOMPLETE,
				    "%s/%s: host %u of %u has not written its "
				    "index",
				    root, key, h, host_count);
			goto out;
		}
		if (r < 0)
			goto out;
		err[0] = 0;
		r = fmt_index_decode(buf, len, x, err, sizeof(err));
		if (r < 0) {
			r = eng_err(errbuf, r, "%s/%s: %s", root, key, err);
			goto out;
		}
		h_loaded = h + 1;
		if (x->step != step || x->host_index != h) {
			r = eng_err(errbuf, CKPT_E_CORRUPT,
				    "%s/%s: records step %llu host %u, "
				    "expected step %llu host %u",
				    root, key, (unsigned long long)x->step,
				    x->host_index, (unsigned long long)step, h);
			goto out;
		}
		if (x->host_count != host_count) {
			r = eng_err(errbuf, CKPT_E_MISMATCH,
				    "%s/%s: written for %u hosts, committing "
				    "for %u",
				    root, key, x->host_count, host_count);
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

			r = step_key(&key, dname, fe->name, errbuf);
			if (r < 0)
				goto out;
			r = l->be->size(l, key, &size);
			if (r < 0) {
				r = r == -ENOENT ?
					    eng_err(errbuf, CKPT_E_INCOMPLETE,
						    "%s/%s: host %u's shard "
						    "file is missing",
						    root, key, h) :
					    eng_err(errbuf, r, "%s/%s: stat: %s",
						    root, key,
						    l->be->why ?
							    l->be->why(l) :
							    ckpt_strerror(r));
				goto out;
			}
			if (size != fe->size) {
				r = eng_err(errbuf, CKPT_E_CORRUPT,
					    "%s/%s: %llu bytes, host %u's "
					    "index says %llu",
					    root, key,
					    (unsigned long long)size, h,
					    (unsigned long long)fe->size);
				goto out;
			}
			files[nfiles] = *fe;
			files[nfiles].host = h;
			files[nfiles].kind = CKPT_FILE_SHARD;
			nfiles++;
		}
		r = check_refs(l, root, h, x, &cm, errbuf);
		if (r < 0)
			goto out;
		nslices += x->ntensors;
		/* the step's reason: the lowest host's that records one
		 * (hosts may disagree; each index keeps its own) */
		if (cm.reason == CKPT_REASON_UNSPECIFIED)
			cm.reason = x->reason;
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
		r = eng_err(errbuf, r, "%s/%s: encoding the commit record: %s",
			    root, dname, ckpt_strerror(r));
		goto out;
	}
	/* create-if-absent: of two committers exactly one gets here with
	 * 0, the other CKPT_E_EXISTS; a failure after the record was placed
	 * takes back only this process's record (backend_posix.c) */
	r = step_key(&key, dname, FMT_COMMIT_NAME, errbuf);
	if (r < 0)
		goto out;
	r = l->be->create(l, key, out, out_len, errbuf);
	if (r == CKPT_E_EXISTS)
		r = eng_err(errbuf, CKPT_E_EXISTS,
			    "%s/%s: step %llu is already committed", root, key,
			    (unsigned long long)step);
	if (r < 0)
		goto out;
	/* Only move `latest` forward: committing an old step late must not
	 * hide a newer one. `latest` is a hint (readers scan for the newest
	 * COMMIT), so failing to update it does not undo a durable commit:
	 * the message stays in the handle's last error, the commit succeeds. */
	(void)eng_advance_latest(l, step, errbuf);
out:
	for (i = 0; i < h_loaded; i++)
		fmt_index_free(&ix[i]);
	free(ix);
	free(files);
	free(cm.refs);
	free(slices);
	free(buf);
	free(out);
	free(key);
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
	r = eng_list_steps(c->root, &v, &n, err);
	if (r < 0)
		return fail(c, r, err);
	info = calloc(n ? n : 1, sizeof(*info));
	if (!info) {
		free(v);
		return fail(c, -ENOMEM, "out of memory");
	}
	for (i = 0; i < n; i++) {
		fmt_commit cm;

		/* uncommitted, removed or damaged: not listed */
		if (eng_load_commit(c->root, v[i].step, &cm, NULL) < 0)
			continue;
		info[k].step = cm.step;
		info[k].host_count = cm.host_count;
		info[k].file_count = (uint32_t)cm.nfiles;
		info[k].tensor_count = cm.tensor_count;
		info[k].raw_bytes = cm.raw_bytes;
		info[k].stored_bytes = cm.stored_bytes;
		info[k].commit_unix_ns = cm.commit_unix_ns;
		info[k].reason = cm.reason;
		/* ascending: the newest referrer is the last to write */
		for (size_t j = 0; j < k; j++)
			for (size_t q = 0; q < cm.nrefs; q++)
				if (info[j].step == cm.refs[q])
					info[j].referenced_by = cm.step;
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
	if (flags & ~(CKPT_GC_DRY_RUN | CKPT_GC_UNUPLOADED))
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
