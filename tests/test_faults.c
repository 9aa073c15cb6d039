/*
 * test_faults.c - I/O failures injected through the engine's I/O table
 * (eng_io_set): ENOSPC on the Nth write, EIO on the Nth fsync/fdatasync,
 * EIO on the Nth rename, short writes and reads, read errors; with
 * io_uring and with CKPT_F_NO_URING, with O_DIRECT and CKPT_F_NO_DIRECT;
 * the ENOSPC series also with borrowed saves (CKPT_SAVE_BORROW).
 *
 * Each injected fault has exactly one allowed outcome, decided by the
 * stage of the save the failing call belongs to. The hooks record the path
 * of every call (for write/fsync through a table fd -> path filled by the
 * open hook), so the test knows what the Nth operation touched:
 *  - data: shard files, the host index, the step and root directory syncs
 *    of publishing the index;
 *  - commit: COMMIT.tmp (create, write, fsync) and its rename to COMMIT;
 *  - commit dirsync: the step directory fsync after the COMMIT rename;
 *  - latest: latest.tmp (create, write, fsync), its rename, and the root
 *    directory fsync after it.
 * data, commit and commit dirsync faults fail the save (ckpt_wait, or
 * ckpt_commit with CKPT_F_MANUAL_COMMIT) with exactly the injected error
 * and a message; the step is not listed, no COMMIT(.tmp) is left, the
 * previous step stays latest, intact and verifiable, and the same handle
 * then saves (or commits) the same step again. A latest fault does not
 * fail the durable commit: the call returns 0, the step is listed and is
 * the newest by scan, and ckpt_errmsg() holds the message about the
 * failed `latest` update.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
static atomic_int fired, commit_done, latest_done, shorts;

/* Stage of the save an operation belongs to (see the top comment). */
enum stage { ST_DATA, ST_COMMIT, ST_COMMIT_DIRSYNC, ST_LATEST, ST_UNKNOWN,
	     ST_COUNT };
static const char *const stage_names[ST_COUNT] = {
	"data", "commit", "commit dirsync", "latest", "unclassified"};

/* The step being saved/committed (names its directory). */
static atomic_ulong cur_step;

/* The faulted operation: its stage and a description (op + path). */
static atomic_int fired_stage;
static char fired_what[600];

/* Path of every fd the engine opened through the hook. */
#define FD_MAX 4096
static pthread_mutex_t fd_mu = PTHREAD_MUTEX_INITIALIZER;
static char *fd_path[FD_MAX];
static int fd_isdir[FD_MAX];

static void fd_record(int fd, const char *path, int flags)
{
	if (fd < 0 || fd >= FD_MAX)
		return;
	char *p = strdup(path);
	pthread_mutex_lock(&fd_mu);
	free(fd_path[fd]);
	fd_path[fd] = p;
	fd_isdir[fd] = (flags & O_DIRECTORY) != 0;
	pthread_mutex_unlock(&fd_mu);
}

/* Copies the path of fd into buf ("?" if unknown); returns is-directory. */
static int fd_lookup(int fd, char *buf, size_t len)
{
	int isdir = 0;
	pthread_mutex_lock(&fd_mu);
	if (fd >= 0 && fd < FD_MAX && fd_path[fd]) {
		snprintf(buf, len, "%s", fd_path[fd]);
		isdir = fd_isdir[fd];
	} else {
		snprintf(buf, len, "?fd %d", fd);
	}
	pthread_mutex_unlock(&fd_mu);
	return isdir;
}

static const char *base_name(const char *path, char *buf, size_t len)
{
	size_t l = strlen(path);
	while (l > 1 && path[l - 1] == '/')
		l--;
	size_t b = l;
	while (b > 0 && path[b - 1] != '/')
		b--;
	snprintf(buf, len, "%.*s", (int)(l - b), path + b);
	return buf;
}

/* Stage of an operation on `path` happening now. */
static int classify(const char *path, int isdir)
{
	char b[256], sd[32];
	base_name(path, b, sizeof(b));
	/* temporaries are NAME.<pid>-<random>.tmp */
	if (!strcmp(b, FMT_LATEST_NAME) ||
	    !strncmp(b, FMT_LATEST_NAME ".", strlen(FMT_LATEST_NAME) + 1))
		return ST_LATEST;
	if (!strcmp(b, FMT_COMMIT_NAME) ||
	    !strncmp(b, FMT_COMMIT_NAME ".", strlen(FMT_COMMIT_NAME) + 1))
		return ST_COMMIT;
	int cd = atomic_load(&commit_done), ld = atomic_load(&latest_done);
	if (isdir) {
		fmt_step_dirname(atomic_load(&cur_step), sd);
		if (!strcmp(b, sd)) /* the step directory */
			return ld ? ST_UNKNOWN : cd ? ST_COMMIT_DIRSYNC : ST_DATA;
		/* the root: publishing the index, or after latest */
		return ld ? ST_LATEST : cd ? ST_UNKNOWN : ST_DATA;
	}
	if (path[0] == '?')
		return ST_UNKNOWN;
	/* shards and the index */
	return cd ? ST_UNKNOWN : ST_DATA;
}

