/*
 * test_powerloss.c - power loss, not only process death.
 *
 * A simulated disk sits in the I/O table (the child saves with
 * CKPT_F_NO_URING, so every write passes through pwrite and is seen before
 * it happens). It remembers, like SQLite's crash test (test6.c):
 *   - per file: every write since the file's last fsync, with the bytes
 *     and the size it replaced (undo records);
 *   - per directory: every entry created, renamed, linked or removed since
 *     that directory's last fsync (removed files are kept alive by a hard
 *     link in a stash directory so they can come back).
 * At crash point N (before the Nth file-system operation of a save +
 * commit + retention) the child makes the disk look as after a power cut
 * and _exits:
 *   variant 0: every unsynced write is lost, every unsynced directory entry
 *              reverts;
 *   variants 1-7: (seeded by N and the variant) each unsynced write is
 *              kept, lost or torn at a 512-byte sector boundary; each
 *              directory keeps a random prefix of its unsynced entry
 *              changes (variant 1) or a random subset of them (2-7: no
 *              ordering between entries is promised without an fsync).
 * The parent then checks: every listed step holds exactly its data and
 * verifies, the newest committed step opens as CKPT_LATEST, no step is
 * listed that the save did not commit, and once the commit had returned
 * (its record's directory entry synced) the new step survives.
 *
 * Removal order (retention, gc): COMMIT is removed and the step directory
 * synced before any shard goes. Checked on the recorded operation sequence
 * and with an injected failure of that sync: the step is then uncommitted
 * debris with all its files, and the next gc removes it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];

#define SECTOR 512
#define MAX_INO 128
#define MAX_UNDO 8192
#define MAX_DOPS 2048
/* variant 0: everything unsynced lost; 1..: seeded random mixes */
#define NVARIANTS 8

/* ---- the simulated disk (state lives in the child) ---- */

struct undo {
	int ino;
	uint64_t off, len, old_size;
	uint8_t *old; /* bytes [off, min(off+len, old_size)) before */
};

struct sim_ino {
	dev_t dev;
	ino_t ino;
	int fd; /* our own O_RDWR descriptor, for undoing writes */
};

enum { D_CREATE, D_RENAME, D_UNLINK, D_MKDIR, D_RMDIR, D_LINK };

struct dop {
	int type;
	dev_t ddev; /* the directory holding the entry */
	ino_t dino;
	int durable;
	char path[512], path2[512], stash[600];
};

static struct sim_ino inos[MAX_INO];
static int ninos;
static struct undo undos[MAX_UNDO];
static int nundo;
static struct dop dops[MAX_DOPS];
static int ndops;
static long crash_at, points;
static int variant, commit_durable, nstash;
static char stash_dir[512];
static tu_rng rng;

/* uniform in [0, n), from the generator's high bits */
static uint64_t pick(uint64_t n)
{
	return (uint64_t)(tu_rng_unit(&rng) * (double)n);
}

static int find_ino(const struct stat *st)
{
	for (int i = 0; i < ninos; i++)
		if (inos[i].dev == st->st_dev && inos[i].ino == st->st_ino)
			return i;
	return -1;
}

static int track_fd(int fd)
{
	struct stat st;
	char p[64];

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return -1;
	int i = find_ino(&st);
	if (i >= 0)
		return i;
	if (ninos == MAX_INO)
		_exit(50);
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	inos[ninos].fd = open(p, O_RDWR | O_CLOEXEC);
	if (inos[ninos].fd < 0)
		_exit(51);
	inos[ninos].dev = st.st_dev;
	inos[ninos].ino = st.st_ino;
	return ninos++;
}

static void dir_of(const char *path, dev_t *dev, ino_t *ino)
{
	char d[512];
	struct stat st;
	const char *s = strrchr(path, '/');

	snprintf(d, sizeof(d), "%.*s", s ? (int)(s - path) : 1, s ? path : ".");
	if (stat(d, &st) < 0)
		_exit(52);
	*dev = st.st_dev;
	*ino = st.st_ino;
}

