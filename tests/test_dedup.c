/*
 * test_dedup.c - unchanged chunks are neither rewritten nor sent to a sink
 * (dedup.c, format version 2, SPEC.md section 16).
 *
 * The state is fine-tuning shaped: a large "frozen" tensor first (the same
 * bytes at every step) and a small "head" that changes. Each safety rule
 * of the design has a case that fails without it: the 128-bit hash guard,
 * a handle with another sink does not refer, a directory with a remote
 * refers only to a base its upload committed in the bucket, a gs:// root
 * to the step it committed last, commit checks that refs are committed,
 * retention and gc keep referenced steps, gc's removal order, verify names
 * a missing ref, copies refuse to produce a dangling step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "save_internal.h"
#include "test_gcs_util.h"
#include "testutil.h"

static char why[1024];

/* 1 MiB frozen + 64 KiB head, 64 KiB chunks: 17 chunks, 16 frozen. */
#define FROZEN_BYTES (1u << 20)
#define HEAD_BYTES (64u << 10)

static ckpt *open_dedup(const char *dir, uint32_t flags, uint32_t keep_last)
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
static void make_state(tu_set *set, uint64_t step)
{
	uint64_t fs[1] = { FROZEN_BYTES / 2 }, hs[1] = { HEAD_BYTES / 4 };

	tu_set_init(set);
	tu_set_add(set, "frozen", CKPT_BF16, 1, fs, 1);
	tu_set_add(set, "head", CKPT_F32, 1, hs, 1000 + step);
}

static void save_step(ckpt *c, uint64_t step, int borrow)
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

static void check_step(const char *dir, uint64_t step)
{
	tu_set set;

	make_state(&set, step);
	ck_assert_msg(tu_check_root(dir, step, &set, why, sizeof(why)) == 0,
		      "step %llu: %s", (unsigned long long)step, why);
	tu_set_free(&set);
}

/* the bytes of file `name` of step's directory (the caller frees them) */
static uint8_t *step_file(const char *dir, uint64_t step, const char *name,
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

static void load_index(const char *dir, uint64_t step, fmt_index *ix)
{
	char err[512];
	size_t len;
	uint8_t *buf = step_file(dir, step, "h00000.index", &len);

	ck_assert_msg(fmt_index_decode(buf, len, ix, err, sizeof(err)) == 0,
		      "%s", err);
	free(buf);
}

static void load_commit(const char *dir, uint64_t step, fmt_commit *cm)
{
	char err[512];
	size_t len;
	uint8_t *buf = step_file(dir, step, "COMMIT", &len);

	ck_assert_msg(fmt_commit_decode(buf, len, cm, err, sizeof(err)) == 0,
		      "%s", err);
	free(buf);
}

/* chunks of step's index that refer to older files */
static size_t count_refs(const fmt_index *ix, uint64_t *ref_step)
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

static int step_committed(const char *dir, uint64_t step)
{
	char *sd = tu_step_dir(dir, step);
	char *p = tu_path("%s/COMMIT", sd);
	int r = tu_exists(p);

	free(p);
	free(sd);
	return r;
}

static int verify(const char *dir, uint64_t step, char *msg, size_t len)
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

/* The frozen chunks of the second save refer to the first; its files hold
 * only the head; a third save refers to the first directly (no chains);
 * everything reads back and verifies. Copy and borrow paths. */
START_TEST(test_frozen_refs)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	fmt_index i1, i2, i3;
	fmt_commit cm;
	uint64_t rs = 99;
	uint64_t s1 = 0, s2 = 0;

	save_step(c, 1, _i);
	save_step(c, 2, _i);
	save_step(c, 3, !_i);
	ckpt_close(c);
	load_index(dir, 1, &i1);
	load_index(dir, 2, &i2);
	load_index(dir, 3, &i3);
	ck_assert_uint_eq(i1.version, 2);
	ck_assert_uint_eq(i1.nrefs, 0);
	ck_assert_uint_eq(count_refs(&i1, NULL), 0);
	ck_assert_uint_eq(count_refs(&i2, &rs), FROZEN_BYTES / (64u << 10));
	ck_assert_uint_eq(rs, 1);
	ck_assert_uint_eq(count_refs(&i3, &rs), FROZEN_BYTES / (64u << 10));
	ck_assert_uint_eq(rs, 1);
	for (size_t i = 0; i < i3.nrefs; i++)
		ck_assert_uint_eq(i3.refs[i].step, 1);
	for (size_t f = 0; f < i1.nfiles; f++)
		s1 += i1.files[f].size;
	for (size_t f = 0; f < i2.nfiles; f++)
		s2 += i2.files[f].size;
	ck_assert_msg(s2 * 8 < s1, "step 2 stores %llu bytes, step 1 %llu",
		      (unsigned long long)s2, (unsigned long long)s1);
	load_commit(dir, 3, &cm);
	ck_assert_uint_eq(cm.version, 2);
	ck_assert_uint_eq(cm.nrefs, 1);
	ck_assert_uint_eq(cm.refs[0], 1);
	fmt_commit_free(&cm);
	for (uint64_t s = 1; s <= 3; s++) {
		check_step(dir, s);
		ck_assert_msg(verify(dir, s, why, sizeof(why)) == 0, "%s", why);
	}
	fmt_index_free(&i1);
	fmt_index_free(&i2);
	fmt_index_free(&i3);
}
END_TEST