static void reset_counters(void)
{
	atomic_store(&n_writes, 0);
	atomic_store(&n_syncs, 0);
	atomic_store(&n_renames, 0);
	atomic_store(&n_reads, 0);
	atomic_store(&n_creates, 0);
	atomic_store(&fired, 0);
	atomic_store(&fired_stage, ST_UNKNOWN);
	atomic_store(&commit_done, 0);
	atomic_store(&latest_done, 0);
	atomic_store(&shorts, 0);
	fired_what[0] = 0;
}

static void fire(const char *op, const char *path, int isdir)
{
	if (!atomic_exchange(&fired, 1)) {
		snprintf(fired_what, sizeof(fired_what), "%s %s", op, path);
		atomic_store(&fired_stage, classify(path, isdir));
	}
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
		char p[512];
		int isdir = fd_lookup(fd, p, sizeof(p));
		fire("write", p, isdir);
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
		fire("read", "", 0);
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
		char p[512];
		int isdir = fd_lookup(fd, p, sizeof(p));
		fire(data ? "fdatasync" : "fsync", p, isdir);
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

static int rename_hook(const char *from, const char *to, unsigned flags)
{
	long n = atomic_fetch_add(&n_renames, 1) + 1;
	if (atomic_load(&mode) == M_RENAME_ERR && n == atomic_load(&target)) {
		fire("rename to", to, 0);
		return -EIO;
	}
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, flags))
		return -errno;
	char b[256];
	base_name(to, b, sizeof(b));
	if (!strcmp(b, FMT_COMMIT_NAME))
		atomic_store(&commit_done, 1);
	if (!strcmp(b, FMT_LATEST_NAME))
		atomic_store(&latest_done, 1);
	return 0;
}

static int h_rename(const char *from, const char *to)
{
	return rename_hook(from, to, 0);
}

static int h_rename_noreplace(const char *from, const char *to)
{
	return rename_hook(from, to, RENAME_NOREPLACE);
}

/* Files created (O_CREAT): shards, indexes, COMMIT, latest temp files. */
static int h_open(const char *path, int flags, mode_t m)
{
	if (flags & O_CREAT) {
		long n = atomic_fetch_add(&n_creates, 1) + 1;
		if (atomic_load(&mode) == M_OPEN_ERR &&
		    n == atomic_load(&target)) {
			fire("create", path, 0);
			return atomic_load(&inject_err);
		}
	}
	int fd = open(path, flags | O_CLOEXEC, m);
	if (fd < 0)
		return -errno;
	fd_record(fd, path, flags);
	return fd;
}