static struct dop *add_dop(int type, const char *path, const char *path2)
{
	if (ndops == MAX_DOPS)
		_exit(53);
	struct dop *o = &dops[ndops++];
	memset(o, 0, sizeof(*o));
	o->type = type;
	snprintf(o->path, sizeof(o->path), "%s", path);
	if (path2)
		snprintf(o->path2, sizeof(o->path2), "%s", path2);
	dir_of(path2 ? path2 : path, &o->ddev, &o->dino);
	return o;
}

/* Keeps the inode at `path` reachable so the entry can come back. */
static void stash(struct dop *o, const char *path)
{
	snprintf(o->stash, sizeof(o->stash), "%s/%ld.%d", stash_dir,
		 (long)getpid(), nstash++);
	if (link(path, o->stash) < 0)
		o->stash[0] = 0;
}

static void lose_writes(void)
{
	int later_all_dropped[MAX_INO];

	for (int i = 0; i < ninos; i++)
		later_all_dropped[i] = 1;
	for (int k = nundo - 1; k >= 0; k--) {
		struct undo *u = &undos[k];
		int fd = inos[u->ino].fd;
		uint64_t nsec = (u->len + SECTOR - 1) / SECTOR, from;
		int how = variant == 0 ? 1 : (int)pick(3);

		if (how == 0) { /* reached the disk */
			later_all_dropped[u->ino] = 0;
			continue;
		}
		/* lost (1) or torn (2): the first `cut` sectors arrived */
		from = u->off;
		if (how == 2) {
			from += SECTOR * pick(nsec + 1);
			if (from > u->off + u->len)
				from = u->off + u->len;
			if (from > u->off)
				later_all_dropped[u->ino] = 0;
		}
		uint64_t old_end = u->off + u->len < u->old_size ?
					   u->off + u->len :
					   u->old_size;
		if (from < old_end && pwrite(fd, u->old + (from - u->off),
					     old_end - from, (off_t)from) < 0)
			_exit(54);
		if (later_all_dropped[u->ino]) {
			uint64_t sz = from > u->old_size ? from : u->old_size;
			if (ftruncate(fd, (off_t)sz) < 0)
				_exit(55);
		}
	}
}

static void revert_dirs(void)
{
	/* per directory: how many of its pending changes survive */
	int keep[MAX_DOPS], seen[MAX_DOPS];

	for (int i = 0; i < ndops; i++) {
		keep[i] = -1;
		seen[i] = 0;
	}
	for (int i = 0; i < ndops; i++) {
		if (dops[i].durable || keep[i] >= 0)
			continue;
		int n = 0;
		for (int j = i; j < ndops; j++)
			n += !dops[j].durable && dops[j].ddev == dops[i].ddev &&
			     dops[j].dino == dops[i].dino;
		int k = variant == 0 ? 0 : (int)pick(n + 1);
		for (int j = i; j < ndops; j++)
			if (!dops[j].durable && dops[j].ddev == dops[i].ddev &&
			    dops[j].dino == dops[i].dino)
				keep[j] = k;
	}
	/* index of each op among its directory's pending ones */
	for (int i = 0; i < ndops; i++) {
		if (dops[i].durable)
			continue;
		for (int j = 0; j < i; j++)
			seen[i] += !dops[j].durable &&
				   dops[j].ddev == dops[i].ddev &&
				   dops[j].dino == dops[i].dino;
	}
	for (int i = ndops - 1; i >= 0; i--) {
		struct dop *o = &dops[i];

		if (o->durable)
			continue;
		if (variant >= 2 ? pick(2) == 0 : seen[i] < keep[i])
			continue;
		switch (o->type) {
		case D_CREATE:
		case D_LINK:
			unlink(o->type == D_LINK ? o->path2 : o->path);
			break;
		case D_RENAME:
			rename(o->path2, o->path);
			if (o->stash[0])
				rename(o->stash, o->path2);
			break;
		case D_UNLINK:
			if (o->stash[0])
				rename(o->stash, o->path);
			break;
		case D_MKDIR:
			tu_rm_rf(o->path);
			break;
		case D_RMDIR:
			mkdir(o->path, 0755);
			break;
		}
	}
}

