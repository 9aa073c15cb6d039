/*
 * test_faults.c - I/O failures injected through the engine's I/O table
 * (eng_io_set): ENOSPC on the Nth write, EIO on the Nth fsync/fdatasync,
 * EIO on the Nth rename, short writes and reads, read errors; with
 * io_uring and with CKPT_F_NO_URING, with O_DIRECT and CKPT_F_NO_DIRECT.
 *
 * For a fault that hits before the commit record is in place, the save
 * must fail with exactly the injected error and a message, the previous
 * step must stay latest, intact and verifiable, the failed step must not
 * be listed, and the same handle must then save the same step again.
 * A fault after the COMMIT rename (directory fsync, `latest` update) may
 * be reported or not, but the step is then either committed and intact or
 * not listed at all.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];

enum mode { M_NONE, M_WRITE_ERR, M_FSYNC_ERR, M_RENAME_ERR, M_SHORT_WRITE,
	    M_READ_ERR, M_SHORT_READ, M_OPEN_ERR };

static atomic_int mode;
static atomic_long target;
static atomic_int inject_err;
static atomic_long n_writes, n_syncs, n_renames, n_reads, n_creates;
static atomic_int fired, fired_after_commit, commit_done, shorts;

static void reset_counters(void)
{
	atomic_store(&n_writes, 0);
	atomic_store(&n_syncs, 0);
	atomic_store(&n_renames, 0);
	atomic_store(&n_reads, 0);
	atomic_store(&n_creates, 0);
	atomic_store(&fired, 0);
	atomic_store(&fired_after_commit, 0);
	atomic_store(&commit_done, 0);
	atomic_store(&shorts, 0);
}

static void fire(void)
{
	if (!atomic_exchange(&fired, 1))
		atomic_store(&fired_after_commit, atomic_load(&commit_done));
}

static long short_count(int fd, long res)
{
	if (res <= 1)
		return res;
	long h = res / 2;
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_DIRECT)) {
		/* the kernel only ends O_DIRECT transfers on block edges */
		h &= ~4095L;
		if (h == 0)
			return res;
	}
	atomic_fetch_add(&shorts, 1);
	return h;
}

static long h_write_result(int fd, uint64_t off, size_t len, long res)
{
	(void)off;
	(void)len;
	long n = atomic_fetch_add(&n_writes, 1) + 1;
	int m = atomic_load(&mode);
	if (m == M_WRITE_ERR && n == atomic_load(&target)) {
		fire();
		return atomic_load(&inject_err);
	}
	if (m == M_SHORT_WRITE)
		return short_count(fd, res);
	return res;
}

static long h_read_result(int fd, uint64_t off, size_t len, long res)
{
	(void)off;
	(void)len;
	atomic_fetch_add(&n_reads, 1);
	int m = atomic_load(&mode);
	if (m == M_READ_ERR) {
		fire();
		return -EIO;
	}
	if (m == M_SHORT_READ)
		return short_count(fd, res);
	return res;
}

static int sync_hook(int fd, int data)
{
	long n = atomic_fetch_add(&n_syncs, 1) + 1;
	if (atomic_load(&mode) == M_FSYNC_ERR && n == atomic_load(&target)) {
		fire();
		return -EIO;
	}
	int rc = data ? fdatasync(fd) : fsync(fd);
	return rc ? -errno : 0;
}

static int h_fsync(int fd)
{
	return sync_hook(fd, 0);
}

static int h_fdatasync(int fd)
{
	return sync_hook(fd, 1);
}

static int h_rename(const char *from, const char *to)
{
	long n = atomic_fetch_add(&n_renames, 1) + 1;
	if (atomic_load(&mode) == M_RENAME_ERR && n == atomic_load(&target)) {
		fire();
		return -EIO;
	}
	if (rename(from, to))
		return -errno;
	size_t l = strlen(to);
	if (l >= 7 && !strcmp(to + l - 7, "/COMMIT"))
		atomic_store(&commit_done, 1);
	return 0;
}

