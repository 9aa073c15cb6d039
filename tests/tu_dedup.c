/*
 * tu_dedup.c - what the deduplication tests share (test_dedup.c, the
 * local cases; test_dedup_gcs.c, those with Cloud Storage): the
 * fine-tuning-shaped state, saving and checking a step, reading a step's
 * index and commit record, counting refs, verify, a sink's chunk count.
 */
#include "tu_dedup.h"

#include <stdlib.h>
#include <string.h>

ckpt *open_dedup(const char *dir, uint32_t flags, uint32_t keep_last)
{
	ckpt_settings s;
	ckpt *c = NULL;
	int rc;

	tu_settings(&s);
	s.flags |= flags;
	s.keep_last = keep_last;
	rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "ckpt_open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

/* frozen (seed 1, unchanged) + head (seed = step) */
void make_state(tu_set *set, uint64_t step)
{
	uint64_t fs[1] = { FROZEN_BYTES / 2 }, hs[1] = { HEAD_BYTES / 4 };

	tu_set_init(set);
	tu_set_add(set, "frozen", CKPT_BF16, 1, fs, 1);
	tu_set_add(set, "head", CKPT_F32, 1, hs, 1000 + step);
}

void save_step(ckpt *c, uint64_t step, int borrow)
{
	tu_set set;
	ckpt_tensor *v;
	ckpt_save_opts o;
	int rc;

	make_state(&set, step);
	v = calloc(set.n, sizeof(*v));
	tu_set_view(&set, v);
	ckpt_save_opts_default(&o);
	if (borrow)
		o.flags |= CKPT_SAVE_BORROW;
	rc = ckpt_save_ex(c, step, v, set.n, &o);
	if (rc == 0)
		rc = ckpt_wait(c);
	ck_assert_msg(rc == 0, "save %llu: %d %s", (unsigned long long)step, rc,
		      ckpt_errmsg(c));
	free(v);
	tu_set_free(&set);
}

void check_step(const char *dir, uint64_t step)
{
	char why[1024];
	tu_set set;

	make_state(&set, step);
	ck_assert_msg(tu_check_root(dir, step, &set, why, sizeof(why)) == 0,
		      "step %llu: %s", (unsigned long long)step, why);
	tu_set_free(&set);
}

/* the bytes of file `name` of step's directory (the caller frees them) */
uint8_t *step_file(const char *dir, uint64_t step, const char *name,
		   size_t *len)
{
	char *sd = tu_step_dir(dir, step);
	char *p = tu_path("%s/%s", sd, name);
	uint8_t *buf;

	ck_assert_msg(tu_read_file(p, &buf, len) == 0, "cannot read %s", p);
	free(p);
	free(sd);
	return buf;
}

void load_index(const char *dir, uint64_t step, fmt_index *ix)
{
	char err[512];
	size_t len;
	uint8_t *buf = step_file(dir, step, "h00000.index", &len);

	ck_assert_msg(fmt_index_decode(buf, len, ix, err, sizeof(err)) == 0,
		      "%s", err);
	free(buf);
}

void load_commit(const char *dir, uint64_t step, fmt_commit *cm)
{
	char err[512];
	size_t len;
	uint8_t *buf = step_file(dir, step, "COMMIT", &len);

	ck_assert_msg(fmt_commit_decode(buf, len, cm, err, sizeof(err)) == 0,
		      "%s", err);
	free(buf);
}

/* chunks of step's index that refer to older files */
size_t count_refs(const fmt_index *ix, uint64_t *ref_step)
{
	size_t n = 0;

	for (size_t k = 0; k < ix->nchunks; k++)
		if (ix->chunks[k].file >= ix->nfiles) {
			n++;
			if (ref_step)
				*ref_step =
					ix->refs[ix->chunks[k].file - ix->nfiles]
						.step;
		}
	return n;
}

int step_committed(const char *dir, uint64_t step)
{
	char *sd = tu_step_dir(dir, step);
	char *p = tu_path("%s/COMMIT", sd);
	int r = tu_exists(p);

	free(p);
	free(sd);
	return r;
}

int verify(const char *dir, uint64_t step, char *msg, size_t len)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, dir, step, NULL);

	if (rc == 0)
		rc = ckpt_reader_verify(r, NULL, NULL);
	snprintf(msg, len, "%s",
		 r ? ckpt_reader_errmsg(r) : ckpt_reader_errmsg(NULL));
	ckpt_reader_close(r);
	return rc;
}

uint64_t sink_chunks(ckpt *c, unsigned i)
{
	ckpt_sink_status st[ENG_MAX_SINKS];
	size_t n = 0;

	ck_assert_int_eq(ckpt_sink_status_get(c, st, ENG_MAX_SINKS, &n), 0);
	ck_assert_uint_gt(n, i);
	return st[i].chunks;
}
