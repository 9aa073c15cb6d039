/*
 * test_crash.c - crash consistency.
 *
 * 1. A child process saves steps in a loop (a few MiB each, codec varying
 *    with the step, retention on) and is SIGKILLed after a random delay
 *    (0..50 ms, from a seeded RNG: the seed is printed; CKPT_CRASH_SEED
 *    reproduces a run, CKPT_CRASH_TRIALS sets the number of kills, default
 *    120). After each kill: the newest committed step (if any) opens,
 *    verifies and holds exactly the data of that step (data is a function
 *    of the step); every listed step opens and verifies; ckpt_gc removes
 *    the debris below the newest committed step.
 * 2. Deterministic crashes through the I/O table: the child _exits just
 *    before or just after its Nth file-system operation (open, write,
 *    fsync, rename, unlink, mkdir, ...), for every N of one save, with
 *    io_uring and with plain pwrite (where the crash can also tear the
 *    write in half). Every point of the commit sequence is hit. A third
 *    case saves with CKPT_F_DEDUP and "w" the same at every step, so each
 *    step refers to an older one and retention's removals (which must
 *    keep referenced steps and drop referring COMMITs first) are crashed
 *    at every point too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];

/* ---- step content: fixed base data rotated by a step-dependent amount
 * (cheap to produce, different everywhere for every step) ---- */

struct base {
	const char *name;
	int dtype;
	uint64_t n; /* elements */
	uint8_t *data;
	uint64_t nbytes;
};

static struct base big_base[3] = {
	{"layer.w", CKPT_BF16, 1 << 20, NULL, 0},  /* 2 MiB */
	{"opt.m", CKPT_F32, 1 << 17, NULL, 0},     /* 512 KiB */
	{"rng.state", CKPT_U8, 300001, NULL, 0},   /* random, stored raw */
};
static struct base small_base[3] = {
	{"w", CKPT_BF16, 100000, NULL, 0},
	{"b", CKPT_F32, 20000, NULL, 0},
	{"s", CKPT_U8, 30001, NULL, 0},
};

static void init_base(struct base *b, int n)
{
	for (int i = 0; i < n; i++) {
		if (b[i].data)
			continue;
		b[i].nbytes = b[i].n * ckpt_dtype_size(b[i].dtype);
		b[i].data = malloc(b[i].nbytes);
		tu_fill_dtype(b[i].dtype, b[i].data, b[i].nbytes, 1000 + i);
	}
}

/* dedup case: b[0] is not rotated (frozen, the same bytes every step) */
static int frozen_first;

static void step_set(tu_set *set, const struct base *b, int n, uint64_t step)
{
	tu_set_init(set);
	for (int i = 0; i < n; i++) {
		uint64_t shape[1] = {b[i].n};
		tu_tensor *t = tu_set_add_nofill(set, b[i].name, b[i].dtype, 1,
						 shape);
		size_t es = ckpt_dtype_size(b[i].dtype);
		uint64_t rot = (step * 4099 % b[i].n) * es;

		if (frozen_first && i == 0)
			rot = 0;
		memcpy(t->data, b[i].data + rot, b[i].nbytes - rot);
		memcpy((uint8_t *)t->data + (b[i].nbytes - rot), b[i].data, rot);
	}
}

/* ---- checks after a crash ---- */