static void point(void)
{
	if (++points != crash_at)
		return;
	tu_rng_seed(&rng, (uint64_t)crash_at * 7919 + (uint64_t)variant);
	lose_writes();
	revert_dirs();
	_exit(commit_durable ? 98 : 99);
}

static int p_open(const char *path, int flags, mode_t mode)
{
	struct stat st;

	point();
	int existed = stat(path, &st) == 0;
	int fd = open(path, flags | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	if ((flags & O_CREAT) && !existed)
		add_dop(D_CREATE, path, NULL);
	if ((flags & O_ACCMODE) != O_RDONLY)
		track_fd(fd);
	return fd;
}

static ssize_t p_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	struct stat st;

	point();
	int i = track_fd(fd);
	if (i >= 0 && fstat(fd, &st) == 0) {
		if (nundo == MAX_UNDO)
			_exit(56);
		struct undo *u = &undos[nundo++];
		u->ino = i;
		u->off = (uint64_t)off;
		u->len = n;
		u->old_size = (uint64_t)st.st_size;
		u->old = NULL;
		if (u->off < u->old_size) {
			uint64_t m = u->old_size - u->off < n ?
					     u->old_size - u->off :
					     n;
			u->old = malloc(m);
			if (!u->old || pread(fd, u->old, m, off) != (ssize_t)m)
				_exit(57);
		}
	}
	ssize_t r = pwrite(fd, buf, n, off);
	return r < 0 ? -errno : r;
}

static int p_sync(int fd, int data)
{
	struct stat st;

	point();
	int r = (data ? fdatasync(fd) : fsync(fd)) ? -errno : 0;
	if (r == 0 && fstat(fd, &st) == 0) {
		if (S_ISDIR(st.st_mode)) {
			for (int i = 0; i < ndops; i++) {
				struct dop *o = &dops[i];
				if (o->ddev != st.st_dev ||
				    o->dino != st.st_ino)
					continue;
				const char *b = strrchr(o->path2, '/');
				if (o->type == D_RENAME && b &&
				    !strcmp(b + 1, FMT_COMMIT_NAME))
					commit_durable = 1;
				o->durable = 1;
			}
		} else {
			int k = find_ino(&st), j = 0;
			for (int i = 0; i < nundo; i++) {
				if (undos[i].ino == k)
					free(undos[i].old);
				else
					undos[j++] = undos[i];
			}
			nundo = j;
		}
	}
	return r;
}

static int p_fsync(int fd)
{
	return p_sync(fd, 0);
}

static int p_fdatasync(int fd)
{
	return p_sync(fd, 1);
}

static int p_rename2(const char *a, const char *b, unsigned flags)
{
	struct stat st;

	point();
	struct dop o;
	memset(&o, 0, sizeof(o));
	int replaced = lstat(b, &st) == 0 && !flags;
	if (replaced) {
		snprintf(o.stash, sizeof(o.stash), "%s/%ld.%d", stash_dir,
			 (long)getpid(), nstash++);
		if (link(b, o.stash) < 0)
			o.stash[0] = 0;
	}
	if (renameat2(AT_FDCWD, a, AT_FDCWD, b, flags)) {
		int e = -errno;
		if (o.stash[0])
			unlink(o.stash);
		return e;
	}
	struct dop *d = add_dop(D_RENAME, a, b);
	memcpy(d->stash, o.stash, sizeof(d->stash));
	return 0;
}

static int p_rename(const char *a, const char *b)
{
	return p_rename2(a, b, 0);
}