/* Without the setting (or with CKPT_DEDUP=0 over it) steps are version 1
 * and hold every byte; CKPT_DEDUP=1 turns it on without the flag. */
START_TEST(test_setting)
{
	const char *dir = tu_tmpdir();
	ckpt *c;
	fmt_index ix;

	c = open_dedup(dir, 0, 0);
	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	load_index(dir, 2, &ix);
	ck_assert_uint_eq(ix.version, 1);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);

	setenv("CKPT_DEDUP", "0", 1);
	c = open_dedup(dir, CKPT_F_DEDUP, 0);
	save_step(c, 3, 0);
	save_step(c, 4, 0);
	ckpt_close(c);
	load_index(dir, 4, &ix);
	ck_assert_uint_eq(ix.version, 1);
	fmt_index_free(&ix);

	setenv("CKPT_DEDUP", "1", 1);
	c = open_dedup(dir, 0, 0);
	save_step(c, 5, 0); /* base 4 is version 1: nothing to compare */
	save_step(c, 6, 0);
	ckpt_close(c);
	unsetenv("CKPT_DEDUP");
	load_index(dir, 5, &ix);
	ck_assert_uint_eq(ix.version, 2);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);
	load_index(dir, 6, &ix);
	ck_assert_uint_eq(count_refs(&ix, NULL), FROZEN_BYTES / (64u << 10));
	fmt_index_free(&ix);
	check_step(dir, 6);
}
END_TEST

/* After a restart the first save refers to what the last process
 * committed. */
START_TEST(test_restart)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	fmt_index ix;

	save_step(c, 10, 0);
	ckpt_close(c);
	c = open_dedup(dir, CKPT_F_DEDUP, 0);
	save_step(c, 20, 0);
	ckpt_close(c);
	load_index(dir, 20, &ix);
	ck_assert_uint_eq(count_refs(&ix, NULL), FROZEN_BYTES / (64u << 10));
	fmt_index_free(&ix);
	check_step(dir, 20);
}
END_TEST

/* Equal XXH3-64 is not enough: a base chunk whose 128-bit hash differs
 * is written in full. (The base's index is rewritten with one hash
 * changed and the step recommitted over it.) */