static ckpt *lister(const char *root)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ckpt *c = NULL;
	int rc = ckpt_open(&c, root, &s);
	ck_assert_msg(rc == 0, "open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

static int is_tmp(const char *name)
{
	size_t l = strlen(name);
	return l > 4 && !strcmp(name + l - 4, ".tmp");
}

/* Returns the newest committed step (0 if none). */
static uint64_t check_after_crash(const char *root, const struct base *b,
				  int nb, const char *ctx)
{
	ckpt *c = lister(root);
	ckpt_step_info *li;
	size_t n;
	int rc = ckpt_list(c, &li, &n);
	ck_assert_msg(rc == 0, "%s: list: %d %s", ctx, rc, ckpt_errmsg(c));
	uint64_t latest = 0;
	rc = ckpt_latest(c, &latest);
	if (n == 0) {
		ck_assert_msg(rc == CKPT_E_NOTFOUND, "%s: latest %d with no steps",
			      ctx, rc);
		ckpt_reader *r = NULL;
		rc = ckpt_reader_open(&r, root, CKPT_LATEST, NULL);
		ck_assert_msg(rc == CKPT_E_NOTFOUND, "%s: reader_open %d", ctx, rc);
		latest = 0;
	} else {
		ck_assert_msg(rc == 0, "%s: ckpt_latest: %d", ctx, rc);
		ck_assert_msg(latest == li[n - 1].step, "%s: latest %llu, newest "
			      "listed %llu", ctx, (unsigned long long)latest,
			      (unsigned long long)li[n - 1].step);
		/* the newest: exact content */
		tu_set set;
		step_set(&set, b, nb, latest);
		rc = tu_check_root(root, CKPT_LATEST, &set, why, sizeof(why));
		tu_set_free(&set);
		ck_assert_msg(rc == 0, "%s: newest step %llu: %s", ctx,
			      (unsigned long long)latest, why);
		/* every listed step is whole */
		for (size_t i = 0; i + 1 < n; i++) {
			step_set(&set, b, nb, li[i].step);
			rc = tu_check_root(root, li[i].step, &set, why,
					   sizeof(why));
			tu_set_free(&set);
			ck_assert_msg(rc == 0, "%s: listed step %llu: %s", ctx,
				      (unsigned long long)li[i].step, why);
		}
	}
	ckpt_free(li);

	/* gc: debris below the newest committed step goes away */
	ckpt_gc_report rep;
	rc = ckpt_gc(c, 0, 0, 0, NULL, NULL, &rep);
	ck_assert_msg(rc == 0, "%s: gc: %d %s", ctx, rc, ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_close(c), 0);
	DIR *d = opendir(root);
	ck_assert_ptr_nonnull(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		uint64_t st;
		char *p = tu_path("%s/%s", root, e->d_name);
		if (is_tmp(e->d_name))
			ck_abort_msg("%s: gc left %s", ctx, e->d_name);
		/* nothing but step directories and the hint may remain */
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
		    strcmp(e->d_name, "latest") &&
		    strncmp(e->d_name, "step-", 5))
			ck_abort_msg("%s: gc left debris %s in the root", ctx,
				     e->d_name);
		if (sscanf(e->d_name, "step-%20llu", (unsigned long long *)&st) == 1 &&
		    latest && st <= latest) {
			char *cm = tu_path("%s/COMMIT", p);
			ck_assert_msg(tu_exists(cm), "%s: gc left uncommitted %s "
				      "(newest committed %llu)", ctx, e->d_name,
				      (unsigned long long)latest);
			free(cm);
			ck_assert_msg(tu_count_suffix(p, ".tmp") == 0,
				      "%s: temp files in committed %s", ctx,
				      e->d_name);
		}
		free(p);
	}
	closedir(d);
	if (latest) {
		tu_set set;
		step_set(&set, b, nb, latest);
		rc = tu_check_root(root, latest, &set, why, sizeof(why));
		tu_set_free(&set);
		ck_assert_msg(rc == 0, "%s: after gc: %s", ctx, why);
	}
	return latest;
}

static uint64_t resolve_next(const char *root)
{
	ckpt_reader *r = NULL;
	uint64_t next = 1;
	if (ckpt_reader_open(&r, root, CKPT_LATEST, NULL) == 0) {
		next = ckpt_reader_step(r) + 1;
		ckpt_reader_close(r);
	}
	return next;
}

/* ---- 1. random SIGKILL ---- */