static int p_rename_noreplace(const char *a, const char *b)
{
	return p_rename2(a, b, RENAME_NOREPLACE);
}

static int p_link(const char *a, const char *b)
{
	point();
	if (link(a, b))
		return -errno;
	add_dop(D_LINK, a, b);
	return 0;
}

static int p_unlink(const char *p)
{
	point();
	struct dop *o = add_dop(D_UNLINK, p, NULL);
	stash(o, p);
	if (unlink(p)) {
		int e = -errno;
		if (o->stash[0])
			unlink(o->stash);
		ndops--;
		return e;
	}
	return 0;
}

static int p_mkdir(const char *p, mode_t m)
{
	point();
	if (mkdir(p, m))
		return -errno;
	add_dop(D_MKDIR, p, NULL);
	return 0;
}

static int p_rmdir(const char *p)
{
	point();
	if (rmdir(p))
		return -errno;
	add_dop(D_RMDIR, p, NULL);
	return 0;
}

static const eng_io disk_io = {
	.open = p_open,
	.pwrite = p_pwrite,
	.fsync = p_fsync,
	.fdatasync = p_fdatasync,
	.rename = p_rename,
	.rename_noreplace = p_rename_noreplace,
	.link = p_link,
	.unlink = p_unlink,
	.mkdir = p_mkdir,
	.rmdir = p_rmdir,
};

/* ---- steps ---- */

static void step_set(tu_set *set, uint64_t step)
{
	uint64_t s1[1] = { 30000 }, s2[1] = { 5000 + step };
	tu_set_init(set);
	tu_set_add(set, "w", CKPT_BF16, 1, s1, step);
	tu_set_add(set, "b", CKPT_U8, 1, s2, step * 31);
}

static uint32_t keep_last = 2;

static void open_saver(ckpt **c, const char *root)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 1u << 20;
	s.chunk_bytes = 64u << 10;
	s.flags |= CKPT_F_NO_URING;
	s.keep_last = keep_last; /* retention is part of the sequence */
	s.threads = 1;
	s.codec = CKPT_CODEC_ZSTD;
	int rc = ckpt_open(c, root, &s);
	if (rc) {
		fprintf(stderr, "child open: %d %s\n", rc, ckpt_errmsg(NULL));
		_exit(10);
	}
}

/* Child: saves `step` on the simulated disk, crashing at point `at` (0:
 * never; then it writes the number of points to pfd). */
static void child(const char *root, uint64_t step, long at, int var, int pfd)
	__attribute__((noreturn));
static void child(const char *root, uint64_t step, long at, int var, int pfd)
{
	ckpt *c = NULL;
	tu_set set;

	step_set(&set, step);
	crash_at = at;
	variant = var;
	open_saver(&c, root);
	eng_io_set(&disk_io);
	int rc = tu_save(c, step, &set);
	if (rc) {
		fprintf(stderr, "child save: %d %s\n", rc, ckpt_errmsg(c));
		_exit(11);
	}
	if (ckpt_close(c))
		_exit(12);
	if (pfd >= 0 && write(pfd, &points, sizeof(points)) != sizeof(points))
		_exit(13);
	_exit(0);
}