static const eng_io hooks = {
	.open = h_open,
	.fsync = h_fsync,
	.fdatasync = h_fdatasync,
	.rename = h_rename,
	.rename_noreplace = h_rename_noreplace,
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

/* 0 if this machine can take the I/O path cfg names (io_uring, O_DIRECT
 * in dir), else why not: the test is then skipped. */
static const char *cfg_unusable(int cfg, const char *dir)
{
	int uring = !(cfg_flags[cfg] & CKPT_F_NO_URING);
	if (uring && !tu_uring_works())
		return "no io_uring on this machine";
	if (uring && !(cfg_flags[cfg] & CKPT_F_NO_DIRECT) &&
	    !eng_probe_direct(dir))
		return "no O_DIRECT in the test directory";
	return NULL;
}

/* At the top of a test looping over cfg: skip where the path is missing. */
#define CFG_SKIP(cfg)                                                    \
	do {                                                             \
		const char *no_ = cfg_unusable((cfg), tu_tmpdir());      \
		if (no_)                                                 \
			TU_SKIP(no_);                                    \
	} while (0)

/* After a save: the handle took the path cfg names (see cfg_unusable). */
static void check_path(ckpt *c, int cfg)
{
	int uring = !(cfg_flags[cfg] & CKPT_F_NO_URING);
	int direct = uring && !(cfg_flags[cfg] & CKPT_F_NO_DIRECT);
	eng_io_stats st;
	eng_io_stats_get(c, &st);
	ck_assert_msg(uring ? st.uring_writes > 0 && st.pwrite_writes == 0 :
			      st.uring_writes == 0 && st.pwrite_writes > 0,
		      "%s: %llu io_uring writes, %llu pwrites", cfg_names[cfg],
		      (unsigned long long)st.uring_writes,
		      (unsigned long long)st.pwrite_writes);
	ck_assert_msg(direct == (st.direct_files > 0),
		      "%s: %llu O_DIRECT files", cfg_names[cfg],
		      (unsigned long long)st.direct_files);
}

static ckpt *open_cfg(const char *dir, int cfg, int manual)
{
	ckpt_settings s;
	tu_settings(&s);
	s.flags = cfg_flags[cfg] | (manual ? CKPT_F_MANUAL_COMMIT : 0);
	s.files_per_host = 2;
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

/* Saves lend the tensors (CKPT_SAVE_BORROW) instead of having them
 * copied: test_borrow_faults. */
static atomic_int borrow_saves;

/* A borrowed save: the memory is released (also when the save fails),
 * then overwritten before the save is collected, so a save that read it
 * after the release stores garbage and check_step finds it. */
static int save_borrowed(ckpt *c, uint64_t step, tu_set *set)
{
	ckpt_tensor *v = calloc(set->n, sizeof(*v));
	ckpt_save_opts o;
	ckpt_progress p;
	ck_assert(v);
	tu_set_view(set, v);
	ckpt_save_opts_default(&o);
	o.flags = CKPT_SAVE_BORROW;
	int rc = ckpt_save_ex(c, step, v, set->n, &o);
	ck_assert_int_eq(ckpt_wait_released(c, rc ? 0 : -1), 0);
	ckpt_poll(c, &p);
	ck_assert_int_ne(p.state, CKPT_STATE_STAGING);
	for (size_t i = 0; i < set->n; i++)
		memset(set->t[i].data, 0xa5, set->t[i].nbytes);
	free(v);
	return rc ? rc : ckpt_wait(c);
}

static int save_step(ckpt *c, uint64_t step)
{
	tu_set set;
	step_set(&set, step);
	if (atomic_load(&borrow_saves)) {
		int rc = save_borrowed(c, step, &set);
		tu_set_free(&set);
		return rc;
	}
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

/* Operations of one save of step 2 after a committed step 1 (with manual
 * commit: of the ckpt_commit of step 2 only). */
static struct counts measure_mode(int cfg, int manual)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, cfg, manual);
	atomic_store(&mode, M_NONE);
	eng_io_set(&hooks);
	atomic_store(&cur_step, 1);
	ck_assert_int_eq(save_step(c, 1), 0);
	check_path(c, cfg);
	if (manual)
		ck_assert_int_eq(ckpt_commit(c, 1), 0);
	atomic_store(&cur_step, 2);
	if (manual)
		ck_assert_int_eq(save_step(c, 2), 0);
	reset_counters();
	ck_assert_int_eq(manual ? ckpt_commit(c, 2) : save_step(c, 2), 0);
	struct counts k = {atomic_load(&n_writes), atomic_load(&n_syncs),
			   atomic_load(&n_renames), atomic_load(&n_creates)};
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
	fprintf(stderr, "%s: a %s does %ld writes, %ld syncs, %ld renames, "
			"%ld creates\n", cfg_names[cfg],
		manual ? "ckpt_commit" : "save", k.writes, k.syncs, k.renames,
		k.creates);
	ck_assert_int_gt(k.writes, manual ? 1 : 4);
	ck_assert_int_gt(k.syncs, 0);
	ck_assert_int_gt(k.renames, 0);
	return k;
}

static struct counts measure(int cfg)
{
	return measure_mode(cfg, 0);
}

/* Faults per stage in the current series. */
static int n_stage[ST_COUNT];

/* Content of the `latest` hint: "" if absent. */
static void read_hint(const char *dir, char *out, size_t len)
{
	char *p = tu_path("%s/%s", dir, FMT_LATEST_NAME);
	uint8_t *b = NULL;
	size_t n = 0;
	out[0] = 0;
	if (tu_read_file(p, &b, &n) == 0)
		snprintf(out, len, "%.*s", (int)n, (const char *)b);
	free(b);
	free(p);
}

/* The step directory of `step` holds neither COMMIT nor a temporary of
 * it (COMMIT.<pid>-<random>.tmp). */
static void check_no_commit(const char *dir, uint64_t step, const char *ctx)
{
	char *sd = tu_step_dir(dir, step);
	char *p = tu_path("%s/%s", sd, FMT_COMMIT_NAME);
	ck_assert_msg(!tu_exists(p), "%s: %s left behind", ctx, p);
	DIR *d = opendir(sd);
	struct dirent *e;
	while (d && (e = readdir(d)))
		ck_assert_msg(strncmp(e->d_name, FMT_COMMIT_NAME ".", 7),
			      "%s: %s/%s left behind", ctx, sd, e->d_name);
	if (d)
		closedir(d);
	free(p);
	free(sd);
}

/*
 * One fault case on the running root: prev is committed and latest. With
 * `manual`, step prev+1 is saved first without faults and the fault hits
 * its ckpt_commit; otherwise it hits save + automatic commit.
 */
static void fault_case_mode(const char *dir, ckpt *c, uint64_t *prev, int m,
			    long n, int err, const char *what, int manual)
{
	char ctx[1024];
	uint64_t step = *prev + 1;
	int rc;
	atomic_store(&cur_step, step);
	if (manual) {
		atomic_store(&mode, M_NONE);
		rc = save_step(c, step);
		ck_assert_msg(rc == 0, "%s #%ld: save before commit: %d %s",
			      what, n, rc, ckpt_errmsg(c));
		ck_assert(!listed(c, step));
	}
	/* a known message, so a stale one cannot pass for a new one */
	ck_assert_int_eq(ckpt_list(c, NULL, NULL), -EINVAL);
	char sentinel[ENG_ERRMSG_MAX];
	snprintf(sentinel, sizeof(sentinel), "%s", ckpt_errmsg(c));
	reset_counters();
	atomic_store(&inject_err, err);
	atomic_store(&target, n);
	atomic_store(&mode, m);
	rc = manual ? ckpt_commit(c, step) : save_step(c, step);
	atomic_store(&mode, M_NONE);
	if (!atomic_load(&fired)) {
		/* fewer operations this time (should not happen) */
		ck_assert_msg(rc == 0, "%s #%ld: not fired but rc %d", what, n,
			      rc);
		*prev = step;
		return;
	}
	int st = atomic_load(&fired_stage);
	snprintf(ctx, sizeof(ctx), "%s #%ld (%s stage: %s)", what, n,
		 stage_names[st], fired_what);
	n_stage[st]++;
	const char *msg = ckpt_errmsg(c);
	if (getenv("CKPT_TEST_VERBOSE"))
		fprintf(stderr, "%s: rc %d listed %d: %s\n", ctx, rc,
			listed(c, step), msg);
	ck_assert_msg(st != ST_UNKNOWN, "%s: cannot tell the stage; rc %d %s",
		      ctx, rc, msg);
	ck_assert_msg(root_tmp_files(dir) == 0, "%s: temp file in root", ctx);
	if (st == ST_LATEST) {
		/* COMMIT is durable: the commit succeeds, latest is a hint */
		ck_assert_msg(rc == 0, "%s: returned %d (%s), want 0: %s", ctx,
			      rc, ckpt_strerror(rc), msg);
		ck_assert_msg(listed(c, step), "%s: committed step not listed",
			      ctx);
		uint64_t l;
		ck_assert_int_eq(ckpt_latest(c, &l), 0);
		ck_assert_msg(l == step, "%s: latest %llu", ctx,
			      (unsigned long long)l);
		ckpt_reader *r = NULL;
		ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
		ck_assert_uint_eq(ckpt_reader_step(r), step);
		ckpt_reader_close(r);
		ck_assert_msg(strcmp(msg, sentinel) != 0 &&
				      strstr(msg, ckpt_strerror(err)) &&
				      (strstr(msg, FMT_LATEST_NAME) ||
				       strstr(msg, "fsync directory")),
			      "%s: commit ok but ckpt_errmsg is not about the "
			      "failed latest update: \"%s\"",
			      ctx, msg);
		/* the hint names the old or the new step, nothing else */
		char hint[64], a[32], b[32], ha[40], hb[40];
		read_hint(dir, hint, sizeof(hint));
		fmt_step_dirname(*prev, a);
		fmt_step_dirname(step, b);
		snprintf(ha, sizeof(ha), "%s\n", a);
		snprintf(hb, sizeof(hb), "%s\n", b);
		ck_assert_msg(!strcmp(hint, ha) || !strcmp(hint, hb),
			      "%s: latest hint \"%s\"", ctx, hint);
		check_step(dir, step, ctx);
		check_step(dir, *prev, ctx);
		*prev = step;
		return;
	}
	/* up to and including the COMMIT rename and its directory fsync:
	 * the commit fails with the injected error, nothing is visible */
	ck_assert_msg(rc == err, "%s: returned %d (%s), want %d: %s", ctx, rc,
		      ckpt_strerror(rc), err, msg);
	ck_assert_msg(msg[0] && strcmp(msg, sentinel) != 0,
		      "%s: no message (\"%s\")", ctx, msg);
	ck_assert_msg(strstr(msg, ckpt_strerror(err)),
		      "%s: message does not name the error: %s", ctx, msg);
	ck_assert_msg(!listed(c, step), "%s: failed step listed", ctx);
	check_no_commit(dir, step, ctx);
	uint64_t l;
	ck_assert_int_eq(ckpt_latest(c, &l), 0);
	ck_assert_msg(l == *prev, "%s: latest %llu", ctx,
		      (unsigned long long)l);
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_step(r), *prev);
	ckpt_reader_close(r);
	check_step(dir, *prev, ctx);
	r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, step, NULL),
			 CKPT_E_NOTFOUND);
	/* the fault is gone: the same handle saves (commits) the same step */
	rc = manual ? ckpt_commit(c, step) : save_step(c, step);
	ck_assert_msg(rc == 0, "%s: %s after the fault: %d %s", ctx,
		      manual ? "commit" : "save", rc, ckpt_errmsg(c));
	ck_assert(listed(c, step));
	check_step(dir, step, ctx);
	check_step(dir, *prev, ctx);
	*prev = step;
}

