/*
 * root.c - the committed steps of a root: loading commit records, listing
 * steps, finding the newest one, and the `latest` pointer.
 *
 * Design note. A step exists for readers only when its COMMIT record is
 * present and valid; the `latest` object is a hint kept for people and
 * tools, and a newer committed step found by listing always wins (a crash
 * between writing COMMIT and updating `latest` must not hide a durable
 * step). Finding the newest step lists step names only (no record read),
 * sorts them descending and decodes records newest first until one is
 * valid, so a root with 10,000 steps costs one listing and usually one
 * decode. Listing every committed step (ckpt_list, gc) decodes them all.
 * Everything goes through the backend (backend.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static atomic_ulong commit_decodes;

unsigned long eng_commit_decodes(void)
{
	return atomic_load(&commit_decodes);
}

int eng_loc_load_commit(eng_loc *l, uint64_t step, fmt_commit *cm,
			char *errbuf)
{
	char dname[32], err[512];
	char *key;
	uint8_t *buf = NULL;
	size_t len = 0;
	int r;

	memset(cm, 0, sizeof(*cm));
	fmt_step_dirname(step, dname);
	key = eng_path("%s/" FMT_COMMIT_NAME, dname);
	if (!key)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = l->be->get(l, key, FMT_MAX_META_BYTES, &buf, &len, errbuf);
	if (r == -ENOENT || r == -ENOTDIR) {
		r = eng_err(errbuf, CKPT_E_NOTFOUND,
			    "%s: step %llu is not committed (no %s)", l->where,
			    (unsigned long long)step, FMT_COMMIT_NAME);
		goto out;
	}
	if (r < 0)
		goto out;
	err[0] = 0;
	atomic_fetch_add(&commit_decodes, 1);
	r = fmt_commit_decode(buf, len, cm, err, sizeof(err));
	if (r < 0) {
		r = eng_err(errbuf, r, "%s/%s: %s", l->where, key, err);
		goto out;
	}
	if (cm->step != step) {
		r = eng_err(errbuf, CKPT_E_CORRUPT,
			    "%s/%s: records step %llu, directory says %llu",
			    l->where, key, (unsigned long long)cm->step,
			    (unsigned long long)step);
		fmt_commit_free(cm);
		goto out;
	}
out:
	free(buf);
	free(key);
	return r;
}

int eng_load_commit(const char *root, uint64_t step, fmt_commit *cm,
		    char *errbuf)
{
	eng_loc *l;
	int r = eng_loc_open(root, &l, errbuf);

	memset(cm, 0, sizeof(*cm));
	if (r < 0)
		return r;
	r = eng_loc_load_commit(l, step, cm, errbuf);
	eng_loc_close(l);
	return r;
}

struct names {
	eng_step_ent *v;
	size_t n, cap;
};

static int add_name(void *arg, const eng_list_ent *e)
{
	struct names *s = arg;
	uint64_t step;

	if (!e->is_prefix || fmt_step_parse(e->name, &step) < 0)
		return 0;
	if (s->n == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 64;
		eng_step_ent *nv = realloc(s->v, ncap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		s->v = nv;
		s->cap = ncap;
	}
	s->v[s->n].step = step;
	s->v[s->n].committed = -1;
	s->n++;
	return 0;
}

static int cmp_step(const void *a, const void *b)
{
	const eng_step_ent *x = a, *y = b;

	return x->step < y->step ? -1 : x->step > y->step;
}

static int loc_list_steps(eng_loc *l, eng_step_ent **out, size_t *count,
			  char *errbuf)
{
	struct names s = { NULL, 0, 0 };
	int r = l->be->list(l, "", 0, add_name, &s, errbuf);

	*out = NULL;
	*count = 0;
	if (r == -ENOMEM)
		r = eng_err(errbuf, r, "out of memory");
	if (r < 0) {
		free(s.v);
		return r;
	}
	if (s.n)
		qsort(s.v, s.n, sizeof(*s.v), cmp_step);
	*out = s.v;
	*count = s.n;
	return 0;
}

int eng_list_steps(const char *root, eng_step_ent **out, size_t *count,
		   char *errbuf)
{
	eng_loc *l;
	int r = eng_loc_open(root, &l, errbuf);

	*out = NULL;
	*count = 0;
	if (r < 0)
		return r;
	r = loc_list_steps(l, out, count, errbuf);
	eng_loc_close(l);
	return r;
}

int eng_scan_steps(const char *root, eng_step_ent **out, size_t *count,
		   char *errbuf)
{
	eng_loc *l;
	size_t i;
	int r = eng_loc_open(root, &l, errbuf);

	*out = NULL;
	*count = 0;
	if (r < 0)
		return r;
	r = loc_list_steps(l, out, count, errbuf);
	for (i = 0; r == 0 && i < *count; i++) {
		fmt_commit cm;
		int lr = eng_loc_load_commit(l, (*out)[i].step, &cm, NULL);

		/* Out of memory says nothing about the step: taking it for
		 * uncommitted would let gc remove it as debris. */
		if (lr == -ENOMEM) {
			r = eng_err(errbuf, lr, "%s: out of memory", l->where);
			free(*out);
			*out = NULL;
			*count = 0;
			break;
		}
		(*out)[i].committed = lr == 0;
		if ((*out)[i].committed)
			fmt_commit_free(&cm);
	}
	eng_loc_close(l);
	return r;
}

