/*
 * testutil.h - helpers shared by the Check suites of ckpt.
 *
 * Temp dirs: tu_main() creates one session directory per test binary
 * ($TMPDIR or /tmp) and removes it when the run ends, whatever happened to
 * the forked test processes; tu_tmpdir() makes a fresh directory inside it
 * for one test and also removes it at exit of that test's process.
 *
 * Data: everything is a deterministic function of a 64-bit seed (xorshift64*
 * plus plain IEEE arithmetic, no libm), so a checkpoint written by one
 * process (or frozen in tests/golden) can be checked by regenerating.
 */
#ifndef CKPT_TESTUTIL_H
#define CKPT_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <sys/types.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ckpt.h"

/* ---- running ---- */

/* Runs the suite (CK_FORK unless CK_FORK=no), cleans the session temp
 * directory, returns the process exit status (0 = all passed). */
int tu_main(Suite *s);
/* A TCase with a timeout in seconds (scaled by $CKPT_TEST_TIMEOUT_MULT). */
TCase *tu_tcase(const char *name, double timeout_s);
/* Skip the whole binary: prints why and exits 77 (meson's "skipped"). */
void tu_skip_all(const char *why) __attribute__((noreturn));
/* Skip one test: prints why; the caller returns (the test then passes). */
#define TU_SKIP(why)                                               \
	do {                                                       \
		fprintf(stderr, "SKIP %s: %s\n", __func__, (why)); \
		return;                                            \
	} while (0)

/* CLOCK_MONOTONIC in seconds (for bounds on waits, never a measure). */
double tu_now_s(void);
/* Fresh empty directory for the calling test; removed at exit. The string
 * stays valid until exit. */
const char *tu_tmpdir(void);
/* malloc'd printf; aborts on ENOMEM. */
char *tu_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Recursively removes a path (file or directory). Returns 0 or -errno. */
int tu_rm_rf(const char *path);
/* Recursively copies directory src to dst (created). 0 or -errno. */
int tu_copy_tree(const char *src, const char *dst);

/* ---- deterministic data ---- */

typedef struct tu_rng {
	uint64_t s;
} tu_rng;

void tu_rng_seed(tu_rng *r, uint64_t seed);
uint64_t tu_rng_next(tu_rng *r);
/* uniform in [0, n) (n > 0) */
uint64_t tu_rng_below(tu_rng *r, uint64_t n);
/* uniform double in [0, 1) */
double tu_rng_unit(tu_rng *r);
/* approx. N(0,1): Irwin-Hall sum of 12 uniforms - 6 (no libm) */
double tu_rng_normal(tu_rng *r);

/* 64-bit hash of a string (FNV-1a), to derive seeds from names. */
uint64_t tu_hash_str(const char *s);

uint16_t tu_f32_to_bf16(float f); /* round to nearest even */
uint16_t tu_f32_to_f16(float f);  /* round to nearest even */

/* Random bytes. */
void tu_fill_bytes(void *buf, size_t n, uint64_t seed);
/* bf16 values ~ N(0, sd). */
void tu_fill_bf16_normal(uint16_t *buf, size_t n, uint64_t seed, double sd);
/* Content typical for `dtype`: normal floats (sd 0.02 for 16-bit floats,
 * 1.0 otherwise), 0/1 for bool, random small/large integers. Any nbytes
 * (a partial trailing element is filled with random bytes). */
void tu_fill_dtype(int dtype, void *buf, size_t nbytes, uint64_t seed);

/* ---- tensor sets ---- */

typedef struct tu_tensor {
	char *name;
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[CKPT_MAX_NDIM];
	int sliced;
	uint64_t off[CKPT_MAX_NDIM];
	uint64_t ext[CKPT_MAX_NDIM];
	void *data; /* slice bytes (whole array when not sliced) */
	uint64_t nbytes;
} tu_tensor;

typedef struct tu_set {
	tu_tensor *t;
	size_t n, cap;
} tu_set;

void tu_set_init(tu_set *s);
void tu_set_free(tu_set *s);
/* Adds a whole tensor filled by tu_fill_dtype(seed). ndim entries of shape.
 * Returns the entry (stable until the next add). */
tu_tensor *tu_set_add(tu_set *s, const char *name, int dtype, uint32_t ndim,
		      const uint64_t *shape, uint64_t seed);
/* Same, but leaves the data uninitialized for the caller to fill. */
tu_tensor *tu_set_add_nofill(tu_set *s, const char *name, int dtype,
			     uint32_t ndim, const uint64_t *shape);
/* Adds a slice [off, off+ext) of a global array whose full content is
 * tu_fill_dtype(seed) over the whole shape (so slices of one array saved
 * by different hosts fit together). */
tu_tensor *tu_set_add_slice(tu_set *s, const char *name, int dtype,
			    uint32_t ndim, const uint64_t *shape,
			    const uint64_t *off, const uint64_t *ext,
			    uint64_t seed);
/* Fills out[0..s->n) (caller-allocated) with views of the set. */
void tu_set_view(const tu_set *s, ckpt_tensor *out);
/* A 1-D U8 tensor `name` over data[0..n); *dim (the caller's, alive as
 * long as the tensor) holds its shape. */
ckpt_tensor tu_bytes_tensor(const char *name, void *data, uint64_t n,
			    uint64_t *dim);