START_TEST(test_h128_guard)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	char err[512], *sd, *p;
	fmt_index ix;
	uint8_t *buf;
	size_t len;

	save_step(c, 1, 0);
	load_index(dir, 1, &ix);
	ix.chunks[3].h128[1] ^= 1;
	ck_assert_int_eq(fmt_index_encode(&ix, &buf, &len), 0);
	fmt_index_free(&ix);
	sd = tu_step_dir(dir, 1);
	p = tu_path("%s/h00000.index", sd);
	ck_assert_int_eq(tu_write_file(p, buf, len), 0);
	free(p);
	free(buf);
	p = tu_path("%s/COMMIT", sd);
	ck_assert_int_eq(unlink(p), 0);
	free(p);
	free(sd);
	ck_assert_msg(eng_commit_step(dir, 1, 1, err) == 0, "%s", err);
	save_step(c, 2, 0);
	ckpt_close(c);
	load_index(dir, 2, &ix);
	ck_assert_uint_lt(ix.chunks[3].file, ix.nfiles); /* written */
	ck_assert_uint_ge(ix.chunks[2].file, ix.nfiles); /* referred */
	ck_assert_uint_eq(count_refs(&ix, NULL),
			  FROZEN_BYTES / (64u << 10) - 1);
	fmt_index_free(&ix);
	check_step(dir, 2);
}
END_TEST

/* A sink that takes every chunk and drops it at once. */
static void ns_put(eng_sink *s, eng_buf *b)
{
	eng_sink_release(s, b);
}
static int ns_begin(eng_sink *s, eng_job *j)
{
	(void)s;
	(void)j;
	return 0;
}
static int ns_pump(eng_sink *s, int failed, int *busy)
{
	(void)s;
	(void)failed;
	*busy = 0;
	return 0;
}
static int ns_publish(eng_sink *s, eng_job *j, const char *n, const uint8_t *b,
		      size_t l)
{
	(void)s;
	(void)j;
	(void)n;
	(void)b;
	(void)l;
	return 0;
}
static void ns_abort(eng_sink *s, eng_job *j)
{
	(void)s;
	(void)j;
}
static void ns_destroy(eng_sink *s)
{
	(void)s;
}
static const eng_sink_ops ns_ops = {
	.name = "null",
	.begin = ns_begin,
	.put = ns_put,
	.pump = ns_pump,
	.finish = ns_begin,
	.publish = ns_publish,
	.abort = ns_abort,
	.destroy = ns_destroy,
};

static uint64_t sink_chunks(ckpt *c, unsigned i)
{
	ckpt_sink_status st[ENG_MAX_SINKS];
	size_t n = 0;

	ck_assert_int_eq(ckpt_sink_status_get(c, st, ENG_MAX_SINKS, &n), 0);
	ck_assert_uint_gt(n, i);
	return st[i].chunks;
}

/* Reused chunks reach no sink; a handle with a second destination other
 * than its remote's upload sink never refers, since that destination may
 * not hold the base. */
START_TEST(test_sinks)
{
	const char *dir = tu_tmpdir();
	char *d2 = tu_path("%s/two", dir);
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	eng_sink ns;
	fmt_index ix;

	save_step(c, 1, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	ckpt_close(c);

	c = open_dedup(d2, CKPT_F_DEDUP, 0);
	memset(&ns, 0, sizeof(ns));
	ns.ops = &ns_ops;
	ck_assert_int_eq(eng_sink_add(c, &ns), 0);
	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	ck_assert_uint_eq(sink_chunks(c, 1), 17);
	ckpt_close(c);
	load_index(d2, 2, &ix);
	ck_assert_uint_eq(ix.version, 1);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);
	free(d2);
}
END_TEST

/* A step whose refs are gone by commit time is not committed. */
START_TEST(test_commit_checks_refs)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP | CKPT_F_MANUAL_COMMIT, 0);
	char *sd;
	int rc;

	save_step(c, 1, 0);
	ck_assert_int_eq(ckpt_commit(c, 1), 0);
	save_step(c, 2, 0);
	sd = tu_step_dir(dir, 1);
	ck_assert_int_eq(tu_rm_rf(sd), 0);
	free(sd);
	rc = ckpt_commit(c, 2);
	ck_assert_msg(rc == CKPT_E_INCOMPLETE, "commit: %d %s", rc,
		      ckpt_errmsg(c));
	ck_assert_ptr_nonnull(strstr(ckpt_errmsg(c), "refers to step 1"));
	ck_assert(!step_committed(dir, 2));
	ckpt_close(c);
}
END_TEST