/* Files created (O_CREAT): shards, indexes, COMMIT, latest temp files. */
static int h_open(const char *path, int flags, mode_t m)
{
	if (flags & O_CREAT) {
		long n = atomic_fetch_add(&n_creates, 1) + 1;
		if (atomic_load(&mode) == M_OPEN_ERR &&
		    n == atomic_load(&target)) {
			fire();
			return atomic_load(&inject_err);
		}
	}
	int fd = open(path, flags, m);
	return fd < 0 ? -errno : fd;
}

static const eng_io hooks = {
	.open = h_open,
	.fsync = h_fsync,
	.fdatasync = h_fdatasync,
	.rename = h_rename,
	.write_result = h_write_result,
	.read_result = h_read_result,
};

static const uint32_t cfg_flags[4] = {0, CKPT_F_NO_URING, CKPT_F_NO_DIRECT,
				      CKPT_F_NO_URING | CKPT_F_NO_DIRECT};
static const char *const cfg_names[4] = {"uring+direct", "pwrite+direct",
					 "uring", "pwrite"};

static void step_set(tu_set *set, uint64_t step)
{
	tu_set_init(set);
	uint64_t a[2] = {256, 512}, b[1] = {100000}, c[1] = {5000};
	tu_set_add(set, "w", CKPT_BF16, 2, a, step);
	tu_set_add(set, "rand", CKPT_U8, 1, b, step + 1000);
	tu_set_add(set, "f", CKPT_F32, 1, c, step + 2000);
}

static ckpt *open_cfg(const char *dir, int cfg)
{
	ckpt_settings s;
	tu_settings(&s);
	s.flags = cfg_flags[cfg];
	s.files_per_host = 2;
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

static int save_step(ckpt *c, uint64_t step)
{
	tu_set set;
	step_set(&set, step);
	int rc = tu_save_async(c, step, &set);
	tu_set_free(&set);
	if (rc)
		return rc;
	return ckpt_wait(c);
}

static int listed(ckpt *c, uint64_t step)
{
	ckpt_step_info *li;
	size_t n;
	int found = 0;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	for (size_t i = 0; i < n; i++)
		found |= li[i].step == step;
	ckpt_free(li);
	return found;
}

static int root_tmp_files(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name);
		n += l > 4 && !strcmp(e->d_name + l - 4, ".tmp");
	}
	if (d)
		closedir(d);
	return n;
}

static void check_step(const char *dir, uint64_t step, const char *ctx)
{
	tu_set set;
	step_set(&set, step);
	int rc = tu_check_root(dir, step, &set, why, sizeof(why));
	tu_set_free(&set);
	ck_assert_msg(rc == 0, "%s: step %llu: %s", ctx,
		      (unsigned long long)step, why);
}

struct counts {
	long writes, syncs, renames, creates;
};

/* Operations of one save of step 2 after a committed step 1. */
static struct counts measure(int cfg)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, cfg);
	atomic_store(&mode, M_NONE);
	eng_io_set(&hooks);
	ck_assert_int_eq(save_step(c, 1), 0);
	reset_counters();
	ck_assert_int_eq(save_step(c, 2), 0);
	struct counts k = {atomic_load(&n_writes), atomic_load(&n_syncs),
			   atomic_load(&n_renames), atomic_load(&n_creates)};
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
	fprintf(stderr, "%s: a save does %ld writes, %ld syncs, %ld renames, "
			"%ld creates\n", cfg_names[cfg], k.writes, k.syncs,
		k.renames, k.creates);
	ck_assert_int_gt(k.writes, 4);
	ck_assert_int_gt(k.syncs, 0);
	ck_assert_int_gt(k.renames, 0);
	return k;
}

static int n_before, n_after, n_after_reported;