/* Saves steps until killed, or `count` steps (then exits 0). */
static void saver_loop(const char *root, int count) __attribute__((noreturn));
static void saver_loop(const char *root, int count)
{
	uint64_t step = resolve_next(root);
	for (int done = 0;; done++) {
		if (count && done == count)
			_exit(0);
		ckpt_settings s;
		tu_settings(&s);
		s.staging_bytes = 4u << 20;
		s.chunk_bytes = 256u << 10;
		s.codec = (int)(step % 3);
		s.files_per_host = 1 + (uint32_t)(step % 3);
		s.keep_last = 2;
		if (step % 2)
			s.flags |= CKPT_F_NO_URING;
		ckpt *c = NULL;
		int rc = ckpt_open(&c, root, &s);
		if (rc) {
			fprintf(stderr, "child: open: %s\n", ckpt_errmsg(NULL));
			_exit(3);
		}
		tu_set set;
		step_set(&set, big_base, 3, step);
		rc = tu_save(c, step, &set);
		tu_set_free(&set);
		if (rc) {
			fprintf(stderr, "child: save %llu: %d %s\n",
				(unsigned long long)step, rc, ckpt_errmsg(c));
			_exit(4);
		}
		ckpt_close(c);
		step++;
	}
}

START_TEST(test_sigkill)
{
	const char *root = tu_tmpdir();
	init_base(big_base, 3);
	const char *e = getenv("CKPT_CRASH_TRIALS");
	long trials = e ? atol(e) : 120;
	e = getenv("CKPT_CRASH_SEED");
	uint64_t seed = e ? strtoull(e, NULL, 0)
			  : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	fprintf(stderr, "crash test: seed %llu (CKPT_CRASH_SEED), %ld trials\n",
		(unsigned long long)seed, trials);
	tu_rng g;
	tu_rng_seed(&g, seed);
	/* Calibrate: how long does the child need for start-up plus two
	 * saves here? Kill delays span 0..max(50 ms, 2.5x that), so kills
	 * land everywhere, including after commits, on slow disks too. */
	long cycle_us = 0;
	for (int k = 0; k < 2; k++) { /* the first save in a new root is slow */
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		pid_t cp = fork();
		ck_assert_int_ge(cp, 0);
		if (cp == 0)
			saver_loop(root, 1);
		int cst;
		ck_assert_int_eq(waitpid(cp, &cst, 0), cp);
		ck_assert_msg(WIFEXITED(cst) && WEXITSTATUS(cst) == 0,
			      "calibration child failed (status 0x%x)", cst);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		cycle_us = (t1.tv_sec - t0.tv_sec) * 1000000 +
			   (t1.tv_nsec - t0.tv_nsec) / 1000;
	}
	long max_delay = cycle_us * 3 / 2;
	if (max_delay < 50000)
		max_delay = 50000;
	fprintf(stderr, "crash test: start-up + 1 save take %ld us; kill delays "
			"0..%ld us\n", cycle_us, max_delay);
	uint64_t prev = check_after_crash(root, big_base, 3, "calibration");
	ck_assert_uint_eq(prev, 2);
	uint64_t commits = 0;
	struct timespec ts, te;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	for (long t = 0; t < trials; t++) {
		long delay = (long)tu_rng_below(&g, (uint64_t)max_delay + 1);
		pid_t pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			saver_loop(root, 0);
		usleep((useconds_t)delay);
		kill(pid, SIGKILL);
		int status;
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
			      "seed %llu trial %ld: child ended by itself "
			      "(status 0x%x)", (unsigned long long)seed, t, status);
		char ctx[128];
		snprintf(ctx, sizeof(ctx), "seed %llu trial %ld (delay %ld us)",
			 (unsigned long long)seed, t, delay);
		uint64_t latest = check_after_crash(root, big_base, 3, ctx);
		ck_assert_msg(latest >= prev, "%s: latest went back %llu -> %llu",
			      ctx, (unsigned long long)prev,
			      (unsigned long long)latest);
		commits += latest - prev;
		prev = latest;
	}
	clock_gettime(CLOCK_MONOTONIC, &te);
	fprintf(stderr, "crash test: %llu steps committed over %ld kills in "
			"%ld ms\n", (unsigned long long)commits, trials,
		(long)((te.tv_sec - ts.tv_sec) * 1000 +
		       (te.tv_nsec - ts.tv_nsec) / 1000000));
	/* the kills must not all land before the first commit */
	ck_assert_uint_gt(commits, 0);
}
END_TEST

/* ---- 2. deterministic crash points through the I/O table ---- */

