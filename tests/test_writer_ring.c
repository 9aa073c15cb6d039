/*
 * test_writer_ring.c - a save whose io_uring stops completing writes.
 *
 * The save writer waits until every buffer of a save is back; a write the
 * kernel takes and never completes would hang the save for good. The
 * uring_submit hook points the first pending writes at the write end of a
 * full pipe (off -1), so the kernel parks them until they are cancelled;
 * the writer must notice (stall time shortened to 300 ms) and:
 *   - stall: cancel them, write them again with pwrite, commit a step
 *     that reads back right, and save again (with pwrite) on that handle;
 *   - no cancel: the cancel is turned into a NOP, the parked writes never
 *     come back: that save fails ("did not complete"), the step committed
 *     before stays latest and verifies, and the next save succeeds.
 * Without the stall guard both hang (Check's timeout fails them).
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];
static int pipe_fd[2] = { -1, -1 };
static atomic_int stall_left; /* writes still to park in the pipe */
static atomic_int parked;
static atomic_int no_cancel; /* the writer's cancel becomes a NOP */

static int h_submit(struct io_uring *ring)
{
	for (unsigned i = ring->sq.sqe_head; i != ring->sq.sqe_tail; i++) {
		struct io_uring_sqe *sqe =
			&ring->sq.sqes[i & *ring->sq.kring_mask];

		if (tu_sqe_cancel_to_nop(sqe, atomic_load(&no_cancel)))
			continue;
		if ((sqe->opcode != IORING_OP_WRITE &&
		     sqe->opcode != IORING_OP_WRITE_FIXED) ||
		    atomic_load(&stall_left) <= 0)
			continue;
		atomic_fetch_sub(&stall_left, 1);
		atomic_fetch_add(&parked, 1);
		/* a plain write of the same bytes into the full pipe */
		sqe->opcode = IORING_OP_WRITE;
		sqe->buf_index = 0;
		sqe->fd = pipe_fd[1];
		sqe->off = (uint64_t)-1;
	}
	return io_uring_submit(ring);
}

static const eng_io hooks = {
	.uring_submit = h_submit,
};

/* A pipe whose write end blocks: one page, full. */
static void pipe_full(void)
{
	char junk[4096];
	int fl;

	ck_assert_int_eq(pipe(pipe_fd), 0);
	(void)fcntl(pipe_fd[1], F_SETPIPE_SZ, 4096);
	fl = fcntl(pipe_fd[1], F_GETFL);
	ck_assert_int_ge(fl, 0);
	ck_assert_int_eq(fcntl(pipe_fd[1], F_SETFL, fl | O_NONBLOCK), 0);
	memset(junk, 0x5a, sizeof(junk));
	while (write(pipe_fd[1], junk, sizeof(junk)) > 0)
		;
	while (write(pipe_fd[1], junk, 1) > 0)
		;
	ck_assert_int_eq(errno, EAGAIN);
	ck_assert_int_eq(fcntl(pipe_fd[1], F_SETFL, fl), 0);
}

static void step_set(tu_set *set, uint64_t seed)
{
	uint64_t a[2] = { 512, 1024 }, b[1] = { 300000 }, c[1] = { 7000 };

	tu_set_init(set);
	tu_set_add(set, "w", CKPT_BF16, 2, a, seed);
	tu_set_add(set, "rand", CKPT_U8, 1, b, seed + 1);
	tu_set_add(set, "f", CKPT_F32, 1, c, seed + 2);
}

static void setup(void)
{
	/* a parked write failing on a closed pipe must not kill us */
	signal(SIGPIPE, SIG_IGN);
	pipe_full();
	eng_writer_stall_ms_set(300);
	atomic_store(&stall_left, 0);
	atomic_store(&parked, 0);
	atomic_store(&no_cancel, 0);
	eng_io_set(&hooks);
}

static void teardown(void)
{
	eng_io_set(NULL);
	eng_writer_stall_ms_set(0);
	close(pipe_fd[0]);
	close(pipe_fd[1]);
}

/* Small chunks, so a save has many writes in the ring at once. */
static ckpt *open_handle(const char *dir)
{
	ckpt_settings s;
	ckpt *c = NULL;

	tu_settings(&s);
	s.chunk_bytes = 64 << 10;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	return c;
}