static int run(const char *root, uint64_t step, long at, int var, long *pts)
{
	int pfd[2];
	ck_assert_int_eq(pipe(pfd), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		child(root, step, at, var, pfd[1]);
	}
	close(pfd[1]);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	if (pts && read(pfd[0], pts, sizeof(*pts)) != sizeof(*pts))
		*pts = 0;
	close(pfd[0]);
	ck_assert_msg(WIFEXITED(status), "child killed by signal %d",
		      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	return WEXITSTATUS(status);
}

/* After a crash while saving `step` over committed 1..step-1: returns the
 * newest committed step. */
static uint64_t check_root(const char *root, uint64_t step, int durable,
			   const char *ctx)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, root, &s), 0);
	ckpt_step_info *li = NULL;
	size_t n = 0;
	int rc = ckpt_list(c, &li, &n);
	ck_assert_msg(rc == 0, "%s: list: %s", ctx, ckpt_errmsg(c));
	ck_assert_msg(n > 0, "%s: no committed step left", ctx);
	for (size_t i = 0; i < n; i++) {
		tu_set set;
		ck_assert_msg(li[i].step <= step, "%s: step %llu listed", ctx,
			      (unsigned long long)li[i].step);
		step_set(&set, li[i].step);
		rc = tu_check_root(root, li[i].step, &set, why, sizeof(why));
		tu_set_free(&set);
		ck_assert_msg(rc == 0, "%s: listed step %llu: %s", ctx,
			      (unsigned long long)li[i].step, why);
		ckpt_reader *r = NULL;
		ck_assert_int_eq(ckpt_reader_open(&r, root, li[i].step, NULL),
				 0);
		rc = ckpt_reader_verify(r, NULL, NULL);
		ck_assert_msg(rc == 0, "%s: verify %llu: %s", ctx,
			      (unsigned long long)li[i].step,
			      ckpt_reader_errmsg(r));
		ckpt_reader_close(r);
	}
	uint64_t latest = 0;
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_uint_eq(latest, li[n - 1].step);
	ck_assert_msg(latest == step || latest == step - 1,
		      "%s: newest committed step %llu", ctx,
		      (unsigned long long)latest);
	if (durable)
		ck_assert_msg(latest == step,
			      "%s: the commit had returned but step %llu "
			      "is gone (newest %llu)",
			      ctx, (unsigned long long)step,
			      (unsigned long long)latest);
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, root, CKPT_LATEST, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_step(r), latest);
	ckpt_reader_close(r);
	ckpt_free(li);
	/* and the root stays usable: gc clears the debris */
	ck_assert_int_eq(ckpt_gc(c, 0, 0, 0, NULL, NULL, NULL), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	return latest;
}

START_TEST(test_power_loss)
{
	const char *top = tu_tmpdir();
	char *base = tu_path("%s/base", top), *root = tu_path("%s/root", top);
	long total = 0, runs = 0, durable_runs = 0;

	snprintf(stash_dir, sizeof(stash_dir), "%s/stash", top);
	ck_assert_int_eq(mkdir(stash_dir, 0755), 0);
	/* steps 1..3 on the real disk, then the measured save of 4 */
	for (uint64_t s = 1; s <= 3; s++)
		ck_assert_int_eq(run(base, s, 0, 0, NULL), 0);
	ck_assert_int_eq(tu_copy_tree(base, root), 0);
	ck_assert_int_eq(run(root, 4, 0, 0, &total), 0);
	check_root(root, 4, 1, "no crash");
	ck_assert_int_gt(total, 20);
	for (long at = 1; at <= total; at++)
		for (int var = 0; var < NVARIANTS; var++) {
			char ctx[96];
			snprintf(ctx, sizeof(ctx),
				 "power loss at point %ld/%ld, variant %d", at,
				 total, var);
			ck_assert_int_eq(tu_rm_rf(root), 0);
			ck_assert_int_eq(tu_rm_rf(stash_dir), 0);
			ck_assert_int_eq(mkdir(stash_dir, 0755), 0);
			ck_assert_int_eq(tu_copy_tree(base, root), 0);
			/* each point takes well under a second: a point
			 * still running after two minutes hangs */
			tu_watchdog_arm(120, ctx);
			int st = run(root, 4, at, var, NULL);
			ck_assert_msg(st == 99 || st == 98, "%s: child exit %d",
				      ctx, st);
			durable_runs += st == 98;
			check_root(root, 4, st == 98, ctx);
			tu_watchdog_disarm();
			runs++;
		}
	fprintf(stderr,
		"power loss: %ld crash points in one save + commit + "
		"retention, %ld runs (%ld after the commit was durable)\n",
		total, runs, durable_runs);
	ck_assert_int_gt(durable_runs, 0);
	ck_assert_int_lt(durable_runs, runs);
	free(base);
	free(root);
}
END_TEST