static void fault_case(const char *dir, ckpt *c, uint64_t *prev, int m,
		       long n, int err, const char *what)
{
	fault_case_mode(dir, c, prev, m, n, err, what, 0);
}

static void run_series_mode(int cfg, int m, long total, int err,
			    const char *what, int manual)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, cfg, manual);
	eng_io_set(&hooks);
	atomic_store(&mode, M_NONE);
	atomic_store(&cur_step, 1);
	ck_assert_int_eq(save_step(c, 1), 0);
	check_path(c, cfg);
	if (manual)
		ck_assert_int_eq(ckpt_commit(c, 1), 0);
	uint64_t prev = 1;
	char label[96];
	snprintf(label, sizeof(label), "%s %s%s", cfg_names[cfg], what,
		 manual ? " (ckpt_commit)" : "");
	memset(n_stage, 0, sizeof(n_stage));
	for (long n = 1; n <= total; n++)
		fault_case_mode(dir, c, &prev, m, n, err, label, manual);
	fprintf(stderr, "%s: faults by stage: %d data, %d commit, %d commit "
			"dirsync, %d latest\n", label, n_stage[ST_DATA],
		n_stage[ST_COMMIT], n_stage[ST_COMMIT_DIRSYNC],
		n_stage[ST_LATEST]);
	/* every series reaches COMMIT and latest */
	if (!manual)
		ck_assert_int_gt(n_stage[ST_DATA], 0);
	ck_assert_int_gt(n_stage[ST_COMMIT], 0);
	ck_assert_int_gt(n_stage[ST_LATEST], 0);
	if (m == M_FSYNC_ERR)
		ck_assert_int_gt(n_stage[ST_COMMIT_DIRSYNC], 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}

