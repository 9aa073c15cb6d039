/*
 * test_borrow.c - borrow mode (CKPT_SAVE_BORROW): the engine reads the
 * caller's memory instead of copying it, and says when it is done.
 *
 * The caller's tensors are "lent" from their own mappings at odd
 * addresses (1..7 bytes past a page start), so unaligned memory is the
 * rule here. Once ckpt_wait_released() returns, every lent byte is
 * overwritten and the mappings are made PROT_NONE: an engine that read
 * them after the release would either fault (the test process dies) or
 * store the poison, which the comparison with the regenerated tensors
 * (tu_check_root: verify + byte compare) catches. The states are larger
 * than the pool, so chunks are still being encoded and written when the
 * release comes. Covered: every codec, tensors spanning chunks and many
 * small ones sharing a chunk, a state much larger than the pool, the
 * poll state and the release wait (timeout 0 while borrowed is not
 * asserted: it depends on timing), a save that fails (step already
 * committed: refused up front, nothing borrowed; a write error: the
 * memory is released and nothing is visible).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];

/* The caller's memory: one mapping per tensor, data at an odd offset. */
typedef struct lent {
	size_t n;
	ckpt_tensor *v;
	uint8_t **map;
	size_t *maplen;
} lent;

static void lend(lent *l, const tu_set *set)
{
	long pg = sysconf(_SC_PAGESIZE);

	l->n = set->n;
	l->v = calloc(set->n ? set->n : 1, sizeof(*l->v));
	l->map = calloc(set->n ? set->n : 1, sizeof(*l->map));
	l->maplen = calloc(set->n ? set->n : 1, sizeof(*l->maplen));
	ck_assert(l->v && l->map && l->maplen);
	tu_set_view(set, l->v);
	for (size_t i = 0; i < set->n; i++) {
		size_t off = 1 + i % 7;
		size_t len = (set->t[i].nbytes + off + (size_t)pg - 1) /
			     (size_t)pg * (size_t)pg;
		void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		ck_assert(m != MAP_FAILED);
		l->map[i] = m;
		l->maplen[i] = len;
		memcpy(l->map[i] + off, set->t[i].data, set->t[i].nbytes);
		l->v[i].data = l->map[i] + off;
	}
}

/* After the release: overwrite, then take every access away. */
static void poison(lent *l)
{
	for (size_t i = 0; i < l->n; i++) {
		memset(l->map[i], 0x5a, l->maplen[i]);
		ck_assert_int_eq(mprotect(l->map[i], l->maplen[i], PROT_NONE),
				 0);
	}
}

static void unlend(lent *l)
{
	for (size_t i = 0; i < l->n; i++)
		munmap(l->map[i], l->maplen[i]);
	free(l->v);
	free(l->map);
	free(l->maplen);
}

static int save_borrow(ckpt *c, uint64_t step, const lent *l)
{
	ckpt_save_opts o;

	ckpt_save_opts_default(&o);
	o.flags = CKPT_SAVE_BORROW;
	return ckpt_save_ex(c, step, l->v, l->n, &o);
}

/*
 * Borrow-saves `set` as `step` and checks the release: the wait returns
 * 0, the state has left STAGING, every byte was read (unless `failing`);
 * then poisons the caller's memory and collects the save (its result is
 * returned; a failing save may also fail in ckpt_save_ex itself).
 */
static int borrow_fail_ok(ckpt *c, uint64_t step, const tu_set *set,
			  int failing)
{
	ckpt_progress p;
	lent l;
	int rc;

	lend(&l, set);
	rc = save_borrow(c, step, &l);
	if (rc && failing) {
		/* failed before it returned: over, nothing borrowed */
		ck_assert_int_eq(ckpt_wait_released(c, 0), 0);
		poison(&l);
		unlend(&l);
		return rc;
	}
	ck_assert_msg(rc == 0, "save_ex borrow: %d %s", rc, ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_wait_released(c, -1), 0);
	ckpt_poll(c, &p);
	ck_assert_int_ne(p.state, CKPT_STATE_STAGING);
	ck_assert_int_ne(p.state, CKPT_STATE_IDLE);
	ck_assert_uint_eq(p.step, step);
	if (!failing) /* every byte was read before the release */
		ck_assert_uint_eq(p.bytes_staged, tu_set_bytes(set));
	poison(&l);
	rc = ckpt_wait(c);
	/* released for good: the wait does not block after it either */
	ck_assert_int_eq(ckpt_wait_released(c, 0), 0);
	unlend(&l);
	return rc;
}

static int borrow_and_poison(ckpt *c, uint64_t step, const tu_set *set)
{
	return borrow_fail_ok(c, step, set, 0);
}

/* Big tensors spanning chunks, small ones sharing chunks, odd sizes. */
static void mixed_set(tu_set *set, uint64_t seed, unsigned mib)
{
	uint64_t big[2] = { 512, 300 + 7 * (uint64_t)mib };
	uint64_t odd[1] = { 100003 };

	tu_set_init(set);
	tu_set_add(set, "big.w", CKPT_BF16, 2, big, seed);
	for (int i = 0; i < 40; i++) {
		char name[32];
		uint64_t sh[1] = { 1 + (uint64_t)i * 37 };

		snprintf(name, sizeof(name), "small.%d", i);
		tu_set_add(set, name, i % 2 ? CKPT_F32 : CKPT_U8, 1, sh,
			   seed + 10 + (uint64_t)i);
	}
	tu_set_add(set, "odd.u8", CKPT_U8, 1, odd, seed + 1);
	for (unsigned i = 0; i < mib; i++) {
		char name[32];
		uint64_t sh[2] = { 256, 2048 + i };

		snprintf(name, sizeof(name), "layer%u.f32", i);
		tu_set_add(set, name, CKPT_F32, 2, sh, seed + 100 + i);
	}
}