/* One fault case on the running root: prev is committed and latest. */
static void fault_case(const char *dir, ckpt *c, uint64_t *prev, int m,
		       long n, int err, const char *what)
{
	char ctx[128];
	snprintf(ctx, sizeof(ctx), "%s #%ld", what, n);
	uint64_t step = *prev + 1;
	reset_counters();
	atomic_store(&inject_err, err);
	atomic_store(&target, n);
	atomic_store(&mode, m);
	int rc = save_step(c, step);
	atomic_store(&mode, M_NONE);
	if (!atomic_load(&fired)) {
		/* fewer operations this time (should not happen) */
		ck_assert_msg(rc == 0, "%s: not fired but rc %d", ctx, rc);
		*prev = step;
		return;
	}
	int after = atomic_load(&fired_after_commit);
	n_before += !after;
	n_after += after;
	n_after_reported += after && rc;
	if (!after) {
		ck_assert_msg(rc == err, "%s: save returned %d (%s), want %d: %s",
			      ctx, rc, ckpt_strerror(rc), err, ckpt_errmsg(c));
		ck_assert_msg(ckpt_errmsg(c)[0], "%s: no message", ctx);
		ck_assert_msg(!listed(c, step), "%s: failed step listed", ctx);
		uint64_t l;
		ck_assert_int_eq(ckpt_latest(c, &l), 0);
		ck_assert_msg(l == *prev, "%s: latest %llu", ctx,
			      (unsigned long long)l);
		ckpt_reader *r = NULL;
		ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
		ck_assert_uint_eq(ckpt_reader_step(r), *prev);
		ckpt_reader_close(r);
		check_step(dir, *prev, ctx);
		ck_assert_msg(root_tmp_files(dir) == 0, "%s: temp file in root",
			      ctx);
		r = NULL;
		ck_assert_int_eq(ckpt_reader_open(&r, dir, step, NULL),
				 CKPT_E_NOTFOUND);
	} else {
		ck_assert_msg(rc == 0 || rc == err, "%s (after commit): rc %d",
			      ctx, rc);
		if (rc == 0)
			ck_assert_msg(listed(c, step), "%s: ok but not listed",
				      ctx);
		if (getenv("CKPT_TEST_VERBOSE"))
			fprintf(stderr, "%s: after commit: rc %d listed %d: %s\n",
				ctx, rc, listed(c, step), rc ? ckpt_errmsg(c) : "");
		if (listed(c, step)) {
			check_step(dir, step, ctx);
			uint64_t l;
			ck_assert_int_eq(ckpt_latest(c, &l), 0);
			ck_assert_uint_eq(l, step);
			*prev = step;
			return;
		}
		check_step(dir, *prev, ctx);
	}
	/* the fault is gone: the same handle saves the same step */
	rc = save_step(c, step);
	ck_assert_msg(rc == 0, "%s: save after the fault: %d %s", ctx, rc,
		      ckpt_errmsg(c));
	ck_assert(listed(c, step));
	check_step(dir, step, ctx);
	check_step(dir, *prev, ctx);
	*prev = step;
}

static void run_fault_series(int cfg, int m, long total, int err,
			     const char *what)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, cfg);
	eng_io_set(&hooks);
	atomic_store(&mode, M_NONE);
	ck_assert_int_eq(save_step(c, 1), 0);
	uint64_t prev = 1;
	char label[96];
	snprintf(label, sizeof(label), "%s %s", cfg_names[cfg], what);
	n_before = n_after = n_after_reported = 0;
	for (long n = 1; n <= total; n++)
		fault_case(dir, c, &prev, m, n, err, label);
	fprintf(stderr, "%s: %d faults before the commit record, %d after "
			"(%d of them reported)\n", label, n_before, n_after,
		n_after_reported);
	ck_assert_int_gt(n_before, 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}

START_TEST(test_enospc_nth_write)
{
	struct counts k = measure(_i);
	run_fault_series(_i, M_WRITE_ERR, k.writes, -ENOSPC, "ENOSPC write");
}
END_TEST

START_TEST(test_eio_nth_write)
{
	struct counts k = measure(_i);
	/* fewer cases: every third write */
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i);
	eng_io_set(&hooks);
	ck_assert_int_eq(save_step(c, 1), 0);
	uint64_t prev = 1;
	for (long n = 1; n <= k.writes; n += 3)
		fault_case(dir, c, &prev, M_WRITE_ERR, n, -EIO, "EIO write");
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}
END_TEST