static void check_step(const char *dir, uint64_t step, const tu_set *set)
{
	int rc = tu_check_root(dir, step, set, why, sizeof(why));

	ck_assert_msg(rc == 0, "step %llu: %s", (unsigned long long)step, why);
}

START_TEST(test_stall)
{
	const char *dir = tu_tmpdir();
	tu_set set, set2;
	eng_io_stats st;
	ckpt *c;
	int rc;

	if (!tu_uring_works())
		TU_SKIP("no io_uring here");
	c = open_handle(dir);
	step_set(&set, 1);
	step_set(&set2, 11);
	atomic_store(&stall_left, 3);
	rc = tu_save(c, 1, &set);
	ck_assert_msg(rc == 0, "save with a stalled ring: %d %s", rc,
		      ckpt_errmsg(c));
	eng_io_stats_get(c, &st);
	if (st.uring_writes == 0) { /* the handle found no ring itself */
		ckpt_close(c);
		tu_set_free(&set);
		tu_set_free(&set2);
		TU_SKIP("the save used no io_uring");
	}
	ck_assert_int_eq(atomic_load(&parked), 3);
	ck_assert_uint_eq(st.uring_stalls, 1);
	ck_assert_uint_gt(st.pwrite_writes, 0);
	fprintf(stderr, "after the stall: %s\n", ckpt_errmsg(c));
	ck_assert_msg(strstr(ckpt_errmsg(c), "pwrite"),
		      "no note of the stall: %s", ckpt_errmsg(c));
	check_step(dir, 1, &set);
	/* the handle goes on with pwrite */
	rc = tu_save(c, 2, &set2);
	ck_assert_msg(rc == 0, "save after a stall: %d %s", rc, ckpt_errmsg(c));
	eng_io_stats_get(c, &st);
	ck_assert_uint_eq(st.uring_stalls, 1);
	check_step(dir, 2, &set2);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
	tu_set_free(&set2);
}
END_TEST

START_TEST(test_no_cancel)
{
	const char *dir = tu_tmpdir();
	tu_set set, set2, set3;
	eng_io_stats st;
	uint64_t latest = 0;
	char *step2;
	ckpt *c;
	int rc;

	if (!tu_uring_works())
		TU_SKIP("no io_uring here");
	c = open_handle(dir);
	step_set(&set, 1);
	step_set(&set2, 11);
	step_set(&set3, 21);
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	eng_io_stats_get(c, &st);
	if (st.uring_writes == 0) {
		ckpt_close(c);
		tu_set_free(&set);
		tu_set_free(&set2);
		tu_set_free(&set3);
		TU_SKIP("the save used no io_uring");
	}
	atomic_store(&no_cancel, 1);
	atomic_store(&stall_left, 3);
	rc = tu_save(c, 2, &set2);
	ck_assert_msg(rc != 0, "a save with writes that never came back "
			       "succeeded");
	ck_assert_msg(strstr(ckpt_errmsg(c), "did not complete"),
		      "save 2 failed with: %d %s", rc, ckpt_errmsg(c));
	fprintf(stderr, "save 2: %s\n", ckpt_errmsg(c));
	ck_assert_int_eq(atomic_load(&parked), 3);
	eng_io_stats_get(c, &st);
	ck_assert_uint_eq(st.uring_stalls, 1);
	/* step 1 untouched, still the newest; step 2 left nothing */
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_uint_eq(latest, 1);
	check_step(dir, 1, &set);
	step2 = tu_path("%s/step-%020llu", dir, 2ull);
	ck_assert_msg(access(step2, F_OK) != 0, "%s is still there", step2);
	free(step2);
	/* and the handle saves again, with pwrite */
	rc = tu_save(c, 3, &set3);
	ck_assert_msg(rc == 0, "save after the failed one: %d %s", rc,
		      ckpt_errmsg(c));
	check_step(dir, 3, &set3);
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_uint_eq(latest, 3);
	/* the ring (and the parked writes) go before the pipe does */
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
	tu_set_free(&set2);
	tu_set_free(&set3);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("writer_ring");
	TCase *t = tu_tcase("ring", 60);

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, test_stall);
	tcase_add_test(t, test_no_cancel);
	suite_add_tcase(s, t);
	return tu_main(s);
}