/* ---- removal order ---- */

static char seq[8192];
static int fail_step_sync;

static void note(const char *what, const char *path)
{
	const char *s = strstr(path, "step-");
	size_t n = strlen(seq);
	snprintf(seq + n, sizeof(seq) - n, "%s %s;", what, s ? s : path);
}

static int r_unlink(const char *p)
{
	note("unlink", p);
	return unlink(p) ? -errno : 0;
}

static int r_fsync(int fd)
{
	char p[64], t[512];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(p, t, sizeof(t) - 1);
	t[n > 0 ? n : 0] = 0;
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && strstr(t, "step-")) {
		note("fsync", t);
		if (fail_step_sync)
			return -EIO;
	}
	return fsync(fd) ? -errno : 0;
}

static const eng_io order_io = {
	.unlink = r_unlink,
	.fsync = r_fsync,
};

START_TEST(test_removal_order)
{
	const char *root = tu_tmpdir();
	snprintf(stash_dir, sizeof(stash_dir), "%s.stash", root);
	ck_assert_int_eq(mkdir(stash_dir, 0755), 0);
	keep_last = 0;
	for (uint64_t s = 1; s <= 3; s++)
		ck_assert_int_eq(run(root, s, 0, 0, NULL), 0);
	keep_last = 2;
	ckpt_settings set;
	tu_settings(&set);
	set.staging_bytes = 0;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, root, &set), 0);

	/* the sync after step 1's COMMIT fails: gc stops, step 1 is debris
	 * with all its files, never a committed step missing some */
	char *sd = tu_step_dir(root, 1);
	int before = tu_count_suffix(sd, ".shard");
	ck_assert_int_gt(before, 0);
	seq[0] = 0;
	fail_step_sync = 1;
	eng_io_set(&order_io);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, NULL), -EIO);
	eng_io_set(NULL);
	ck_assert_msg(strstr(ckpt_errmsg(c), "step-"), "message: %s",
		      ckpt_errmsg(c));
	char *cm = tu_path("%s/COMMIT", sd);
	ck_assert(!tu_exists(cm));
	ck_assert_int_eq(tu_count_suffix(sd, ".shard"), before);
	ckpt_step_info *li = NULL;
	size_t n = 0;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(li[0].step, 2);
	ckpt_free(li);

	/* without the fault: step 1 is debris (files only); step 2 goes
	 * COMMIT, sync, then its files */
	seq[0] = 0;
	fail_step_sync = 0;
	eng_io_set(&order_io);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, NULL), 0);
	eng_io_set(NULL);
	ck_assert(!tu_exists(sd));
	ck_assert_msg(strstr(seq, "unlink step-00000000000000000001/h") &&
			      !strstr(seq, "step-00000000000000000001/COMMIT"),
		      "order: %s", seq);
	char *p1 = strstr(seq, "unlink step-00000000000000000002/COMMIT;");
	char *p2 = strstr(seq, "fsync step-00000000000000000002;");
	char *p3 = strstr(seq, "unlink step-00000000000000000002/h");
	ck_assert_msg(p1 && p2 && p3 && p1 < p2 && p2 < p3, "order: %s", seq);
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 1);
	ckpt_free(li);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set s3;
	step_set(&s3, 3);
	ck_assert_int_eq(tu_check_root(root, 3, &s3, why, sizeof(why)), 0);
	tu_set_free(&s3);
	free(cm);
	free(sd);
	tu_rm_rf(stash_dir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("powerloss");
	TCase *tc = tu_tcase("powerloss", 800);
	tcase_add_test(tc, test_removal_order);
	tcase_add_test(tc, test_power_loss);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