/* Two hosts: each refers to its own earlier shards only. */
START_TEST(test_multihost)
{
	const char *dir = tu_tmpdir();
	ckpt *h[2], *coord;
	ckpt_settings s;
	char name[32], *sd, *p;
	uint8_t *buf;
	size_t len;

	for (uint32_t i = 0; i < 2; i++) {
		tu_settings(&s);
		s.flags = CKPT_F_DEDUP;
		s.host_index = i;
		s.host_count = 2;
		s.files_per_host = 1 + i;
		ck_assert_int_eq(ckpt_open(&h[i], dir, &s), 0);
	}
	tu_settings(&s);
	s.staging_bytes = 0;
	s.host_count = 2;
	ck_assert_int_eq(ckpt_open(&coord, dir, &s), 0);
	for (uint64_t step = 1; step <= 2; step++) {
		for (uint32_t i = 0; i < 2; i++) {
			tu_set set;
			uint64_t fs[1] = { FROZEN_BYTES }, hs[1] = { 1000 };

			tu_set_init(&set);
			snprintf(name, sizeof(name), "frozen.%u", i);
			tu_set_add(&set, name, CKPT_U8, 1, fs, 5 + i);
			snprintf(name, sizeof(name), "head.%u", i);
			tu_set_add(&set, name, CKPT_U8, 1, hs, step * 10 + i);
			ck_assert_int_eq(tu_save(h[i], step, &set), 0);
			tu_set_free(&set);
		}
		ck_assert_msg(ckpt_commit(coord, step) == 0, "%s",
			      ckpt_errmsg(coord));
	}
	sd = tu_step_dir(dir, 2);
	for (uint32_t i = 0; i < 2; i++) {
		fmt_index ix;
		char err[512], want[32];

		fmt_index_name(i, name);
		p = tu_path("%s/%s", sd, name);
		ck_assert_int_eq(tu_read_file(p, &buf, &len), 0);
		ck_assert_int_eq(
			fmt_index_decode(buf, len, &ix, err, sizeof(err)), 0);
		ck_assert_uint_eq(count_refs(&ix, NULL),
				  FROZEN_BYTES / (64u << 10));
		ck_assert_uint_eq(ix.nrefs, 1 + i);
		for (size_t k = 0; k < ix.nrefs; k++) {
			fmt_shard_name(i, ix.refs[k].file, want);
			ck_assert_str_eq(ix.refs[k].name, want);
			ck_assert_uint_eq(ix.refs[k].step, 1);
		}
		fmt_index_free(&ix);
		free(buf);
		free(p);
	}
	free(sd);
	ck_assert_msg(verify(dir, 2, why, sizeof(why)) == 0, "%s", why);
	for (uint32_t i = 0; i < 2; i++)
		ckpt_close(h[i]);
	ckpt_close(coord);
}
END_TEST

/* A base whose referenced bytes were deleted behind the library's back is
 * not used: the next save is written in full and commits. */
START_TEST(test_broken_base)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	fmt_index ix;
	char *sd;

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	sd = tu_step_dir(dir, 1);
	ck_assert_int_eq(tu_rm_rf(sd), 0);
	free(sd);
	save_step(c, 3, 0);
	ckpt_close(c);
	load_index(dir, 3, &ix);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);
	check_step(dir, 3);
}
END_TEST

/* keep_last 1: step 3 refers to step 1, which is kept; step 2 (referred
 * to by nobody kept) goes. ckptctl's gc is the same eng_gc_run. */
START_TEST(test_retention_keeps_refs)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 1);

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	save_step(c, 3, 0);
	ckpt_close(c);
	ck_assert(step_committed(dir, 1));
	ck_assert(!step_committed(dir, 2));
	ck_assert(step_committed(dir, 3));
	/* ckpt_list (ckptctl ls: "kept: referenced by 3") */
	{
		ckpt_step_info *st = NULL;
		size_t n = 0;

		c = open_dedup(dir, 0, 0);
		ck_assert_int_eq(ckpt_list(c, &st, &n), 0);
		ck_assert_uint_eq(n, 2);
		ck_assert_uint_eq(st[0].step, 1);
		ck_assert_uint_eq(st[0].referenced_by, 3);
		ck_assert_uint_eq(st[1].referenced_by, 0);
		ckpt_free(st);
		ckpt_close(c);
	}
	check_step(dir, 3);
	ck_assert_msg(verify(dir, 3, why, sizeof(why)) == 0, "%s", why);
}
END_TEST