static ckpt *open_codec(const char *dir, int codec, uint64_t pool)
{
	ckpt_settings s;
	ckpt *c = NULL;

	tu_settings(&s);
	s.codec = codec;
	s.staging_bytes = pool;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	return c;
}

/* Every codec; the second save on the same handle too. */
START_TEST(test_borrow_codecs)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_codec(dir, _i, 8u << 20);
	tu_set set;

	mixed_set(&set, 7 + (uint64_t)_i, 6);
	for (uint64_t step = 1; step <= 2; step++) {
		int rc = borrow_and_poison(c, step, &set);

		ck_assert_msg(rc == 0, "codec %s step %llu: %d %s",
			      ckpt_codec_name(_i), (unsigned long long)step, rc,
			      ckpt_errmsg(c));
		ck_assert_msg(tu_check_root(dir, step, &set, why,
					    sizeof(why)) == 0,
			      "codec %s: %s", ckpt_codec_name(_i), why);
	}
	/* copying and borrowing saves alternate on one handle */
	ck_assert_int_eq(tu_save(c, 3, &set), 0);
	ck_assert_int_eq(ckpt_wait_released(c, 0), 0);
	ck_assert_int_eq(borrow_and_poison(c, 4, &set), 0);
	ck_assert_msg(tu_check_root(dir, 3, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_msg(tu_check_root(dir, 4, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

/* A state 40 times the pool (two slots of 64 KiB chunks + outputs). */
START_TEST(test_borrow_small_pool)
{
	const char *dir = tu_tmpdir();
	int codec = _i ? CKPT_CODEC_FLOAT : CKPT_CODEC_NONE;
	ckpt *c = open_codec(dir, codec, 512u << 10);
	tu_set set;

	mixed_set(&set, 31, 20);
	ck_assert_uint_gt(tu_set_bytes(&set), 40ull * (512u << 10));
	ck_assert_msg(borrow_and_poison(c, 5, &set) == 0, "%s", ckpt_errmsg(c));
	ck_assert_msg(tu_check_root(dir, 5, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

/* Empty saves and zero-byte tensors: released at once, saved. */
START_TEST(test_borrow_empty)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_codec(dir, CKPT_CODEC_FLOAT, 8u << 20);
	uint64_t zero[1] = { 0 };
	tu_set set;

	tu_set_init(&set);
	ck_assert_int_eq(borrow_and_poison(c, 1, &set), 0);
	tu_set_add(&set, "empty", CKPT_F32, 1, zero, 1);
	ck_assert_int_eq(borrow_and_poison(c, 2, &set), 0);
	ck_assert_msg(tu_check_root(dir, 2, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

/* Failures: refused up front (nothing borrowed: the wait returns at
 * once); failed in the background (a write error): released, the error
 * reported by ckpt_wait, nothing visible, the handle saves again. */
static atomic_int fail_writes;

static long h_write_result(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)off;
	(void)len;
	return atomic_load(&fail_writes) ? -EIO : res;
}

static const eng_io hooks = { .write_result = h_write_result };

START_TEST(test_borrow_failures)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_codec(dir, _i, 1u << 20);
	ckpt_progress p;
	lent l;
	tu_set set;
	int rc;

	mixed_set(&set, 3, 8);
	ck_assert_int_eq(borrow_and_poison(c, 1, &set), 0);
	/* a committed step: refused, nothing borrowed */
	lend(&l, &set);
	ck_assert_int_eq(save_borrow(c, 1, &l), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_wait_released(c, 0), 0);
	unlend(&l);
	/* every write fails: the memory is released, nothing is visible */
	eng_io_set(&hooks);
	atomic_store(&fail_writes, 1);
	rc = borrow_fail_ok(c, 2, &set, 1);
	ck_assert_int_eq(rc, -EIO);
	ck_assert_int_eq(ckpt_poll(c, &p), -EIO);
	ck_assert_int_eq(p.state, CKPT_STATE_FAILED);
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 2, NULL), CKPT_E_NOTFOUND);
	char *sd = tu_step_dir(dir, 2);
	ck_assert_msg(!tu_exists(sd), "%s left behind", sd);
	free(sd);
	atomic_store(&fail_writes, 0);
	eng_io_set(NULL);
	ck_assert_int_eq(borrow_and_poison(c, 2, &set), 0);
	ck_assert_msg(tu_check_root(dir, 2, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_msg(tu_check_root(dir, 1, &set, why, sizeof(why)) == 0, "%s",
		      why);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("borrow");
	TCase *tc = tu_tcase("borrow", 240);

	tcase_add_loop_test(tc, test_borrow_codecs, 0, CKPT_CODEC_COUNT);
	tcase_add_loop_test(tc, test_borrow_small_pool, 0, 2);
	tcase_add_test(tc, test_borrow_empty);
	tcase_add_loop_test(tc, test_borrow_failures, 0, CKPT_CODEC_COUNT);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