static void run_fault_series(int cfg, int m, long total, int err,
			     const char *what)
{
	run_series_mode(cfg, m, total, err, what, 0);
}

START_TEST(test_enospc_nth_write)
{
	CFG_SKIP(_i);
	struct counts k = measure(_i);
	run_fault_series(_i, M_WRITE_ERR, k.writes, -ENOSPC, "ENOSPC write");
}
END_TEST

/* The ENOSPC series with borrowed saves: each failed save releases the
 * memory and leaves nothing, each good one stored what was lent. */
START_TEST(test_borrow_faults)
{
	CFG_SKIP(_i);
	atomic_store(&borrow_saves, 1);
	struct counts k = measure(_i);
	run_fault_series(_i, M_WRITE_ERR, k.writes, -ENOSPC,
			 "ENOSPC write, borrowed");
	atomic_store(&borrow_saves, 0);
}
END_TEST

START_TEST(test_eio_nth_write)
{
	CFG_SKIP(_i);
	struct counts k = measure(_i);
	/* fewer cases: every third write */
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i, 0);
	eng_io_set(&hooks);
	atomic_store(&cur_step, 1);
	ck_assert_int_eq(save_step(c, 1), 0);
	check_path(c, _i);
	uint64_t prev = 1;
	for (long n = 1; n <= k.writes; n += 3)
		fault_case(dir, c, &prev, M_WRITE_ERR, n, -EIO, "EIO write");
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}
END_TEST

START_TEST(test_eio_nth_fsync)
{
	CFG_SKIP(_i);
	struct counts k = measure(_i);
	run_fault_series(_i, M_FSYNC_ERR, k.syncs, -EIO, "EIO fsync");
}
END_TEST

START_TEST(test_eio_nth_rename)
{
	CFG_SKIP(_i);
	struct counts k = measure(_i);
	run_fault_series(_i, M_RENAME_ERR, k.renames, -EIO, "EIO rename");
}
END_TEST

START_TEST(test_enospc_nth_create)
{
	CFG_SKIP(_i);
	struct counts k = measure(_i);
	ck_assert_int_gt(k.creates, 2);
	run_fault_series(_i, M_OPEN_ERR, k.creates, -ENOSPC, "ENOSPC create");
}
END_TEST

/* The same faults in ckpt_commit of a step saved with manual commit. */
START_TEST(test_commit_faults)
{
	CFG_SKIP(_i);
	struct counts k = measure_mode(_i, 1);
	run_series_mode(_i, M_WRITE_ERR, k.writes, -ENOSPC, "ENOSPC write", 1);
	run_series_mode(_i, M_FSYNC_ERR, k.syncs, -EIO, "EIO fsync", 1);
	run_series_mode(_i, M_RENAME_ERR, k.renames, -EIO, "EIO rename", 1);
	run_series_mode(_i, M_OPEN_ERR, k.creates, -ENOSPC, "ENOSPC create",
			1);
}
END_TEST

START_TEST(test_short_writes)
{
	CFG_SKIP(_i);
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i, 0);
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
	check_path(c, _i);
	for (uint64_t step = 1; step <= 3; step++)
		check_step(dir, step, "short writes");
	ck_assert_int_eq(ckpt_close(c), 0);
	eng_io_set(NULL);
}
END_TEST