static long crash_at;           /* 0: count only */
static atomic_long points;
static int torn_writes;

static void point(void)
{
	long n = atomic_fetch_add(&points, 1) + 1;
	if (crash_at && n == crash_at)
		_exit(99);
}

static int x_open(const char *path, int flags, mode_t mode)
{
	point();
	int fd = open(path, flags, mode);
	if (fd < 0)
		return -errno;
	point();
	return fd;
}

static ssize_t x_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	long k = atomic_fetch_add(&points, 1) + 1;
	if (crash_at && k == crash_at) {
		if (torn_writes && n > 1) {
			size_t half = n / 2;
			int fl = fcntl(fd, F_GETFL);
			if (fl >= 0 && (fl & O_DIRECT))
				half &= ~(size_t)4095;
			if (half && pwrite(fd, buf, half, off) < 0)
				_exit(98);
		}
		_exit(99);
	}
	ssize_t r = pwrite(fd, buf, n, off);
	return r < 0 ? -errno : r;
}

static long x_write_result(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)off;
	(void)len;
	point();
	return res;
}

static int x_fsync(int fd)
{
	point();
	int r = fsync(fd) ? -errno : 0;
	point();
	return r;
}

static int x_fdatasync(int fd)
{
	point();
	int r = fdatasync(fd) ? -errno : 0;
	point();
	return r;
}

static int x_rename(const char *a, const char *b)
{
	point();
	int r = rename(a, b) ? -errno : 0;
	point();
	return r;
}

static int x_rename_noreplace(const char *a, const char *b)
{
	point();
	int r = renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_NOREPLACE) ? -errno
								      : 0;
	point();
	return r;
}

static int x_unlink(const char *p)
{
	point();
	int r = unlink(p) ? -errno : 0;
	point();
	return r;
}

static int x_mkdir(const char *p, mode_t m)
{
	point();
	int r = mkdir(p, m) ? -errno : 0;
	point();
	return r;
}

static int x_rmdir(const char *p)
{
	point();
	int r = rmdir(p) ? -errno : 0;
	point();
	return r;
}

static const eng_io crash_io = {
	.open = x_open,
	.pwrite = x_pwrite,
	.fsync = x_fsync,
	.fdatasync = x_fdatasync,
	.rename = x_rename,
	.rename_noreplace = x_rename_noreplace,
	.unlink = x_unlink,
	.mkdir = x_mkdir,
	.rmdir = x_rmdir,
	.write_result = x_write_result,
};

/* What a child that completed its save reports: the number of points
 * seen, and the write paths its handle took (eng_io_stats). */
struct save_report {
	long points;
	uint64_t uring_writes, pwrite_writes;
};

/* Child: one save of the next step with a crash at point `at`. Exit codes:
 * 99 crashed at the point, 0 save completed, 10+ failures. Writes a
 * struct save_report to `pfd` when it completes. */
static void one_save(const char *root, long at, uint32_t flags, int pfd)
	__attribute__((noreturn));
static void one_save(const char *root, long at, uint32_t flags, int pfd)
{
	uint64_t step = resolve_next(root);
	crash_at = at;
	torn_writes = 1;
	atomic_store(&points, 0);
	eng_io_set(&crash_io);
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 1u << 20;
	s.flags = flags;
	s.codec = (int)(step % 3);
	s.keep_last = 2; /* retention removal is part of the sequence */
	ckpt *c = NULL;
	int rc = ckpt_open(&c, root, &s);
	if (rc) {
		fprintf(stderr, "child open: %d %s\n", rc, ckpt_errmsg(NULL));
		_exit(10);
	}
	tu_set set;
	step_set(&set, small_base, 3, step);
	rc = tu_save(c, step, &set);
	if (rc) {
		fprintf(stderr, "child save: %d %s\n", rc, ckpt_errmsg(c));
		_exit(11);
	}
	eng_io_stats st;
	eng_io_stats_get(c, &st);
	rc = ckpt_close(c);
	if (rc)
		_exit(12);
	struct save_report rep = {atomic_load(&points), st.uring_writes,
				  st.pwrite_writes};
	if (pfd >= 0 && write(pfd, &rep, sizeof(rep)) != sizeof(rep))
		_exit(13);
	_exit(0);
}

