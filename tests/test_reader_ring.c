/*
 * test_reader_ring.c - a reader whose io_uring stops answering.
 *
 * One CI machine hung a verify for good inside io_uring_wait_cqe: reads in
 * the ring, none coming back. These tests make the kernel do exactly that
 * and check that the reader recovers with pread, with the right bytes:
 *   - stall: the uring_submit hook points the pending reads at the read
 *     end of an empty pipe (off -1), so the kernel parks them until they
 *     are cancelled. The reader must notice (stall time shortened to
 *     300 ms), cancel them, read the chunks again and finish; verify
 *     (ordered) and ckpt_read (unordered), a stall in each; and a
 *     verify whose cancel is turned into a NOP, so the reads stay parked
 *     and their buffers must never be reused.
 *   - EAGAIN forever: every ring read comes back -EAGAIN (read_result
 *     hook); the reader must not resubmit forever but pread the chunk.
 * Without the recovery both hang (meson's timeout fails them).
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];
static int pipe_fd[2] = { -1, -1 };
static atomic_int stall_left; /* reads still to park in the pipe */
static atomic_int parked;
static atomic_int eagain_on;
static atomic_int no_cancel; /* the reader's cancel becomes a NOP */
static __thread int in_pread;

static int h_submit(struct io_uring *ring)
{
	for (unsigned i = ring->sq.sqe_head; i != ring->sq.sqe_tail; i++) {
		struct io_uring_sqe *sqe =
			&ring->sq.sqes[i & *ring->sq.kring_mask];

		if (tu_sqe_cancel_to_nop(sqe, atomic_load(&no_cancel)))
			continue;
		if (sqe->opcode != IORING_OP_READ ||
		    atomic_load(&stall_left) <= 0)
			continue;
		atomic_fetch_sub(&stall_left, 1);
		atomic_fetch_add(&parked, 1);
		sqe->fd = pipe_fd[0];
		sqe->off = (uint64_t)-1;
	}
	return io_uring_submit(ring);
}

static ssize_t h_pread(int fd, void *buf, size_t n, off_t off)
{
	in_pread = 1;
	return pread(fd, buf, n, off);
}

static long h_read_result(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)off;
	(void)len;
	if (in_pread) {
		in_pread = 0;
		return res;
	}
	return atomic_load(&eagain_on) ? -EAGAIN : res;
}

static const eng_io hooks = {
	.uring_submit = h_submit,
	.pread = h_pread,
	.read_result = h_read_result,
};

static void step_set(tu_set *set)
{
	tu_set_init(set);
	uint64_t a[2] = { 512, 1024 }, b[1] = { 300000 }, c[1] = { 7000 };
	tu_set_add(set, "w", CKPT_BF16, 2, a, 1);
	tu_set_add(set, "rand", CKPT_U8, 1, b, 2);
	tu_set_add(set, "f", CKPT_F32, 1, c, 3);
}

/* A root with step 1, saved with small chunks so a verify has several
 * reads in the ring at once. */
static const char *make_root(tu_set *set)
{
	const char *dir = tu_tmpdir();
	ckpt_settings s;
	ckpt *c = NULL;

	tu_settings(&s);
	s.chunk_bytes = 64 << 10;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	step_set(set);
	ck_assert_int_eq(tu_save(c, 1, set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	return dir;
}

static ckpt_reader *open_ring_reader(const char *dir)
{
	ckpt_reader *r = NULL;

	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), 0);
	return r;
}

static void setup(void)
{
	ck_assert_int_eq(pipe(pipe_fd), 0);
	eng_reader_stall_ms_set(300);
	atomic_store(&stall_left, 0);
	atomic_store(&parked, 0);
	atomic_store(&eagain_on, 0);
	atomic_store(&no_cancel, 0);
	eng_io_set(&hooks);
}

static void teardown(void)
{
	eng_io_set(NULL);
	eng_reader_stall_ms_set(0);
	close(pipe_fd[0]);
	close(pipe_fd[1]);
}

/* _i 0: the stall hits a verify; 1: a read of every tensor; 2: a verify,
 * and the cancel does nothing: the parked reads never come back, so their
 * buffers must leave the pool (the ring ends with the reader) */
START_TEST(test_stall)
{
	tu_set set;
	const char *dir = make_root(&set);
	ckpt_reader *r;
	eng_reader_io_stats st;
	int rc;

	if (!tu_uring_works()) {
		tu_set_free(&set);
		TU_SKIP("no io_uring here");
	}
	r = open_ring_reader(dir);
	atomic_store(&stall_left, 3);
	atomic_store(&no_cancel, _i == 2);
	if (_i != 1) {
		rc = ckpt_reader_verify(r, NULL, NULL);
		ck_assert_msg(rc == 0, "verify after a stall: %d %s", rc,
			      ckpt_reader_errmsg(r));
	}
	rc = tu_check_set(r, &set, why, sizeof(why));
	ck_assert_msg(rc == 0, "reads after a stall: %s", why);
	eng_reader_io_stats_get(r, &st);
	if (st.uring_reads == 0) { /* the reader found no ring itself */
		ckpt_reader_close(r);
		tu_set_free(&set);
		TU_SKIP("the reader used no io_uring");
	}
	ck_assert_int_gt(atomic_load(&parked), 0);
	ck_assert_uint_eq(st.uring_stalls, 1);
	ck_assert_uint_gt(st.pread_reads, 0);
	/* and the reader goes on with pread, with the right bytes */
	rc = ckpt_reader_verify(r, NULL, NULL);
	ck_assert_msg(rc == 0, "second verify: %d %s", rc,
		      ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
	tu_set_free(&set);
}
END_TEST

START_TEST(test_eagain_forever)
{
	tu_set set;
	const char *dir = make_root(&set);
	ckpt_reader *r;
	eng_reader_io_stats st;
	int rc;

	r = open_ring_reader(dir);
	atomic_store(&eagain_on, 1);
	rc = ckpt_reader_verify(r, NULL, NULL);
	ck_assert_msg(rc == 0, "verify: %d %s", rc, ckpt_reader_errmsg(r));
	rc = tu_check_set(r, &set, why, sizeof(why));
	ck_assert_msg(rc == 0, "reads: %s", why);
	eng_reader_io_stats_get(r, &st);
	ck_assert_uint_eq(st.uring_stalls, 0);
	ck_assert_uint_gt(st.pread_reads, 0);
	ckpt_reader_close(r);
	tu_set_free(&set);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reader_ring");
	TCase *t = tcase_create("ring");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_loop_test(t, test_stall, 0, 3);
	tcase_add_test(t, test_eagain_forever);
	suite_add_tcase(s, t);
	return tu_main(s);
}
