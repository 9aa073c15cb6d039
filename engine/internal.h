/*
 * internal.h - what the engine's files share. Not installed, not API.
 *
 * Prefix `eng_` for everything here. The engine uses format/ (fmt.h); tools
 * and bench use only ckpt.h.
 */
#ifndef CKPT_ENGINE_INTERNAL_H
#define CKPT_ENGINE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.h"
#include "backend.h"
#include "fmt.h"

#define ENG_ERRMSG_MAX 1024
/* Every flag of ckpt_settings. ckpt_open and ckpt_reader_open accept the
 * same set, so one settings struct serves both; a reader ignores the
 * save-side ones (MANUAL_COMMIT, WATCH, DEDUP). */
#define ENG_SETTINGS_FLAGS                                             \
	(CKPT_F_NO_DIRECT | CKPT_F_MANUAL_COMMIT | CKPT_F_NO_URING |   \
	 CKPT_F_WATCH | CKPT_F_DEDUP)

/* ---- errors ---------------------------------------------------------- */

/*
 * Formats a message into buf (a handle's last-error buffer of
 * ENG_ERRMSG_MAX bytes; may be NULL) and into the calling thread's last
 * message, and returns `code` so callers can write
 *     return eng_err(c->errmsg, -EINVAL, "tensor %zu: ...", i);
 */