static int run_child(const char *root, long at, uint32_t flags,
		     struct save_report *rep)
{
	int pfd[2];
	ck_assert_int_eq(pipe(pfd), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		one_save(root, at, flags, pfd[1]);
	}
	close(pfd[1]);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	if (rep) {
		memset(rep, 0, sizeof(*rep));
		if (read(pfd[0], rep, sizeof(*rep)) != sizeof(*rep))
			memset(rep, 0, sizeof(*rep));
	}
	close(pfd[0]);
	ck_assert_msg(WIFEXITED(status), "child killed by signal %d at point %ld",
		      WIFSIGNALED(status) ? WTERMSIG(status) : 0, at);
	return WEXITSTATUS(status);
}

START_TEST(test_crash_points)
{
	static const uint32_t flags[3] = {0, CKPT_F_NO_URING, CKPT_F_DEDUP};
	uint32_t fl = flags[_i];
	frozen_first = (fl & CKPT_F_DEDUP) != 0;
	if (!(fl & CKPT_F_NO_URING) && !tu_uring_works())
		TU_SKIP("no io_uring on this machine");
	init_base(small_base, 3);
	const char *root = tu_tmpdir();
	/* two clean steps first, so retention has something to remove; each
	 * must have written through the path this case names */
	long total = 0;
	for (int k = 0; k < 3; k++) {
		struct save_report rep;
		int st = run_child(root, 0, fl, &rep);
		ck_assert_msg(st == 0, "clean save: exit %d", st);
		int pw = (fl & CKPT_F_NO_URING) != 0;
		ck_assert_msg(pw ? rep.uring_writes == 0 && rep.pwrite_writes > 0
				 : rep.uring_writes > 0 && rep.pwrite_writes == 0,
			      "%s case: %llu io_uring writes, %llu pwrites",
			      pw ? "pwrite" : "io_uring",
			      (unsigned long long)rep.uring_writes,
			      (unsigned long long)rep.pwrite_writes);
		total = rep.points;
	}
	uint64_t prev = check_after_crash(root, small_base, 3, "clean");
	ck_assert_uint_eq(prev, 3);
	const char *lab = fl & CKPT_F_DEDUP ? "dedup" :
			  fl ? "pwrite" : "io_uring";
	if (fl & CKPT_F_DEDUP) { /* the steps do refer to older ones */
		ckpt *lc = lister(root);
		ckpt_step_info *li;
		size_t nl;
		ck_assert_int_eq(ckpt_list(lc, &li, &nl), 0);
		ck_assert_uint_gt(nl, 0);
		ck_assert_uint_gt(li[0].referenced_by, li[0].step);
		ckpt_free(li);
		ckpt_close(lc);
	}
	fprintf(stderr, "%s: one save passes %ld crash points\n", lab,
		total);
	ck_assert_int_gt(total, 10);
	long crashed = 0;
	for (long at = 1; at <= total + 2; at++) {
		int st = run_child(root, at, fl, NULL);
		char ctx[96];
		snprintf(ctx, sizeof(ctx), "%s crash at point %ld/%ld",
			 lab, at, total);
		ck_assert_msg(st == 99 || st == 0, "%s: child exit %d", ctx, st);
		crashed += st == 99;
		uint64_t latest = check_after_crash(root, small_base, 3, ctx);
		if (st == 0)
			ck_assert_msg(latest == prev + 1, "%s: completed save "
				      "not latest (%llu)", ctx,
				      (unsigned long long)latest);
		else
			ck_assert_msg(latest == prev || latest == prev + 1,
				      "%s: latest %llu after %llu", ctx,
				      (unsigned long long)latest,
				      (unsigned long long)prev);
		prev = latest;
	}
	ck_assert_int_gt(crashed, total / 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("crash");
	TCase *tc = tu_tcase("crash", 400);
	tcase_add_test(tc, test_sigkill);
	tcase_add_loop_test(tc, test_crash_points, 0, 3);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