START_TEST(test_read_faults)
{
	CFG_SKIP(_i);
	const char *dir = tu_tmpdir();
	ckpt *c = open_cfg(dir, _i, 0);
	ck_assert_int_eq(save_step(c, 1), 0);
	check_path(c, _i);
	ck_assert_int_eq(ckpt_close(c), 0);
	ckpt_settings rs;
	ckpt_settings_default(&rs);
	rs.flags = cfg_flags[_i];
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, &rs), 0);
	tu_set set;
	step_set(&set, 1);
	/* without faults, a reader takes the path cfg names */
	ck_assert_msg(tu_check_set(r, &set, why, sizeof(why)) == 0, "%s", why);
	ck_assert_msg(tu_check_reader_path(r, rs.flags, dir, why,
					   sizeof(why)) == 0,
		      "%s: %s", cfg_names[_i], why);
	ckpt_reader_close(r);
	r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, &rs), 0);
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

/* ---- io_uring submission, ftruncate, fallocate, fcntl ---------------- */

/*
 * Submission faults go through eng_io.uring_submit. "Fewer than queued" is
 * made real: the hook hides all but one prepared entry from the real
 * io_uring_submit (sqe_tail is liburing's local end of the queue), so the
 * kernel takes one and the rest stay in the ring, as after a partial
 * submit. Every save runs under a watchdog: a hang fails the test with a
 * message instead of running into the suite timeout.
 */
enum sub_mode { SUB_NONE, SUB_ERR_ONCE, SUB_PARTIAL, SUB_SOFT,
		SUB_SOFT_ALWAYS };

static atomic_int sub_mode, sub_err;
static atomic_long n_submits, n_soft, n_partial;
static atomic_int fail_ftruncate, fail_fallocate, fail_fcntl, odd_short;
static atomic_long n_ftruncate, n_fallocate, n_fcntl;

static int u_submit(struct io_uring *ring)
{
	long n = atomic_fetch_add(&n_submits, 1) + 1;
	unsigned queued = ring->sq.sqe_tail - ring->sq.sqe_head, hide;
	int r;

	switch (atomic_load(&sub_mode)) {
	case SUB_ERR_ONCE:
		if (n == 1)
			return atomic_load(&sub_err);
		break;
	case SUB_SOFT:
		if (n % 2) {
			atomic_fetch_add(&n_soft, 1);
			return n % 4 == 1 ? -EAGAIN : -EBUSY;
		}
		break;
	case SUB_SOFT_ALWAYS:
		atomic_fetch_add(&n_soft, 1);
		return -EAGAIN;
	case SUB_PARTIAL:
		if (queued > 1) {
			hide = queued - 1;
			ring->sq.sqe_tail -= hide;
			r = io_uring_submit(ring);
			ring->sq.sqe_tail += hide;
			atomic_fetch_add(&n_partial, 1);
			return r;
		}
		break;
	}
	return io_uring_submit(ring);
}

static int u_ftruncate(int fd, off_t len)
{
	atomic_fetch_add(&n_ftruncate, 1);
	if (atomic_load(&fail_ftruncate))
		return -EIO;
	return ftruncate(fd, len) ? -errno : 0;
}

static int u_fallocate(int fd, int m, off_t off, off_t len)
{
	atomic_fetch_add(&n_fallocate, 1);
	if (atomic_load(&fail_fallocate))
		return -EOPNOTSUPP;
	return fallocate(fd, m, off, len) ? -errno : 0;
}

static int u_fcntl(int fd, int cmd, long arg)
{
	atomic_fetch_add(&n_fcntl, 1);
	if (atomic_load(&fail_fcntl))
		return -EINVAL;
	int r = fcntl(fd, cmd, arg);
	return r < 0 ? -errno : r;
}

/* With odd_short: the first data write reports 100 bytes fewer than it
 * wrote, so the rest continues at an unaligned offset (O_DIRECT must go). */
static long u_write_result(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)len;
	if (off >= 4096 && res > 4096 && atomic_exchange(&odd_short, 0))
		return res - 100;
	return res;
}

static const eng_io uhooks = {
	.uring_submit = u_submit,
	.ftruncate = u_ftruncate,
	.fallocate = u_fallocate,
	.fcntl = u_fcntl,
	.write_result = u_write_result,
};

static void u_reset(void)
{
	atomic_store(&sub_mode, SUB_NONE);
	atomic_store(&sub_err, 0);
	atomic_store(&n_submits, 0);
	atomic_store(&n_soft, 0);
	atomic_store(&n_partial, 0);
	atomic_store(&fail_ftruncate, 0);
	atomic_store(&fail_fallocate, 0);
	atomic_store(&fail_fcntl, 0);
	atomic_store(&odd_short, 0);
	atomic_store(&n_ftruncate, 0);
	atomic_store(&n_fallocate, 0);
	atomic_store(&n_fcntl, 0);
}

typedef struct watch {
	ckpt *c;
	uint64_t step;
	int close; /* ckpt_close instead of a save */
	int rc, done;
	pthread_mutex_t mu;
	pthread_cond_t cv;
} watch;