START_TEST(test_eio_nth_fsync)
{
	struct counts k = measure(_i);
	run_fault_series(_i, M_FSYNC_ERR, k.syncs, -EIO, "EIO fsync");
}
END_TEST

START_TEST(test_eio_nth_rename)
{
	struct counts k = measure(_i);
	run_fault_series(_i, M_RENAME_ERR, k.renames, -EIO, "EIO rename");
}
END_TEST

START_TEST(test_enospc_nth_create)
{
	struct counts k = measure(_i);
	ck_assert_int_gt(k.creates, 2);
	run_fault_series(_i, M_OPEN_ERR, k.creates, -ENOSPC, "ENOSPC create");
}
END_TEST

START_TEST(test_short_writes)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i);
	eng_io_set(&hooks);
	reset_counters();
	atomic_store(&mode, M_SHORT_WRITE);
	for (uint64_t step = 1; step <= 3; step++) {
		int rc = save_step(c, step);
		ck_assert_msg(rc == 0, "%s: save with short writes: %d (%s) %s",
			      cfg_names[_i], rc, ckpt_strerror(rc),
			      ckpt_errmsg(c));
	}
	atomic_store(&mode, M_NONE);
	ck_assert_int_gt(atomic_load(&shorts), 0);
	for (uint64_t step = 1; step <= 3; step++)
		check_step(dir, step, "short writes");
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}
END_TEST

START_TEST(test_read_faults)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i);
	ck_assert_int_eq(save_step(c, 1), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	ckpt_settings rs;
	ckpt_settings_default(&rs);
	rs.flags = cfg_flags[_i];
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, &rs), 0);
	tu_set set;
	step_set(&set, 1);
	eng_io_set(&hooks);
	reset_counters();
	atomic_store(&mode, M_READ_ERR);
	for (size_t i = 0; i < set.n; i++) {
		void *buf = malloc(set.t[i].nbytes);
		int rc = ckpt_read(r, set.t[i].name, buf, set.t[i].nbytes);
		ck_assert_msg(rc == -EIO, "%s: read %s with EIO: %d",
			      cfg_names[_i], set.t[i].name, rc);
		ck_assert_msg(ckpt_reader_errmsg(r)[0], "no message");
		free(buf);
	}
	ck_assert_int_eq(atomic_load(&fired), 1);
	int rc = ckpt_reader_verify(r, NULL, NULL);
	ck_assert_msg(rc == -EIO, "verify with EIO: %d", rc);
	/* short reads are continued */
	atomic_store(&mode, M_SHORT_READ);
	ck_assert_msg(tu_check_set(r, &set, why, sizeof(why)) == 0,
		      "short reads: %s", why);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ck_assert_int_gt(atomic_load(&shorts), 0);
	/* the fault is gone: the same reader works */
	atomic_store(&mode, M_NONE);
	ck_assert_msg(tu_check_set(r, &set, why, sizeof(why)) == 0, "%s", why);
	ckpt_reader_close(r);
	/* opening with EIO on every read fails cleanly */
	atomic_store(&mode, M_READ_ERR);
	r = NULL;
	rc = ckpt_reader_open(&r, dir, 1, &rs);
	atomic_store(&mode, M_NONE);
	if (atomic_load(&n_reads) > 0) {
		ck_assert_int_eq(rc, -EIO);
		ck_assert_ptr_null(r);
	} else {
		ckpt_reader_close(r);
	}
	eng_io_set(NULL);
	tu_set_free(&set);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("faults");
	TCase *tc = tu_tcase("faults", 240);
	tcase_add_loop_test(tc, test_enospc_nth_write, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_write, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_fsync, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_rename, 0, 4);
	tcase_add_loop_test(tc, test_enospc_nth_create, 0, 4);
	tcase_add_loop_test(tc, test_short_writes, 0, 4);
	tcase_add_loop_test(tc, test_read_faults, 0, 4);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
