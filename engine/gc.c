/*
 * gc.c - retention and garbage collection of a root.
 *
 * Design note. Retention keeps the newest committed step, the keep_last
 * newest and every keep_every-th; gc also removes debris: uncommitted step
 * directories below the newest committed step, stray temporaries in the
 * root, and commit temporaries left in committed steps by a process that
 * died mid-commit. A step is removed in an order that can never leave a
 * committed step missing files:
 *
 *   remove COMMIT --> sync the step prefix (POSIX: fsync the directory)
 *                 --> remove the shards, the indexes, the directory
 *
 * so a crash at any point leaves either the whole committed step or
 * uncommitted debris that the next gc removes. Everything goes through the
 * backend (backend.h).
 *
 * Dedup (format version 2, SPEC.md section 16): a kept committed step
 * keeps every step its COMMIT lists in "refs" (they hold bytes it reads),
 * decided newest first so that what a kept referenced step refers to is
 * kept too. Of the steps removed, those that refer to others lose their
 * COMMIT first (newest first), before any step is removed, so a crash
 * mid-gc never leaves a committed step whose referenced files are gone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"
#include "save_internal.h"

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), k = strlen(suf);

	return n > k && !strcmp(s + n - k, suf);
}

static int add_size(void *arg, const eng_list_ent *e)
{
	if (!e->is_prefix)
		*(uint64_t *)arg += e->size;
	return 0;
}

static int remove_step(eng_loc *l, uint64_t step, int dry, uint64_t *bytes,
		       char *errbuf)
{
	char dname[32], key[48];
	uint64_t size = 0;
	int r;

	fmt_step_dirname(step, dname);
	if (dry) {
		/* a size estimate only: a failed listing counts nothing */
		(void)l->be->list(l, dname, ENG_LIST_SIZES, add_size, bytes,
				  NULL);
		return 0;
	}
	snprintf(key, sizeof(key), "%s/" FMT_COMMIT_NAME, dname);
	if (l->be->size(l, key, &size) == 0) {
		r = l->be->remove(l, key, errbuf);
		if (r < 0 && r != -ENOENT)
			return r;
		if (r == 0)
			*bytes += size;
		/* the record's removal is durable before any file it
		 * names goes */
		r = l->be->sync(l, dname, errbuf);
		if (r < 0)
			return r;
	}
	return l->be->remove_all(l, dname, bytes, errbuf);
}

struct tmp_walk {
	eng_loc *l;
	const char *dir;  /* listed prefix, "" for the root */
	const char *only; /* name prefix the temporaries must have, or NULL */
	int dry;
	ckpt_gc_report *rep;
	char *errbuf;
};

static int remove_tmp(void *arg, const eng_list_ent *e)
{
	struct tmp_walk *w = arg;
	char *key;
	int r;

	if (e->is_prefix || !has_suffix(e->name, FMT_TMP_SUFFIX) ||
	    (w->only && strncmp(e->name, w->only, strlen(w->only))))
		return 0;
	if (!w->dry) {
		key = eng_path("%s%s%s", w->dir, w->dir[0] ? "/" : "", e->name);
		if (!key)
			return eng_err(w->errbuf, -ENOMEM, "out of memory");
		r = w->l->be->remove(w->l, key, w->errbuf);
		free(key);
		if (r == -ENOENT)
			return 0;
		if (r < 0)
			return r;
	}
	w->rep->debris_removed++;
	w->rep->bytes_freed += e->size;
	return 0;
}

/* Stray temporaries: in the root (under the lock `latest` writers take),
 * and commit temporaries inside committed steps (their writer, if alive,
 * has lost the race to a committed record and only removes its own). */