static int loc_resolve_latest(eng_loc *l, uint64_t *step, char *errbuf)
{
	eng_step_ent *v;
	size_t n, i;
	int r = loc_list_steps(l, &v, &n, errbuf);

	if (r < 0)
		return r;
	for (i = n; i-- > 0;) {
		fmt_commit cm;

		r = eng_loc_load_commit(l, v[i].step, &cm, NULL);
		if (r == 0) {
			fmt_commit_free(&cm);
			*step = v[i].step;
			free(v);
			return 0;
		}
		if (r == -ENOMEM) { /* not "no committed step" */
			free(v);
			return eng_err(errbuf, r, "%s: out of memory",
				       l->where);
		}
	}
	free(v);
	return eng_err(errbuf, CKPT_E_NOTFOUND, "%s: no committed checkpoint",
		       l->where);
}

int eng_resolve_latest(const char *root, uint64_t *step, char *errbuf)
{
	eng_loc *l;
	int r = eng_loc_open(root, &l, errbuf);

	if (r < 0)
		return r;
	r = loc_resolve_latest(l, step, errbuf);
	eng_loc_close(l);
	return r;
}

static int loc_write_latest(eng_loc *l, uint64_t step, char *errbuf)
{
	char dname[32], line[40];
	int n;

	fmt_step_dirname(step, dname);
	n = snprintf(line, sizeof(line), "%s\n", dname);
	return l->be->replace(l, FMT_LATEST_NAME, line, (size_t)n, errbuf);
}

int eng_advance_latest(eng_loc *l, uint64_t step, char *errbuf)
{
	uint64_t cur;
	int tok, r = 0;

	tok = l->be->lock(l);
	if (loc_resolve_latest(l, &cur, NULL) < 0 || cur <= step)
		r = loc_write_latest(l, step, errbuf);
	l->be->unlock(l, tok);
	return r;
}

int eng_move_latest(const char *root, uint64_t step, char *errbuf)
{
	eng_loc *l;
	int r = eng_loc_open(root, &l, errbuf);

	if (r < 0)
		return r;
	r = eng_advance_latest(l, step, errbuf);
	eng_loc_close(l);
	return r;
}

int eng_get_doc(const char *root, const char *dname, const char *name,
		uint64_t max_len, uint8_t **out, size_t *out_len, char *errbuf)
{
	eng_loc *l;
	char *key;
	int r;

	*out = NULL;
	*out_len = 0;
	r = eng_loc_open(root, &l, errbuf);
	if (r < 0)
		return r;
	key = eng_path("%s/%s", dname, name);
	if (!key)
		r = eng_err(errbuf, -ENOMEM, "out of memory");
	else
		r = l->be->get(l, key, max_len, out, out_len, errbuf);
	free(key);
	eng_loc_close(l);
	return r;
}