/* ckpt_save of the whole set; returns its result. */
int tu_save_async(ckpt *c, uint64_t step, const tu_set *s);
/* ckpt_save + ckpt_wait; returns the first error. */
int tu_save(ckpt *c, uint64_t step, const tu_set *s);
/* Sum of nbytes of the set. */
uint64_t tu_set_bytes(const tu_set *s);

/* Full content of a global array generated with `seed` (malloc'd). */
void *tu_global_data(int dtype, uint32_t ndim, const uint64_t *shape,
		     uint64_t seed, uint64_t *nbytes);
/* Copies box [off, off+ext) of a row-major array `src` of `shape` into
 * dst (row-major box). */
void tu_extract_box(const void *src, uint32_t ndim, const uint64_t *shape,
		    size_t elem, const uint64_t *off, const uint64_t *ext,
		    void *dst);
uint64_t tu_count(uint32_t ndim, const uint64_t *dims);

/*
 * Reads every tensor of the set through `r` and compares the bytes. Sliced
 * entries are read with ckpt_read_slice on their box. Returns 0 if all
 * equal, else the first error code from the reader or 1 for a content
 * mismatch; a description goes to `why` (may be NULL).
 */
int tu_check_set(ckpt_reader *r, const tu_set *s, char *why, size_t whylen);
/* Opens root/step (or CKPT_LATEST), verifies and checks the set. */
int tu_check_root(const char *root, uint64_t step, const tu_set *s, char *why,
		  size_t whylen);

/* ---- files ---- */

/* Step directory path (malloc'd). */
char *tu_step_dir(const char *root, uint64_t step);
/* Sorted names of regular files in dir (malloc'd array of malloc'd
 * strings). Returns count or -errno. */
int tu_list_files(const char *dir, char ***names);
void tu_free_names(char **names, int n);
/* Number of entries in dir whose name ends with suffix (recursive). */
int tu_count_suffix(const char *dir, const char *suffix);
int64_t tu_file_size(const char *path);
int tu_flip_bit(const char *path, uint64_t off, unsigned bit);
int tu_truncate(const char *path, uint64_t len);
/* Whole file into malloc'd buffer; returns 0 or -errno. */
int tu_read_file(const char *path, uint8_t **buf, size_t *len);
/* Replaces the file's content with buf[0..len). */
int tu_write_file(const char *path, const void *buf, size_t len);
int tu_exists(const char *path);

/* ---- I/O paths ---- */

/* 1 if this process can set up an io_uring ring. */
int tu_uring_works(void);
/* For a uring_submit hook (struct io_uring_sqe *): if sqe is an async
 * cancel and `on`, turns it into a NOP with the same user_data (the ring
 * tests' "the cancel does nothing") and returns 1; else 0. */
int tu_sqe_cancel_to_nop(void *sqe, int on);
/* 0 if reader r's data path since open (eng_reader_io_stats) is the one
 * the reader flags ask for on this machine: io_uring reads only unless
 * CKPT_F_NO_URING or no ring can be set up here (then preads only, and
 * one fallback in the latter case); shard files opened with O_DIRECT iff
 * not CKPT_F_NO_DIRECT and the file system of root takes it. Else -1 with
 * why set. The path taken is printed to stderr. */
int tu_check_reader_path(ckpt_reader *r, uint32_t flags, const char *root,
			 char *why, size_t whylen);

/* Settings with small, test-friendly values: staging 8 MiB, chunk
 * 64 KiB, 2 threads, files_per_host 2. */
void tu_settings(ckpt_settings *s);

/* ---- hangs (tu_hang.c) ---- */

/* Prints, to stderr, every thread's stack of pid and of its descendants
 * (gdb -batch; a note if gdb is missing), headed by why. */
void tu_dump_stacks(pid_t pid, const char *why);
/* After `seconds`, unless disarmed first, a background shell prints the
 * stacks of this process and its descendants, headed by what (so a test
 * that meson then kills for its timeout shows where it hung). One at a
 * time: arming again replaces the previous one. */
void tu_watchdog_arm(double seconds, const char *what);
void tu_watchdog_disarm(void);

/* ---- loopback servers (tests/servers/) ---- */

typedef struct tu_server {
	pid_t pid;
	char host[32]; /* 127.0.0.1:PORT */
	char url[64];  /* http://127.0.0.1:PORT */
	char dir[256]; /* its port file; removed by tu_server_stop */
} tu_server;

/*
 * Runs /usr/bin/python3 SCRIPT --port-file FILE ARGS... (args NULL-
 * terminated, may be NULL) and waits until it has written its port.
 * SCRIPT is `script` when it holds a '/', else
 * $CKPT_TEST_SRCDIR/servers/SCRIPT (tests/ without it). Its stdout goes to
 * /dev/null unless $TU_SERVER_VERBOSE is set; it gets SIGTERM when the
 * calling thread dies, so a crashed test leaves no server behind. Skips
 * the whole binary (77) when python3 or SCRIPT is missing; exits 1 with a
 * message if the server exits, or has not listened within 60 s (scaled
 * by $CKPT_TEST_TIMEOUT_MULT).
 */
void tu_server_start(tu_server *s, const char *script, const char *const *args);
/* SIGTERM, then its wait status (-1 if it was not running). */
int tu_server_stop(tu_server *s);

#endif