static int remove_stray_tmp(eng_loc *l, const eng_step_ent *v, size_t n,
			    int dry, ckpt_gc_report *rep, char *errbuf)
{
	struct tmp_walk w = { l, "", NULL, dry, rep, errbuf };
	char dname[32];
	size_t i;
	int tok, r;

	tok = l->be->lock(l);
	r = l->be->list(l, "", ENG_LIST_SIZES, remove_tmp, &w, errbuf);
	l->be->unlock(l, tok);
	if (r == CKPT_E_NOTFOUND)
		r = 0;
	w.only = FMT_COMMIT_NAME ".";
	w.dir = dname;
	for (i = 0; r == 0 && i < n; i++) {
		if (!v[i].committed)
			continue;
		fmt_step_dirname(v[i].step, dname);
		r = l->be->list(l, dname, ENG_LIST_SIZES, remove_tmp, &w,
				errbuf);
		if (r == CKPT_E_NOTFOUND)
			r = 0;
	}
	return r;
}

/* Un-drops every step a kept committed step refers to (newest first, so
 * the refs of a step kept that way count too); refers[i]: step i's COMMIT
 * lists refs. An unreadable COMMIT of a kept step fails the gc (its refs
 * are unknown). */
static int keep_referenced(const char *root, const eng_step_ent *v, size_t n,
			   unsigned char *drop, unsigned char **refers,
			   char *errbuf)
{
	*refers = calloc(n ? n : 1, 1);
	if (!*refers)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	for (size_t i = n; i-- > 0;) {
		fmt_commit cm;
		size_t j = i;
		int r;

		if (!v[i].committed)
			continue;
		r = eng_load_commit(root, v[i].step, &cm, errbuf);
		if (r < 0 && drop[i])
			continue;
		if (r < 0)
			return r;
		(*refers)[i] = cm.nrefs > 0;
		for (size_t k = 0; !drop[i] && k < cm.nrefs; k++) {
			while (j > 0 && v[j].step > cm.refs[k])
				j--;
			if (v[j].step == cm.refs[k])
				drop[j] = 0;
		}
		fmt_commit_free(&cm);
	}
	return 0;
}

int eng_gc_run(const char *root, uint32_t keep_last, uint32_t keep_every,
	       unsigned flags, int debris, uint64_t skip_step, ckpt_gc_fn fn,
	       void *arg, ckpt_gc_report *report, char *errbuf)
{
	ckpt_gc_report rep;
	eng_step_ent *v = NULL;
	unsigned char *drop = NULL, *refers = NULL;
	size_t n = 0, i, rank = 0;
	int dry = (flags & CKPT_GC_DRY_RUN) != 0, have_newest = 0, r;
	uint64_t newest = 0;
	eng_loc *l = NULL;

	memset(&rep, 0, sizeof(rep));
	r = eng_loc_open(root, &l, errbuf);
	if (r < 0)
		goto out;
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
		/* its upload would lose its source (journal.c) */
		if (!keep && !(flags & CKPT_GC_UNUPLOADED) &&
		    eng_journal_pending(root, v[i].step))
			keep = 1;
		if (!keep && v[i].step != skip_step)
			drop[i] = 1;
	}
	r = keep_referenced(root, v, n, drop, &refers, errbuf);
	if (r < 0)
		goto out;
	for (i = n; !dry && i-- > 0;) {
		char dname[32], key[48];

		if (!drop[i] || !refers[i])
			continue;
		fmt_step_dirname(v[i].step, dname);
		snprintf(key, sizeof(key), "%s/" FMT_COMMIT_NAME, dname);
		r = l->be->remove(l, key, errbuf);
		if (r < 0 && r != -ENOENT)
			goto out;
		r = l->be->sync(l, dname, errbuf);
		if (r < 0)
			goto out;
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
		r = remove_step(l, v[i].step, dry, &bytes, errbuf);
		rep.bytes_freed += bytes; /* partial on failure */
		if (r < 0)
			goto out;
		if (v[i].committed)
			rep.steps_removed++;
		else
			rep.debris_removed++;
		if (fn)
			fn(arg, v[i].step, v[i].committed, bytes);
		v[i].committed = 0; /* gone: no temporaries to look for */
	}
	if (debris) {
		r = remove_stray_tmp(l, v, n, dry, &rep, errbuf);
		if (r < 0)
			goto out;
	}
out:
	eng_loc_close(l);
	free(drop);
	free(refers);
	free(v);
	if (report)
		*report = rep;
	return r;
}