struct gc_order {
	const char *dir;
	int checked, bad;
};

static void gc_fn(void *arg, uint64_t step, int committed, uint64_t bytes)
{
	struct gc_order *o = arg;

	(void)committed;
	(void)bytes;
	/* when step 1 goes, step 2 (which refers to it) no longer exists */
	if (step == 1) {
		o->checked = 1;
		o->bad = step_committed(o->dir, 2);
	}
}

/* gc removing a referring step and its target never leaves, at any
 * moment, a committed step whose refs are gone. */
START_TEST(test_gc_order)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	struct gc_order o = { dir, 0, 0 };
	ckpt_gc_report rep;
	tu_set set;
	uint64_t shape[1] = { 4096 };

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	/* step 3 shares nothing: steps 1 and 2 are free to go */
	tu_set_init(&set);
	tu_set_add(&set, "other", CKPT_U8, 1, shape, 77);
	ck_assert_int_eq(tu_save(c, 3, &set), 0);
	tu_set_free(&set);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, gc_fn, &o, &rep), 0);
	ckpt_close(c);
	ck_assert_uint_eq(rep.steps_removed, 2);
	ck_assert(o.checked);
	ck_assert_msg(!o.bad, "step 1 removed while step 2 was committed");
}
END_TEST

/* verify names a missing ref; reads fail the same way. */
START_TEST(test_verify_missing_ref)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	char *sd, *p;
	int rc;

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	sd = tu_step_dir(dir, 1);
	p = tu_path("%s/h00000-f000.shard", sd);
	ck_assert_int_eq(unlink(p), 0);
	free(p);
	free(sd);
	rc = verify(dir, 2, why, sizeof(why));
	ck_assert_int_eq(rc, CKPT_E_CORRUPT);
	ck_assert_msg(strstr(why, "step 2 refers to step 1/h00000-f000.shard: "
				  "missing"),
		      "%s", why);
}
END_TEST

/* Copies (restore to a directory, push) never make a dangling step: a
 * step with refs is copied only where its refs are committed. */
START_TEST(test_copy)
{
	const char *dir = tu_tmpdir();
	char *d2 = tu_path("%s/copy", dir);
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	ckpt_reader *r1 = NULL, *r2 = NULL;
	uint64_t rs[2] = { 99, 99 };
	int rc;

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	ck_assert_int_eq(ckpt_reader_open(&r1, dir, 1, NULL), 0);
	ck_assert_int_eq(ckpt_reader_open(&r2, dir, 2, NULL), 0);
	/* what ckptctl copies first: step 1 for step 2, nothing for 1 */
	ck_assert_uint_eq(ckpt_reader_ref_steps(r1, NULL, 0), 0);
	ck_assert_uint_eq(ckpt_reader_ref_steps(r2, NULL, 0), 1);
	ck_assert_uint_eq(ckpt_reader_ref_steps(r2, rs, 2), 1);
	ck_assert_uint_eq(rs[0], 1);
	ck_assert_uint_eq(rs[1], 99); /* untouched past the count */
	rc = ckpt_reader_copy(r2, d2, NULL, NULL);
	ck_assert_msg(rc == CKPT_E_NOTFOUND, "%d %s", rc,
		      ckpt_reader_errmsg(r2));
	ck_assert(!step_committed(d2, 2));
	ck_assert_int_eq(ckpt_reader_copy(r1, d2, NULL, NULL), 0);
	rc = ckpt_reader_copy(r2, d2, NULL, NULL);
	ck_assert_msg(rc == 0, "%d %s", rc, ckpt_reader_errmsg(r2));
	ckpt_reader_close(r1);
	ckpt_reader_close(r2);
	check_step(d2, 2);
	ck_assert_msg(verify(d2, 2, why, sizeof(why)) == 0, "%s", why);
	free(d2);
}
END_TEST