int eng_err(char *buf, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int eng_verr(char *buf, int code, const char *fmt, va_list ap);
/* The calling thread's last message ("" if none). */
const char *eng_tls_errmsg(void);

/* ---- the I/O table ---------------------------------------------------- */

struct io_uring;

/*
 * Every file-system call of the engine goes through this table so tests
 * can inject ENOSPC, EIO, short writes and crashes. All functions return
 * -errno on failure (never set errno as their only report).
 *
 * write_result / read_result see the outcome of every data write/read the
 * engine performed, whether through io_uring or pwrite/pread (res is the
 * byte count or -errno) and may replace it with a -errno or a smaller
 * count; the engine must then behave exactly as if the kernel had said so
 * (short counts are continued, errors fail the save or load).
 *
 * uring_submit stands for io_uring_submit(): it returns how many queued
 * entries the kernel took (possibly fewer than queued; the rest stay in
 * the ring for the next call) or -errno. A hook may take fewer by calling
 * the real one with some entries held back (see tests/test_faults.c).
 * NULL members mean "the real thing".
 */
typedef struct eng_io {
	int (*open)(const char *path, int flags, mode_t mode);
	int (*close)(int fd);
	ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
	ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
	int (*fsync)(int fd);
	int (*fdatasync)(int fd);
	int (*rename)(const char *from, const char *to);
	int (*unlink)(const char *path);
	int (*mkdir)(const char *path, mode_t mode);
	int (*rmdir)(const char *path);
	/* rename that fails with -EEXIST if `to` exists; -EINVAL if the file
	 * system cannot (eng_rename_noreplace then uses link + unlink). */
	int (*rename_noreplace)(const char *from, const char *to);
	int (*link)(const char *from, const char *to);
	long (*write_result)(int fd, uint64_t off, size_t len, long res);
	long (*read_result)(int fd, uint64_t off, size_t len, long res);
	int (*ftruncate)(int fd, off_t len);
	int (*fallocate)(int fd, int mode, off_t off, off_t len);
	int (*fcntl)(int fd, int cmd, long arg);
	int (*uring_submit)(struct io_uring *ring);
} eng_io;

/*
 * Which I/O paths a save handle took, so a test that claims a path can
 * check it did (tests/test_roundtrip.c, test_faults.c). Counts since
 * ckpt_open(); a write continued after a short count counts again.
 */
typedef struct eng_io_stats {
	uint64_t uring_writes;    /* write entries the kernel took */
	uint64_t pwrite_writes;   /* writes done with pwrite */
	uint64_t direct_files;    /* shard files opened with O_DIRECT */
	uint64_t submit_retries;  /* partial, EAGAIN or EBUSY submits */
	uint64_t uring_fallbacks; /* hard ring errors: pwrite from then on */
	uint64_t uring_stalls;    /* rings abandoned: no write came back */
} eng_io_stats;
void eng_io_stats_get(const ckpt *c, eng_io_stats *out);

/*
 * The same for a reader's data path: the chunk and shard-header reads of
 * the read pipeline (ckpt_read*, ckpt_reader_verify). COMMIT and the index
 * files, read whole at open, and ckpt_reader_copy's block copies are not
 * counted. Counts since ckpt_reader_open(); a read continued after a short
 * count counts again.
 */
typedef struct eng_reader_io_stats {
	uint64_t uring_reads;     /* read entries the kernel took */
	uint64_t pread_reads;     /* reads (or their rest) done with pread */
	uint64_t direct_files;    /* shard files opened with O_DIRECT */
	uint64_t uring_fallbacks; /* no ring, or a batch's ring broke */
	uint64_t uring_stalls;    /* rings abandoned: no read came back */
} eng_reader_io_stats;
void eng_reader_io_stats_get(const ckpt_reader *r, eng_reader_io_stats *out);

/* How long a reader waits with reads in its ring and none coming back
 * before it abandons the ring (default 30000 ms; tests shorten it). */
void eng_reader_stall_ms_set(unsigned ms);
/* The same for the save writer's ring (sink_local.c, ls_stalled); 0
 * restores the default. */
void eng_writer_stall_ms_set(unsigned ms);

/* Installs a table for the whole process (tests only); NULL restores the
 * real one. Members left NULL fall back to the real calls. */
void eng_io_set(const eng_io *io);

int eng_open(const char *path, int flags, mode_t mode); /* fd or -errno */
int eng_close(int fd);
/* pwrite/pread the whole range: loops over short counts; returns 0 or
 * -errno (-EIO if the file ends early on read). Results pass through
 * write_result/read_result. */
int eng_pwrite_all(int fd, const void *buf, size_t n, uint64_t off);
int eng_pread_all(int fd, void *buf, size_t n, uint64_t off);
int eng_fsync(int fd);
int eng_fdatasync(int fd);
int eng_rename(const char *from, const char *to);
int eng_unlink(const char *path);
/* Creates `to` from `from` only if `to` does not exist (-EEXIST):
 * renameat2(RENAME_NOREPLACE), or link() + unlink(from) where the file
 * system does not support it. */
int eng_rename_noreplace(const char *from, const char *to);
int eng_link(const char *from, const char *to);
int eng_mkdir(const char *path, mode_t mode); /* EEXIST is success */
int eng_rmdir(const char *path);
int eng_ftruncate(int fd, off_t len);
int eng_fallocate(int fd, int mode, off_t off, off_t len);
/* fcntl with an integer argument: the result (>= 0) or -errno. */
int eng_fcntl(int fd, int cmd, long arg);
/* io_uring_submit(): entries taken (>= 0) or -errno. */
int eng_uring_submit(struct io_uring *ring);
/* io_uring_queue_init / io_uring_queue_exit for every ring of the engine:
 * they also tell ThreadSanitizer that a ring mapped where an old one was
 * comes after it (see io.c). */
int eng_uring_queue_init(unsigned entries, struct io_uring *ring,
			 unsigned flags);
void eng_uring_queue_exit(struct io_uring *ring);
/* Filters for io_uring completions (see write_result above). */
long eng_filter_write(int fd, uint64_t off, size_t len, long res);
long eng_filter_read(int fd, uint64_t off, size_t len, long res);

/* ---- paths and small files (util.c, backend_posix.c) ------------------ */

/* snprintf into a malloc'd string; NULL on ENOMEM. */
char *eng_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fsync a directory. */
int eng_fsync_dir(const char *dir);
/* Reads a whole file of at most max_len bytes into a malloc'd buffer.
 * -EFBIG (with message) if larger. */
int eng_read_file(const char *path, uint64_t max_len, uint8_t **out,
		  size_t *out_len, char *errbuf);
/* Writes dir/name atomically: a unique temporary (eng_tmp_name), fsync,
 * rename, fsync dir. */
int eng_write_file_atomic(const char *dir, const char *name,
			  const void *buf, size_t len, char *errbuf);
/* Creates dir/name only if it does not exist (CKPT_E_EXISTS otherwise),
 * atomically across processes, durable when it returns (see
 * backend_posix.c). */
int eng_create_file(const char *dir, const char *name, const void *buf,
		    size_t len, char *errbuf);
/* Recursively removes a step directory's files and the directory. */
int eng_remove_tree(const char *dir, uint64_t *bytes_freed);

/* 1 if `dir` supports O_DIRECT (probed by writing a 4 KiB file). */
int eng_probe_direct(const char *dir);

/* ---- committed steps (root.c) ----------------------------------------- */

/*
 * Everything here takes a root as given to ckpt_open (a directory, later
 * also gs://...) and works through the backend (backend.h). The newest
 * committed step is found without decoding every commit record: step names
 * are listed, sorted descending, and records validated newest first until
 * one is valid.
 */

/* Loads and validates root/step-N/COMMIT. CKPT_E_NOTFOUND if absent. */
int eng_load_commit(const char *root, uint64_t step, fmt_commit *cm,
		    char *errbuf);
/* The same through an open location. */
int eng_loc_load_commit(eng_loc *l, uint64_t step, fmt_commit *cm,
			char *errbuf);
/* Commit records decoded by eng_load_commit since the process started
 * (tests check that finding the newest step does not decode them all). */
unsigned long eng_commit_decodes(void);
/*
 * Step directories under root, ascending, each flagged committed or not
 * (committed = COMMIT present and valid; every record is decoded). *out
 * malloc'd.
 */
typedef struct eng_step_ent {
	uint64_t step;
	int committed;
} eng_step_ent;
int eng_scan_steps(const char *root, eng_step_ent **out, size_t *count,
		   char *errbuf);
/* Names only: the steps present under root, ascending, committed = -1
 * (unknown). */
int eng_list_steps(const char *root, eng_step_ent **out, size_t *count,
		   char *errbuf);
/* Newest committed step (the `latest` pointer is a hint; a newer committed
 * step found by scanning wins). CKPT_E_NOTFOUND if none. Decodes commit
 * records newest first, stopping at the first valid one. */
int eng_resolve_latest(const char *root, uint64_t *step, char *errbuf);
/* eng_advance_latest (backend.h) on root: `latest` only moves forward. */
int eng_move_latest(const char *root, uint64_t step, char *errbuf);
/* Reads the document root/dname/name (at most max_len bytes) whole through
 * the backend: commit records and indexes for the reader. */
int eng_get_doc(const char *root, const char *dname, const char *name,
		uint64_t max_len, uint8_t **out, size_t *out_len,
		char *errbuf);

/* Number of online CPUs, at least 1. */
unsigned eng_ncpus(void);
/* Hint: fault in the pages of [p, p+n) writable in one call
 * (MADV_POPULATE_WRITE) before they are written, instead of one page
 * fault per 4 KiB. Contents are unchanged; ranges under 64 KiB, errors
 * and kernels without it (before 5.14) leave the writes to fault as
 * usual. */
void eng_prefault_write(void *p, size_t n);
/* CLOCK_REALTIME / CLOCK_MONOTONIC in ns. */
int64_t eng_unix_ns(void);
int64_t eng_mono_ns(void);
/* *dl = CLOCK_REALTIME now + ms (ms < 0: now), for
 * pthread_cond_timedwait. */
struct timespec;
void eng_realtime_after_ms(struct timespec *dl, int ms);

#endif /* CKPT_ENGINE_INTERNAL_H */