static void *watch_run(void *arg)
{
	watch *w = arg;
	int rc = w->close ? ckpt_close(w->c) : save_step(w->c, w->step);

	pthread_mutex_lock(&w->mu);
	w->rc = rc;
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* save_step (or ckpt_close) in a thread; fails the test if it has not
 * returned after 60 s (times $CKPT_TEST_TIMEOUT_MULT). */
static int watched(ckpt *c, uint64_t step, int close, const char *ctx)
{
	const char *m = getenv("CKPT_TEST_TIMEOUT_MULT");
	int secs = 60 * (m && atoi(m) > 0 ? atoi(m) : 1);
	watch w = { .c = c, .step = step, .close = close };
	struct timespec dl;
	pthread_t t;

	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, watch_run, &w), 0);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += secs;
	pthread_mutex_lock(&w.mu);
	while (!w.done &&
	       pthread_cond_timedwait(&w.cv, &w.mu, &dl) != ETIMEDOUT)
		;
	int done = w.done;
	pthread_mutex_unlock(&w.mu);
	ck_assert_msg(done, "%s: %s of step %llu hung (no return in %d s)",
		      ctx, close ? "ckpt_close" : "save",
		      (unsigned long long)step, secs);
	pthread_join(t, NULL);
	return w.rc;
}

/* Opens an io_uring handle (cfg 0: with O_DIRECT, 1: without); skips the
 * test (returns NULL) if this machine gives it no ring. */
static ckpt *open_uring(const char *dir, int direct, eng_io_stats *st)
{
	ckpt *c = open_cfg(dir, direct ? 0 : 2, 0);
	eng_io_set(&uhooks);
	u_reset();
	ck_assert_int_eq(watched(c, 1, 0, "plain save"), 0);
	eng_io_stats_get(c, st);
	if (st->uring_writes == 0 || (direct && st->direct_files == 0)) {
		eng_io_set(NULL);
		ckpt_close(c);
		return NULL;
	}
	ck_assert_int_eq(st->pwrite_writes, 0);
	return c;
}

START_TEST(test_submit_faults)
{
	static const int modes[] = { SUB_ERR_ONCE, SUB_ERR_ONCE, SUB_PARTIAL,
				     SUB_SOFT, SUB_SOFT_ALWAYS };
	static const int errs[] = { -EIO, -EINVAL, 0, 0, 0 };
	static const char *const names[] = { "submit -EIO", "submit -EINVAL",
					     "partial submit",
					     "EAGAIN/EBUSY", "EAGAIN forever" };
	int direct = _i / 5, k = _i % 5;
	const char *dir = tu_tmpdir();
	eng_io_stats a, b;
	char ctx[128];
	ckpt *c = open_uring(dir, direct, &a);

	if (!c)
		TU_SKIP("no io_uring (or O_DIRECT) here");
	snprintf(ctx, sizeof(ctx), "%s%s", names[k],
		 direct ? " +O_DIRECT" : "");
	atomic_store(&sub_err, errs[k]);
	atomic_store(&n_submits, 0);
	atomic_store(&sub_mode, modes[k]);
	int rc = watched(c, 2, 0, ctx);
	ck_assert_msg(rc == 0, "%s: %d %s", ctx, rc, ckpt_errmsg(c));
	eng_io_stats_get(c, &b);
	int hard = modes[k] == SUB_ERR_ONCE || modes[k] == SUB_SOFT_ALWAYS;
	ck_assert_msg(b.uring_fallbacks == (hard ? 1u : 0u),
		      "%s: %llu fallbacks", ctx,
		      (unsigned long long)b.uring_fallbacks);
	if (hard) {
		/* the rest went through pwrite, and the handle stays there */
		ck_assert_uint_gt(b.pwrite_writes, 0);
		ck_assert_msg(strstr(ckpt_errmsg(c), "io_uring submit"),
			      "%s: message: %s", ctx, ckpt_errmsg(c));
	} else {
		ck_assert_uint_eq(b.pwrite_writes, 0);
		ck_assert_uint_gt(b.uring_writes, a.uring_writes);
		ck_assert_uint_gt(b.submit_retries, 0);
		ck_assert_int_gt(modes[k] == SUB_PARTIAL ?
					 atomic_load(&n_partial) :
					 atomic_load(&n_soft),
				 0);
	}
	atomic_store(&sub_mode, SUB_NONE);
	ck_assert_int_eq(watched(c, 3, 0, ctx), 0);
	eng_io_stats_get(c, &a);
	if (hard)
		ck_assert_uint_eq(a.uring_writes, b.uring_writes);
	else
		ck_assert_uint_gt(a.uring_writes, b.uring_writes);
	for (uint64_t s = 1; s <= 3; s++)
		check_step(dir, s, ctx);
	ck_assert_int_eq(watched(c, 0, 1, ctx), 0);
	eng_io_set(NULL);
}
END_TEST

/* A hard submit error on an O_DIRECT handle needs fcntl to drop O_DIRECT
 * for pwrite; if that fails too the save fails cleanly, and the handle
 * (now without a ring and O_DIRECT) saves the step again. */
