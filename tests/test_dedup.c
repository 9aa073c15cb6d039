/*
 * test_dedup.c - unchanged chunks are neither rewritten nor sent to a sink
 * (dedup.c, format version 2, SPEC.md section 16).
 *
 * The state is fine-tuning shaped: a large "frozen" tensor first (the same
 * bytes at every step) and a small "head" that changes. Each safety rule
 * of the design has a case that fails without it: the 128-bit hash guard,
 * a handle with another sink does not refer, commit checks that refs are
 * committed, retention and gc keep referenced steps, gc's removal order,
 * verify names a missing ref, copies refuse to produce a dangling step.
 * The rules with Cloud Storage (a directory with a remote refers only to
 * a base its upload committed in the bucket, a gs:// root to the step it
 * committed last, pushes) are in test_dedup_gcs.c; helpers in tu_dedup.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tu_dedup.h"

static char why[1024];

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
	tcase_add_test(tc, test_format_v2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main(suite());
}