/* Push (a copy to gs://) of deduplicated steps: step 2 only after step
 * 1 is committed in the bucket, and then without its frozen bytes; it
 * reads back and verifies from the bucket, and the bucket's gc keeps step
 * 1 while step 2 refers to it. A bucket that cannot be asked is an error
 * of its own, not "copy step 1 there first". */
START_TEST(test_push_gcs)
{
	const char *dir = tu_tmpdir(), *dst = "gs://dedup/run";
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	ckpt_reader *r1 = NULL, *r2 = NULL, *r3 = NULL;
	ckpt_step_info *li = NULL;
	ckpt_gc_report rep;
	ckpt_settings s;
	tu_server srv;
	size_t n = 0;
	char *url;
	int rc;

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	ck_assert_int_eq(ckpt_reader_open(&r1, dir, 1, NULL), 0);
	ck_assert_int_eq(ckpt_reader_open(&r2, dir, 2, NULL), 0);

	setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1", 1);
	setenv("CKPT_GCS_DEADLINE", "1", 1);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc < 0 && rc != CKPT_E_NOTFOUND &&
			      !strstr(ckpt_reader_errmsg(r2), "first"),
		      "%d %s", rc, ckpt_reader_errmsg(r2));
	unsetenv("CKPT_GCS_DEADLINE");

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc == CKPT_E_NOTFOUND &&
			      strstr(ckpt_reader_errmsg(r2),
				     "copy step 1 there first"),
		      "%d %s", rc, ckpt_reader_errmsg(r2));
	ck_assert_int_eq(ckpt_reader_open(&r3, dst, 2, NULL), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_reader_copy(r1, dst, NULL, NULL), 0);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc == 0, "%d %s", rc, ckpt_reader_errmsg(r2));
	ckpt_reader_close(r1);
	ckpt_reader_close(r2);
	check_step(dst, 1);
	check_step(dst, 2);

	tu_settings(&s);
	ck_assert_int_eq(ckpt_open(&c, dst, &s), 0);
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 2);
	/* the frozen megabyte is stored once, in step 1 */
	ck_assert_msg(li[1].stored_bytes < li[0].stored_bytes / 4,
		      "step 2 stores %llu bytes, step 1 %llu",
		      (unsigned long long)li[1].stored_bytes,
		      (unsigned long long)li[0].stored_bytes);
	ck_assert_uint_eq(li[0].referenced_by, 2);
	ckpt_free(li);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, &rep), 0);
	ck_assert_uint_eq(rep.steps_removed, 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(dst, 2);
	/* the bytes step 2 refers to are checked in the bucket too */
	url = tu_path("%s/storage/v1/b/dedup/o/run%%2Fstep-%020d%%2F"
		      "h00000-f000.shard", srv.url, 1);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	ck_assert_int_ne(verify(dst, 2, why, sizeof(why)), 0);
	ck_assert_msg(strstr(why, "step 2 refers to step 1/h00000-f000.shard"
				  ": missing"),
		      "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
}
END_TEST

/* c lists steps 1, 2, 3, and steps 2 and 3 store under a quarter of
 * step 1's bytes (the frozen part is stored once, in step 1). */
static void check_three_steps(ckpt *c)
{
	ckpt_step_info *li = NULL;
	size_t n = 0;

	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_msg(li[1].stored_bytes < li[0].stored_bytes / 4 &&
			      li[2].stored_bytes < li[0].stored_bytes / 4,
		      "steps 2, 3 store %llu, %llu bytes, step 1 %llu",
		      (unsigned long long)li[1].stored_bytes,
		      (unsigned long long)li[2].stored_bytes,
		      (unsigned long long)li[0].stored_bytes);
	ckpt_free(li);
}

static ckpt *open_remote(const char *dir, const char *remote)
{
	ckpt_settings s;
	ckpt *c = NULL;
	int rc;

	tu_settings(&s);
	s.flags |= CKPT_F_DEDUP;
	s.remote = remote;
	rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "ckpt_open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

static void upload_wait(ckpt *c)
{
	int rc = ckpt_upload_wait(c, 60000);

	ck_assert_msg(rc == 0, "upload: %d %s", rc, ckpt_errmsg(c));
}

/* A directory with a remote. Its base not committed in the bucket (every
 * upload fails): the next save is written in full. Once this handle has
 * committed the base in the bucket, the frozen chunks are neither written
 * nor uploaded again, and the bucket's copy of the step refers to the
 * bucket's base, reads back and verifies there. After a restart, the
 * bucket's copy of the newest step serves as the base at once, unless the
 * bucket no longer has it committed. */
START_TEST(test_remote)
{
	const char *dir = tu_tmpdir(), *rem = "gs://dedup/both";
	char *d2 = tu_path("%s/dead", dir), *d1 = tu_path("%s/live", dir);
	ckpt_settings s;
	tu_server srv;
	fmt_index ix;
	uint64_t rs = 0;
	char *url;
	ckpt *c;

	setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1", 1);
	setenv("CKPT_GCS_DEADLINE", "1", 1);
	c = open_remote(d2, "gs://dedup/dead");
	save_step(c, 1, 0);
	ck_assert_int_ne(ckpt_upload_wait(c, 60000), 0);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	ckpt_close(c);
	unsetenv("CKPT_GCS_DEADLINE");
	/* the restart's question to a bucket that does not answer (retried
	 * for the default 600 s) does not hold up ckpt_close */
	{
		double t0;

		c = open_remote(d2, "gs://dedup/dead");
		usleep(500 * 1000); /* the upload thread is asking */
		t0 = tu_now_s();
		ckpt_close(c);
		ck_assert_msg(tu_now_s() - t0 < 60, "close took %.0f s",
			      tu_now_s() - t0);
	}
	load_index(d2, 2, &ix);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);
	check_step(d2, 2);

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	c = open_remote(d1, rem);
	save_step(c, 1, 0);
	upload_wait(c);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	ck_assert_uint_eq(sink_chunks(c, 1), 1);
	upload_wait(c);
	save_step(c, 3, 0);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	load_index(d1, 3, &ix);
	ck_assert_uint_eq(count_refs(&ix, &rs), FROZEN_BYTES / (64u << 10));
	ck_assert_uint_eq(rs, 1);
	fmt_index_free(&ix);
	for (uint64_t st = 1; st <= 3; st++) {
		check_step(rem, st);
		ck_assert_msg(verify(rem, st, why, sizeof(why)) == 0, "%s",
			      why);
	}
	tu_settings(&s);
	ck_assert_int_eq(ckpt_open(&c, rem, &s), 0);
	/* the frozen megabyte is in the bucket once, in step 1 */
	check_three_steps(c);
	ck_assert_int_eq(ckpt_close(c), 0);

	/* a restart: the bucket holds step 3, the same, so step 4 refers
	 * to it at once; after step 4's COMMIT is removed from the bucket,
	 * step 5 is sent in full */
	c = open_remote(d1, rem);
	upload_wait(c);
	save_step(c, 4, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	ck_assert_uint_eq(sink_chunks(c, 1), 1);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	url = tu_path("%s/storage/v1/b/dedup/o/both%%2Fstep-%020d%%2FCOMMIT",
		      srv.url, 4);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	c = open_remote(d1, rem);
	upload_wait(c);
	save_step(c, 5, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(rem, 5);
	ck_assert_msg(verify(rem, 5, why, sizeof(why)) == 0, "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
	free(d1);
	free(d2);
}
END_TEST

/* A gs:// root: the handle refers to the step it committed last, so steps
 * 2 and 3 send one chunk of 17 and store a fraction of step 1 in the
 * bucket; the first save after opening again is written in full. A base
 * removed from the bucket since (its COMMIT deleted) fails the next save
 * at commit, naming it, and the save after that is written in full. */
START_TEST(test_gcs_root)
{
	const char *rem = "gs://dedup/root";
	tu_server srv;
	char *url;
	ckpt *c;
	int rc;

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	c = open_dedup(rem, CKPT_F_DEDUP, 0);
	save_step(c, 1, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	save_step(c, 3, 1);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	check_three_steps(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	for (uint64_t st = 1; st <= 3; st++) {
		check_step(rem, st);
		ck_assert_msg(verify(rem, st, why, sizeof(why)) == 0, "%s",
			      why);
	}

	c = open_dedup(rem, CKPT_F_DEDUP, 0);
	save_step(c, 4, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	url = tu_path("%s/storage/v1/b/dedup/o/root%%2Fstep-%020d%%2FCOMMIT",
		      srv.url, 4);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	{
		tu_set set;
		ckpt_tensor *v;

		make_state(&set, 5);
		v = calloc(set.n, sizeof(*v));
		tu_set_view(&set, v);
		rc = ckpt_save(c, 5, v, set.n);
		if (rc == 0)
			rc = ckpt_wait(c);
		ck_assert_msg(rc < 0 && strstr(ckpt_errmsg(c), "step 4"),
			      "save 5 on a removed base: %d %s", rc,
			      ckpt_errmsg(c));
		free(v);
		tu_set_free(&set);
	}
	save_step(c, 6, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(rem, 6);
	ck_assert_msg(verify(rem, 6, why, sizeof(why)) == 0, "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
}
END_TEST

/* Format: version 2 documents round-trip; version 1 cannot carry refs;
 * a chunk beyond files + refs and a ref to a newer step are corrupt. */
START_TEST(test_format_v2)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	fmt_index ix, back;
	fmt_commit cm;
	uint8_t *buf;
	size_t len;
	char err[512];

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	load_index(dir, 2, &ix);
	ck_assert_int_eq(fmt_index_encode(&ix, &buf, &len), 0);
	ck_assert_int_eq(fmt_index_decode(buf, len, &back, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(back.nrefs, ix.nrefs);
	ck_assert_mem_eq(back.chunks, ix.chunks,
			 ix.nchunks * sizeof(*ix.chunks));
	fmt_index_free(&back);
	free(buf);
	ix.version = 1;
	ck_assert_int_eq(fmt_index_encode(&ix, &buf, &len), -EINVAL);
	ix.version = 2;
	ix.refs[0].step = 2;
	ck_assert_int_eq(fmt_index_encode(&ix, &buf, &len), -EINVAL);
	ix.refs[0].step = 1;
	ix.chunks[0].file = (uint32_t)(ix.nfiles + ix.nrefs);
	ck_assert_int_eq(fmt_index_encode(&ix, &buf, &len), 0);
	ck_assert_int_eq(fmt_index_decode(buf, len, &back, err, sizeof(err)),
			 CKPT_E_CORRUPT);
	free(buf);
	fmt_index_free(&ix);
	load_commit(dir, 2, &cm);
	ck_assert_uint_eq(cm.nrefs, 1);
	cm.version = 1;
	ck_assert_int_eq(fmt_commit_encode(&cm, &buf, &len), -EINVAL);
	fmt_commit_free(&cm);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("dedup");
	TCase *tc = tu_tcase("dedup", 120);

	tcase_add_loop_test(tc, test_frozen_refs, 0, 2);
	tcase_add_test(tc, test_setting);
	tcase_add_test(tc, test_restart);
	tcase_add_test(tc, test_h128_guard);
	tcase_add_test(tc, test_sinks);
	tcase_add_test(tc, test_commit_checks_refs);
	tcase_add_test(tc, test_multihost);
	tcase_add_test(tc, test_broken_base);
	tcase_add_test(tc, test_retention_keeps_refs);
	tcase_add_test(tc, test_gc_order);
	tcase_add_test(tc, test_verify_missing_ref);
	tcase_add_test(tc, test_copy);
	tcase_add_test(tc, test_push_gcs);
	tcase_add_test(tc, test_remote);
	tcase_add_test(tc, test_gcs_root);
	tcase_add_test(tc, test_format_v2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main(suite());
}