START_TEST(test_fallback_fcntl_fails)
{
	const char *dir = tu_tmpdir();
	eng_io_stats st;
	ckpt *c = open_uring(dir, 1, &st);

	if (!c)
		TU_SKIP("no io_uring with O_DIRECT here");
	atomic_store(&sub_err, -EIO);
	atomic_store(&n_submits, 0);
	atomic_store(&sub_mode, SUB_ERR_ONCE);
	atomic_store(&fail_fcntl, 1);
	int rc = watched(c, 2, 0, "fallback, fcntl fails");
	ck_assert_msg(rc == -EINVAL, "rc %d %s", rc, ckpt_errmsg(c));
	ck_assert_msg(strstr(ckpt_errmsg(c), "O_DIRECT") &&
			      strstr(ckpt_errmsg(c), ".shard"),
		      "message: %s", ckpt_errmsg(c));
	ck_assert_int_eq(listed(c, 2), 0);
	atomic_store(&fail_fcntl, 0);
	atomic_store(&sub_mode, SUB_NONE);
	ck_assert_int_eq(watched(c, 2, 0, "after the fallback"), 0);
	check_step(dir, 1, "fallback");
	check_step(dir, 2, "fallback");
	ck_assert_int_eq(watched(c, 0, 1, "close"), 0);
	eng_io_set(NULL);
}
END_TEST

/* ftruncate (trimming preallocated O_DIRECT files) fails: the save fails
 * with the error and names the file. fallocate failing is harmless (only
 * an optimisation). An unaligned short write on O_DIRECT continues
 * buffered (fcntl); if that fcntl fails, the save fails cleanly. */
START_TEST(test_truncate_fallocate_fcntl)
{
	const char *dir = tu_tmpdir();
	eng_io_stats st;
	ckpt *c = open_uring(dir, 1, &st);

	if (!c)
		TU_SKIP("no io_uring with O_DIRECT here");
	ck_assert_int_gt(atomic_load(&n_fallocate), 0);
	if (atomic_load(&n_ftruncate) == 0) {
		ckpt_close(c);
		eng_io_set(NULL);
		TU_SKIP("this file system does not preallocate");
	}
	atomic_store(&fail_ftruncate, 1);
	int rc = watched(c, 2, 0, "ftruncate");
	ck_assert_msg(rc == -EIO, "ftruncate: %d %s", rc, ckpt_errmsg(c));
	ck_assert_msg(strstr(ckpt_errmsg(c), "truncate"), "%s",
		      ckpt_errmsg(c));
	ck_assert_int_eq(listed(c, 2), 0);
	atomic_store(&fail_ftruncate, 0);

	atomic_store(&fail_fallocate, 1);
	atomic_store(&n_ftruncate, 0);
	ck_assert_int_eq(watched(c, 2, 0, "fallocate fails"), 0);
	ck_assert_int_eq(atomic_load(&n_ftruncate), 0); /* nothing to trim */
	atomic_store(&fail_fallocate, 0);

	atomic_store(&odd_short, 1);
	atomic_store(&n_fcntl, 0);
	ck_assert_int_eq(watched(c, 3, 0, "unaligned short write"), 0);
	ck_assert_int_eq(atomic_load(&odd_short), 0);
	ck_assert_int_ge(atomic_load(&n_fcntl), 2); /* F_GETFL + F_SETFL */

	atomic_store(&odd_short, 1);
	atomic_store(&fail_fcntl, 1);
	rc = watched(c, 4, 0, "fcntl fails");
	ck_assert_msg(rc == -EINVAL, "fcntl: %d %s", rc, ckpt_errmsg(c));
	ck_assert_int_eq(listed(c, 4), 0);
	atomic_store(&fail_fcntl, 0);
	for (uint64_t s = 1; s <= 3; s++)
		check_step(dir, s, "truncate/fallocate/fcntl");
	ck_assert_int_eq(watched(c, 0, 1, "close"), 0);
	eng_io_set(NULL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("faults");
	TCase *tc = tu_tcase("faults", 240);
	tcase_add_loop_test(tc, test_enospc_nth_write, 0, 4);
	tcase_add_loop_test(tc, test_borrow_faults, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_write, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_fsync, 0, 4);
	tcase_add_loop_test(tc, test_eio_nth_rename, 0, 4);
	tcase_add_loop_test(tc, test_enospc_nth_create, 0, 4);
	tcase_add_loop_test(tc, test_commit_faults, 0, 4);
	tcase_add_loop_test(tc, test_short_writes, 0, 4);
	tcase_add_loop_test(tc, test_read_faults, 0, 4);
	suite_add_tcase(s, tc);
	TCase *tu = tu_tcase("uring", 240);
	tcase_add_loop_test(tu, test_submit_faults, 0, 10);
	tcase_add_test(tu, test_fallback_fcntl_fails);
	tcase_add_test(tu, test_truncate_fallocate_fcntl);
	suite_add_tcase(s, tu);
	return tu_main(s);
}
