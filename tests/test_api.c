/*
 * test_api.c - misuse of the public API: every bad argument is refused
 * with the documented code and a message, nothing crashes, and a refused
 * call leaves the handle usable.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "save_internal.h"
#include "testutil.h"

static ckpt *open_root(const char *dir)
{
	ckpt_settings s;
	tu_settings(&s);
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "ckpt_open: %d %s", rc, ckpt_errmsg(NULL));
	ck_assert_ptr_nonnull(c);
	return c;
}

/* One valid tensor, used as a base for the bad variants. */
static uint64_t g_shape[2] = {4, 8};
static float g_data[32];

static ckpt_tensor good_tensor(const char *name)
{
	ckpt_tensor t;
	memset(&t, 0, sizeof(t));
	t.name = name;
	t.dtype = CKPT_F32;
	t.ndim = 2;
	t.shape = g_shape;
	t.data = g_data;
	t.nbytes = sizeof(g_data);
	return t;
}

/* The save must be refused with `want` (or any negative code if want==0),
 * with a non-empty message, and nothing must be committed. */
static void expect_refused(ckpt *c, const char *root, const ckpt_tensor *t,
			   size_t n, int want, const char *must_name)
{
	int rc = ckpt_save(c, 1, t, n);
	if (rc == 0) {
		int w = ckpt_wait(c);
		ck_abort_msg("save accepted (wait=%d), expected %d (%s)", w,
			     want, ckpt_strerror(want));
	}
	if (want)
		ck_assert_msg(rc == want, "got %d (%s: %s), want %d (%s)", rc,
			      ckpt_strerror(rc), ckpt_errmsg(c), want,
			      ckpt_strerror(want));
	else
		ck_assert_int_lt(rc, 0);
	const char *m = ckpt_errmsg(c);
	ck_assert_ptr_nonnull(m);
	ck_assert_msg(m[0] != 0, "empty error message for %d", rc);
	if (must_name)
		ck_assert_msg(strstr(m, must_name),
			      "message \"%s\" does not name \"%s\"", m,
			      must_name);
	uint64_t latest;
	ck_assert_int_eq(ckpt_latest(c, &latest), CKPT_E_NOTFOUND);
	(void)root;
}

START_TEST(test_null_args)
{
	const char *dir = tu_tmpdir();
	ckpt *c = (ckpt *)0x1;
	ck_assert_int_eq(ckpt_open(NULL, dir, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_open(&c, NULL, NULL), -EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_msg(ckpt_errmsg(NULL)[0], "no thread message after failed open");
	c = (ckpt *)0x1;
	ck_assert_int_eq(ckpt_open(&c, "", NULL), -EINVAL);
	ck_assert_ptr_null(c);

	ckpt_tensor t = good_tensor("a");
	ck_assert_int_eq(ckpt_save(NULL, 1, &t, 1), -EINVAL);
	ck_assert_int_eq(ckpt_wait(NULL), -EINVAL);
	ck_assert_int_eq(ckpt_poll(NULL, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_commit(NULL, 1), -EINVAL);
	uint64_t st;
	ck_assert_int_eq(ckpt_latest(NULL, &st), -EINVAL);
	ckpt_step_info *li;
	size_t n;
	ck_assert_int_eq(ckpt_list(NULL, &li, &n), -EINVAL);
	ck_assert_int_eq(ckpt_gc(NULL, 0, 0, 0, NULL, NULL, NULL), -EINVAL);

	c = open_root(dir);
	ck_assert_int_eq(ckpt_save(c, 1, NULL, 1), -EINVAL);
	ck_assert_int_eq(ckpt_latest(c, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_list(c, NULL, &n), -EINVAL);
	ck_assert_int_eq(ckpt_list(c, &li, NULL), -EINVAL);

	ckpt_reader *r = (ckpt_reader *)0x1;
	ck_assert_int_eq(ckpt_reader_open(NULL, dir, CKPT_LATEST, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_reader_open(&r, NULL, CKPT_LATEST, NULL), -EINVAL);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(ckpt_read(NULL, "a", g_data, sizeof(g_data)), -EINVAL);
	ck_assert_int_eq(ckpt_reader_verify(NULL, NULL, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_read_batch(NULL, NULL, 1), -EINVAL);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_destructors_null)
{
	ck_assert_int_eq(ckpt_close(NULL), 0);
	ckpt_reader_close(NULL);
	ckpt_free(NULL);
	ck_assert_ptr_nonnull(ckpt_errmsg(NULL));
	ck_assert_ptr_nonnull(ckpt_reader_errmsg(NULL));
}
END_TEST

START_TEST(test_bad_names)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t;

	t = good_tensor(NULL);
	expect_refused(c, dir, &t, 1, -EINVAL, NULL);
	t = good_tensor("");
	expect_refused(c, dir, &t, 1, -EINVAL, NULL);
	static const char *const bad_utf8[] = {
		"\xff", "ab\xfe", "\xc3", "\xc0\x80", "\xe0\x80\xaf",
		"\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* > U+10FFFF */,
		"x\x80y",
	};
	for (size_t i = 0; i < sizeof(bad_utf8) / sizeof(*bad_utf8); i++) {
		t = good_tensor(bad_utf8[i]);
		expect_refused(c, dir, &t, 1, -EINVAL, NULL);
	}
	char *longname = malloc(CKPT_MAX_NAME + 2);
	memset(longname, 'n', CKPT_MAX_NAME + 1);
	longname[CKPT_MAX_NAME + 1] = 0;
	t = good_tensor(longname);
	expect_refused(c, dir, &t, 1, -EINVAL, NULL);

	/* the bad tensor is the second one */
	ckpt_tensor two[2] = {good_tensor("fine"), good_tensor("bad\xff")};
	expect_refused(c, dir, two, 2, -EINVAL, NULL);

	/* exactly CKPT_MAX_NAME bytes is fine */
	longname[CKPT_MAX_NAME] = 0;
	t = good_tensor(longname);
	ck_assert_int_eq(ckpt_save(c, 2, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	free(longname);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_dupname)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t[3] = {good_tensor("layer.0.w"), good_tensor("other"),
			    good_tensor("layer.0.w")};
	expect_refused(c, dir, t, 3, CKPT_E_DUPNAME, "layer.0.w");
	/* still usable */
	t[2].name = "layer.1.w";
	ck_assert_int_eq(ckpt_save(c, 1, t, 3), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_bad_tensor_fields)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t;

	static const int bad_dtypes[] = {CKPT_DTYPE_INVALID, CKPT_DTYPE_COUNT,
					 -1, 1000};
	for (size_t i = 0; i < 4; i++) {
		t = good_tensor("weights.bad_dtype");
		t.dtype = bad_dtypes[i];
		expect_refused(c, dir, &t, 1, -EINVAL, "weights.bad_dtype");
	}

	uint64_t big_shape[CKPT_MAX_NDIM + 1];
	for (int i = 0; i <= CKPT_MAX_NDIM; i++)
		big_shape[i] = 1;
	t = good_tensor("too.many.dims");
	t.ndim = CKPT_MAX_NDIM + 1;
	t.shape = big_shape;
	t.nbytes = 4;
	expect_refused(c, dir, &t, 1, -EINVAL, "too.many.dims");

	t = good_tensor("nbytes.short");
	t.nbytes = sizeof(g_data) - 4;
	expect_refused(c, dir, &t, 1, -EINVAL, "nbytes.short");
	t = good_tensor("nbytes.long");
	t.nbytes = sizeof(g_data) + 1;
	expect_refused(c, dir, &t, 1, -EINVAL, "nbytes.long");

	/* shape whose byte size overflows 64 bits */
	uint64_t huge[2] = {UINT64_MAX / 2, 3};
	t = good_tensor("overflow");
	t.shape = huge;
	t.nbytes = 24;
	expect_refused(c, dir, &t, 1, -EINVAL, "overflow");

	t = good_tensor("shape.null");
	t.shape = NULL;
	expect_refused(c, dir, &t, 1, -EINVAL, "shape.null");

	t = good_tensor("data.null");
	t.data = NULL;
	expect_refused(c, dir, &t, 1, -EINVAL, "data.null");

	/* flags and reserved fields must be zero (room to grow the ABI) */
	t = good_tensor("flags.set");
	t.flags = 1;
	expect_refused(c, dir, &t, 1, -EINVAL, "flags.set");
	t = good_tensor("reserved0.set");
	t.reserved0 = 1;
	expect_refused(c, dir, &t, 1, -EINVAL, "reserved0.set");
	t = good_tensor("reserved.set");
	t.reserved[1] = 1;
	expect_refused(c, dir, &t, 1, -EINVAL, "reserved.set");

	/* slices: outside the shape, overflow, one of offset/extent only,
	 * nbytes of the whole array instead of the slice */
	uint64_t off[2] = {2, 0}, ext[2] = {3, 8};
	t = good_tensor("slice.outside");
	t.slice_offset = off;
	t.slice_extent = ext;
	t.nbytes = 3 * 8 * 4;
	expect_refused(c, dir, &t, 1, -EINVAL, "slice.outside");

	uint64_t off2[2] = {UINT64_MAX, 0}, ext2[2] = {2, 8};
	t = good_tensor("slice.wrap");
	t.slice_offset = off2;
	t.slice_extent = ext2;
	t.nbytes = 2 * 8 * 4;
	expect_refused(c, dir, &t, 1, -EINVAL, "slice.wrap");

	uint64_t off3[2] = {0, 0}, ext3[2] = {2, 8};
	t = good_tensor("slice.no_extent");
	t.slice_offset = off3;
	t.nbytes = 2 * 8 * 4;
	expect_refused(c, dir, &t, 1, -EINVAL, "slice.no_extent");

	t = good_tensor("slice.nbytes");
	t.slice_offset = off3;
	t.slice_extent = ext3;
	t.nbytes = sizeof(g_data);
	expect_refused(c, dir, &t, 1, -EINVAL, "slice.nbytes");

	/* nothing was committed by any of these; a good save works */
	t = good_tensor("ok");
	ck_assert_int_eq(ckpt_save(c, 1, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ck_assert_int_eq(ckpt_close(c), 0);

	ckpt_reader *r;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), 1);
	ckpt_reader_close(r);
}
END_TEST

START_TEST(test_settings_validation)
{
	const char *dir = tu_tmpdir();
	ckpt_settings s;
	ckpt *c;
	static const char *const what[] = {
		"chunk 1000", "chunk 32 KiB", "chunk 64 KiB + 512",
		"chunk 128 MiB", "chunk 0", "codec -2", "codec 3",
		"host_index >= host_count", "host_count 0", "files_per_host 0",
		"files_per_host > max", "reserved", "unknown flag",
	};
	for (size_t i = 0; i < sizeof(what) / sizeof(*what); i++) {
		tu_settings(&s);
		switch (i) {
		case 0: s.chunk_bytes = 1000; break;
		case 1: s.chunk_bytes = 32 << 10; break;
		case 2: s.chunk_bytes = (64 << 10) + 512; break;
		case 3: s.chunk_bytes = 128u << 20; break;
		case 4: s.chunk_bytes = 0; break;
		case 5: s.codec = -2; break;
		case 6: s.codec = CKPT_CODEC_COUNT; break;
		case 7: s.host_index = 3; s.host_count = 3; break;
		case 8: s.host_count = 0; break;
		case 9: s.files_per_host = 0; break;
		case 10: s.files_per_host = 100000; break;
		case 11: s.reserved[3] = 1; break;
		case 12: s.flags = 1u << 30; break;
		}
		c = (ckpt *)0x1;
		int rc = ckpt_open(&c, dir, &s);
		if (rc == 0)
			ckpt_close(c);
		ck_assert_msg(rc == -EINVAL, "%s: ckpt_open returned %d",
			      what[i], rc);
		ck_assert_msg(c == NULL, "%s: *out not NULL", what[i]);
		ck_assert_msg(ckpt_errmsg(NULL)[0], "%s: no message", what[i]);
	}
	/* limits themselves are fine */
	tu_settings(&s);
	s.chunk_bytes = 64u << 20;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	ckpt_close(c);
	tu_settings(&s);
	s.chunk_bytes = 64u << 10;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	ckpt_close(c);
	ck_assert_int_eq(ckpt_open(&c, dir, NULL), 0);
	ckpt_close(c);

	/* a file where the root should be */
	char *f = tu_path("%s/plainfile", dir);
	ck_assert_int_eq(tu_write_file(f, "x", 1), 0);
	c = (ckpt *)0x1;
	ck_assert_int_lt(ckpt_open(&c, f, NULL), 0);
	ck_assert_ptr_null(c);
	free(f);
}
END_TEST

START_TEST(test_staging_zero)
{
	const char *dir = tu_tmpdir();
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	ckpt_tensor t = good_tensor("w");
	int rc = ckpt_save(c, 1, &t, 1);
	if (rc == 0)
		rc = ckpt_wait(c);
	ck_assert_msg(rc < 0, "staging 0 handle saved (rc %d)", rc);
	ck_assert_msg(ckpt_errmsg(c)[0], "no message");
	/* it can still list, gc, latest */
	ckpt_step_info *li = NULL;
	size_t n = 99;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 0);
	ckpt_free(li);
	uint64_t st;
	ck_assert_int_eq(ckpt_latest(c, &st), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, NULL), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_strerror)
{
	const char *unknown = ckpt_strerror(-30999);
	ck_assert_ptr_nonnull(unknown);
	ck_assert_ptr_nonnull(ckpt_strerror(0));
	ck_assert_ptr_nonnull(ckpt_strerror(12345));
	ck_assert_ptr_nonnull(ckpt_strerror(INT32_MIN));
	const char *seen[64];
	int ns = 0;
	for (int e = CKPT_E_CORRUPT; e >= CKPT_E_LAST; e--) {
		const char *m = ckpt_strerror(e);
		ck_assert_ptr_nonnull(m);
		ck_assert_msg(m[0], "empty text for %d", e);
		ck_assert_msg(strcmp(m, unknown), "code %d described as unknown", e);
		for (int i = 0; i < ns; i++)
			ck_assert_msg(strcmp(seen[i], m),
				      "codes share text \"%s\"", m);
		seen[ns++] = m;
	}
	/* every library code lives outside the errno range */
	ck_assert_int_lt(CKPT_E_CORRUPT, -4096);
	static const int errs[] = {ENOSPC, EIO, ENOENT, EINVAL, ENOMEM, EACCES};
	for (size_t i = 0; i < sizeof(errs) / sizeof(*errs); i++) {
		const char *m = ckpt_strerror(-errs[i]);
		ck_assert_ptr_nonnull(m);
		ck_assert_msg(strstr(m, strerror(errs[i])),
			      "ckpt_strerror(-%d) = \"%s\"", errs[i], m);
	}
	ck_assert_msg(ckpt_strerror(0)[0], "empty text for 0");
	ck_assert_msg(ckpt_version_string()[0], "empty version");
	ck_assert_uint_eq(ckpt_version_number(), CKPT_VERSION_NUMBER);
}
END_TEST

START_TEST(test_dtype_codec_names)
{
	static const size_t sizes[CKPT_DTYPE_COUNT] = {
		0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1};
	for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
		ck_assert_uint_eq(ckpt_dtype_size(d), sizes[d]);
		const char *n = ckpt_dtype_name(d);
		if (d == 0) {
			ck_assert_ptr_null(n);
			continue;
		}
		ck_assert_ptr_nonnull(n);
		ck_assert_int_eq(ckpt_dtype_from_name(n), d);
	}
	ck_assert_str_eq(ckpt_dtype_name(CKPT_BF16), "bf16");
	ck_assert_str_eq(ckpt_dtype_name(CKPT_F8E4M3), "f8e4m3");
	ck_assert_uint_eq(ckpt_dtype_size(-1), 0);
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_DTYPE_COUNT), 0);
	ck_assert_ptr_null(ckpt_dtype_name(CKPT_DTYPE_COUNT));
	ck_assert_int_eq(ckpt_dtype_from_name("nope"), CKPT_DTYPE_INVALID);
	ck_assert_str_eq(ckpt_codec_name(CKPT_CODEC_NONE), "none");
	ck_assert_str_eq(ckpt_codec_name(CKPT_CODEC_ZSTD), "zstd");
	ck_assert_str_eq(ckpt_codec_name(CKPT_CODEC_FLOAT), "float");
	for (int k = 0; k < CKPT_CODEC_COUNT; k++)
		ck_assert_int_eq(ckpt_codec_from_name(ckpt_codec_name(k)), k);
	ck_assert_int_eq(ckpt_codec_from_name("lz4"), CKPT_E_NOTFOUND);
}
END_TEST

/* ---- a gate in the I/O path keeps a save in flight; a fault fails it ---- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static atomic_int gate_enabled;
static atomic_int fail_armed;
static atomic_int fail_fired;

/* how long a wait for the engine's threads may take before it is a
 * failure (never a measure) */
#define PATIENCE_S 20

static void gate_wait(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += PATIENCE_S; /* never deadlock the suite */
	pthread_mutex_lock(&gate_mu);
	while (!gate_open)
		if (pthread_cond_timedwait(&gate_cv, &gate_mu, &ts))
			break;
	pthread_mutex_unlock(&gate_mu);
}

/* Only chunk writes (> 64 KiB: the tests use 64 KiB chunks of random
 * bytes, stored raw) are gated: they surely run in the background. */
static long hook_write_result(int fd, uint64_t off, size_t len, long res)
{
	(void)fd;
	(void)off;
	int gated = atomic_load(&gate_enabled);
	if (gated && len <= (64u << 10))
		return res; /* headers, metadata: pass */
	if (gated)
		gate_wait();
	if (atomic_load(&fail_armed) && res > 0) {
		atomic_store(&fail_fired, 1);
		return -ENOSPC;
	}
	return res;
}

static void gate_release(void)
{
	pthread_mutex_lock(&gate_mu);
	gate_open = 1;
	pthread_cond_broadcast(&gate_cv);
	pthread_mutex_unlock(&gate_mu);
}

static const eng_io hook_io = {.write_result = hook_write_result};

static void big_set(tu_set *set)
{
	uint64_t shape[1] = {1 << 20};
	tu_set_init(set);
	tu_set_add(set, "big", CKPT_U8, 1, shape, 7);
}

struct save_arg {
	ckpt *c;
	uint64_t step;
	int rc;
};

static void *save_thread(void *p)
{
	struct save_arg *a = p;
	ckpt_tensor t = good_tensor("other.thread");
	a->rc = ckpt_save(a->c, a->step, &t, 1);
	return NULL;
}

START_TEST(test_busy)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	tu_set set;
	big_set(&set);
	atomic_store(&gate_enabled, 1);
	eng_io_set(&hook_io);
	ck_assert_int_eq(tu_save_async(c, 1, &set), 0);

	ckpt_progress p;
	int prc = ckpt_poll(c, &p);
	ck_assert_msg(prc == 1, "poll while in flight = %d", prc);
	ck_assert_uint_eq(p.step, 1);
	ck_assert_msg(p.state == CKPT_STATE_WRITING ||
			      p.state == CKPT_STATE_STAGING,
		      "state %d", p.state);

	struct save_arg a = {c, 2, 0};
	pthread_t th;
	pthread_create(&th, NULL, save_thread, &a);
	pthread_join(th, NULL);
	ck_assert_msg(a.rc == CKPT_E_BUSY, "second save: %d (%s)", a.rc,
		      ckpt_strerror(a.rc));
	ck_assert_msg(ckpt_errmsg(c)[0], "no message for BUSY");
	/* same step from this thread too */
	ckpt_tensor t = good_tensor("x");
	ck_assert_int_eq(ckpt_save(c, 1, &t, 1), CKPT_E_BUSY);

	gate_release();
	ck_assert_int_eq(ckpt_wait(c), 0);
	eng_io_set(NULL);
	ck_assert_int_eq(ckpt_poll(c, &p), 0);
	ck_assert_int_eq(p.state, CKPT_STATE_DONE);

	/* BUSY did not consume anything: the handle saves again */
	a.rc = -1;
	pthread_create(&th, NULL, save_thread, &a);
	pthread_join(th, NULL);
	ck_assert_int_eq(a.rc, 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	uint64_t latest;
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_uint_eq(latest, 2);
	ck_assert_int_eq(ckpt_close(c), 0);
	char why[512];
	ck_assert_msg(tu_check_root(dir, 1, &set, why, sizeof(why)) == 0, "%s",
		      why);
	tu_set_free(&set);
}
END_TEST

START_TEST(test_exists)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	ck_assert_int_eq(ckpt_save(c, 5, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	int rc = ckpt_save(c, 5, &t, 1);
	ck_assert_msg(rc == CKPT_E_EXISTS, "re-save of committed step: %d", rc);
	ck_assert_msg(ckpt_errmsg(c)[0], "no message");
	/* a second handle on the same root sees it as well */
	ckpt *c2 = open_root(dir);
	ck_assert_int_eq(ckpt_save(c2, 5, &t, 1), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_commit(c2, 5), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_close(c2), 0);
	/* still the original data */
	ckpt_reader *r;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 5, NULL), 0);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ckpt_reader_close(r);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_reader_misuse)
{
	const char *dir = tu_tmpdir();
	ckpt_reader *r = (ckpt_reader *)0x1;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL),
			 CKPT_E_NOTFOUND);
	ck_assert_ptr_null(r);
	ck_assert_msg(ckpt_reader_errmsg(NULL)[0], "no message");
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 3, NULL), CKPT_E_NOTFOUND);

	ckpt *c = open_root(dir);
	uint64_t st;
	ck_assert_int_eq(ckpt_latest(c, &st), CKPT_E_NOTFOUND);
	ckpt_step_info *li = NULL;
	size_t n = 7;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 0);
	ckpt_free(li);

	ckpt_tensor t = good_tensor("w");
	for (int i = 0; i < 32; i++)
		g_data[i] = (float)i;
	ck_assert_int_eq(ckpt_save(c, 3, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ck_assert_int_eq(ckpt_close(c), 0);

	ck_assert_int_eq(ckpt_reader_open(&r, dir, 4, NULL), CKPT_E_NOTFOUND);
	ckpt_settings rs;
	ckpt_settings_default(&rs);
	rs.reserved[6] = 1;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 3, &rs), -EINVAL);
	ck_assert_ptr_null(r);
	ck_assert_msg(strstr(ckpt_reader_errmsg(NULL), "reserved[6]"),
		      "message \"%s\"", ckpt_reader_errmsg(NULL));
	ckpt_settings_default(&rs);
	rs.flags = 1u << 31;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 3, &rs), -EINVAL);
	/* the settings of ckpt_open, save-side flags and all, open a reader */
	rs.flags = CKPT_F_NO_DIRECT | CKPT_F_MANUAL_COMMIT | CKPT_F_NO_URING |
		   CKPT_F_WATCH | CKPT_F_DEDUP;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 3, &rs), 0);
	ckpt_reader_close(r);
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 3, NULL), 0);
	float buf[64];
	ck_assert_int_eq(ckpt_read(r, "nope", buf, 128), CKPT_E_NOTFOUND);
	ck_assert_msg(strstr(ckpt_reader_errmsg(r), "nope"),
		      "message \"%s\" lacks the name", ckpt_reader_errmsg(r));
	ck_assert_int_eq(ckpt_read(r, NULL, buf, 128), -EINVAL);
	ck_assert_int_eq(ckpt_read(r, "w", buf, 127), -EINVAL);
	ck_assert_int_eq(ckpt_read(r, "w", buf, 129), -EINVAL);
	ck_assert_int_eq(ckpt_read(r, "w", NULL, 128), -EINVAL);
	size_t idx;
	ck_assert_int_eq(ckpt_reader_find(r, "nope", &idx), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_reader_find(r, "w", &idx), 0);
	ck_assert_uint_eq(idx, 0);
	ckpt_tensor_info ti;
	ck_assert_int_lt(ckpt_reader_tensor(r, 1, &ti), 0);
	ckpt_slice_info si;
	ck_assert_int_lt(ckpt_reader_slice(r, 0, 1, &si), 0);
	ckpt_file_info fi;
	ck_assert_int_lt(ckpt_reader_file(r, ckpt_reader_file_count(r), &fi), 0);

	/* slices: outside the shape, wrong size */
	uint64_t off[2] = {3, 0}, ext[2] = {2, 8};
	ck_assert_int_lt(ckpt_read_slice(r, "w", off, ext, buf, 64), 0);
	uint64_t off2[2] = {1, 2}, ext2[2] = {2, 3};
	ck_assert_int_eq(ckpt_read_slice(r, "w", off2, ext2, buf, 23), -EINVAL);
	ck_assert_int_eq(ckpt_read_slice(r, "w", off2, ext2, buf, 24), 0);
	ck_assert(buf[0] == 10.0f && buf[5] == 20.0f);
	ck_assert_int_eq(ckpt_read_slice(r, "w", NULL, ext2, buf, 24), -EINVAL);

	/* a request with flags or reserved fields set fails alone */
	float other[32];
	ckpt_read_req q[3] = {
		{ .name = "w", .dst = buf, .dst_bytes = 128 },
		{ .name = "w", .dst = other, .dst_bytes = 128, .flags = 1 },
		{ .name = "w", .dst = other, .dst_bytes = 128,
		  .reserved = { 0, 7 } },
	};
	memset(buf, 0, sizeof(buf));
	ck_assert_int_eq(ckpt_read_batch(r, q, 3), -EINVAL);
	ck_assert_int_eq(q[0].status, 0);
	ck_assert_int_eq(q[1].status, -EINVAL);
	ck_assert_int_eq(q[2].status, -EINVAL);
	ck_assert(memcmp(buf, g_data, 128) == 0);
	ck_assert_msg(strstr(ckpt_reader_errmsg(r), "request 1") &&
			      strstr(ckpt_reader_errmsg(r), "reserved"),
		      "message \"%s\" does not name the request",
		      ckpt_reader_errmsg(r));

	/* the reader stays usable after all that */
	ck_assert_int_eq(ckpt_read(r, "w", buf, 128), 0);
	ck_assert(memcmp(buf, g_data, 128) == 0);
	ckpt_reader_close(r);
}
END_TEST

/* ---- failed background saves ---- */

START_TEST(test_failed_save_wait)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	ck_assert_int_eq(ckpt_save(c, 1, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);

	atomic_store(&fail_armed, 1);
	eng_io_set(&hook_io);
	int rc = ckpt_save(c, 2, &t, 1);
	if (rc == 0)
		rc = ckpt_wait(c);
	ck_assert_msg(rc == -ENOSPC, "failed save reported %d (%s)", rc,
		      ckpt_strerror(rc));
	ck_assert_msg(ckpt_errmsg(c)[0], "no message");
	ck_assert_int_eq(atomic_load(&fail_fired), 1);
	eng_io_set(NULL);
	atomic_store(&fail_armed, 0);
	/* collected: the next save is not refused with CKPT_E_PREVIOUS
	 * (whether a second ckpt_wait repeats the status is unspecified) */
	uint64_t st;
	ck_assert_int_eq(ckpt_latest(c, &st), 0);
	ck_assert_uint_eq(st, 1);
	/* the same step can be saved again, over the debris */
	ck_assert_int_eq(ckpt_save(c, 2, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ck_assert_int_eq(ckpt_latest(c, &st), 0);
	ck_assert_uint_eq(st, 2);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_failed_save_previous)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	tu_set set;
	big_set(&set);
	/* chunk writes wait until ckpt_save returned, then fail */
	atomic_store(&fail_armed, 1);
	atomic_store(&gate_enabled, 1);
	eng_io_set(&hook_io);
	int rc = tu_save_async(c, 1, &set);
	ck_assert_msg(rc == 0, "save: %d (%s)", rc, ckpt_errmsg(c));
	gate_release();
	/* wait for the background failure without collecting it: the armed
	 * write runs when the writer gets to it, however slow the machine
	 * (the hook must still be in place then) */
	double t0 = tu_now_s();
	while (!atomic_load(&fail_fired)) {
		ck_assert_msg(tu_now_s() - t0 < PATIENCE_S,
			      "the failing write never ran");
		usleep(1000);
	}
	eng_io_set(NULL);
	atomic_store(&fail_armed, 0);
	/* BUSY while the writer cleans up after the failure */
	t0 = tu_now_s();
	do {
		rc = ckpt_save(c, 2, &t, 1);
		if (rc == CKPT_E_BUSY)
			usleep(2000);
	} while (rc == CKPT_E_BUSY && tu_now_s() - t0 < PATIENCE_S);
	ck_assert_msg(rc == CKPT_E_PREVIOUS, "next save: %d (%s)", rc,
		      ckpt_strerror(rc));
	const char *m = ckpt_errmsg(c);
	ck_assert_msg(m[0], "no message for PREVIOUS");
	/* consumed: the new save was not started, the next one works */
	ck_assert_int_eq(ckpt_save(c, 2, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ckpt_step_info *li;
	size_t n;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(li[0].step, 2);
	ckpt_free(li);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

START_TEST(test_close_reports_failure)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	tu_set set;
	big_set(&set);
	atomic_store(&fail_armed, 1);
	eng_io_set(&hook_io);
	int rc = tu_save_async(c, 1, &set);
	if (rc == 0)
		rc = ckpt_close(c);
	else
		ckpt_close(c);
	eng_io_set(NULL);
	ck_assert_int_eq(rc, -ENOSPC);
	tu_set_free(&set);
}
END_TEST

/* Handles inherited through fork(): in the child, reads through the reader
 * fail with -ECHILD and both handles can be closed, without waiting for
 * the parent's threads or save (a hang fails the test by its timeout);
 * the parent's handles are untouched. */
START_TEST(test_fork_child)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	float buf[32];
	for (int i = 0; i < 32; i++)
		g_data[i] = (float)i;
	ck_assert_int_eq(ckpt_save(c, 1, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	ckpt_reader *r;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), 0);
	/* the reader's workers and ring exist from the first read on */
	ck_assert_int_eq(ckpt_read(r, "w", buf, sizeof(buf)), 0);
	tu_set set;
	big_set(&set);
	ck_assert_int_eq(tu_save_async(c, 2, &set), 0); /* may be in flight */

	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int bad = 0;
		if (ckpt_read(r, "w", buf, sizeof(buf)) != -ECHILD)
			bad |= 1;
		if (!strstr(ckpt_reader_errmsg(r), "fork()"))
			bad |= 2;
		if (ckpt_reader_verify(r, NULL, NULL) != -ECHILD)
			bad |= 4;
		ckpt_reader_close(r);
		if (ckpt_close(c) != 0)
			bad |= 8;
		_exit(bad);
	}
	int status = 0;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child: wait status 0x%x (exit bits: 1 read, 2 message, "
		      "4 verify, 8 close)", status);

	ck_assert_int_eq(ckpt_wait(c), 0);
	memset(buf, 0, sizeof(buf));
	ck_assert_int_eq(ckpt_read(r, "w", buf, sizeof(buf)), 0);
	ck_assert(memcmp(buf, g_data, sizeof(buf)) == 0);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ckpt_reader_close(r);
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 2, NULL), 0);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ckpt_reader_close(r);
	tu_set_free(&set);
}
END_TEST

/* 1 if a mapping listed in /proc/self/smaps overlaps [lo, hi), 0 if none
 * does, -1 if the file cannot be read. */
static int smaps_overlaps(uintptr_t lo, uintptr_t hi)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int hit = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && a < hi && b > lo)
			hit = 1;
	}
	fclose(f);
	return hit;
}

/* The staging pool (256 MiB, pinned for io_uring) is not inherited by a
 * fork() child: its range is absent from the child's smaps, the child's
 * ckpt_close succeeds and leaves alone a mapping the child made in that
 * range, and the parent still saves. */
START_TEST(test_fork_pool)
{
	const char *dir = tu_tmpdir();
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 256u << 20;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	tu_set set;
	big_set(&set);
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	uintptr_t lo = (uintptr_t)c->mem, hi = lo + c->mem_bytes;
	ck_assert_uint_gt(c->mem_bytes, 255u << 20); /* slots round down */
	ck_assert(c->mem_dontfork);
	ck_assert_int_eq(smaps_overlaps(lo, hi), 1);

	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int bad = 0;
		if (smaps_overlaps(lo, hi) != 0)
			bad |= 1;
		/* a mapping of the child's own where the pool was */
		uint8_t *m = mmap((void *)lo, 4096, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS |
					  MAP_FIXED_NOREPLACE,
				  -1, 0);
		if (m != (uint8_t *)lo)
			_exit(bad | 2);
		memset(m, 0x5a, 4096);
		if (ckpt_close(c) != 0)
			bad |= 4;
		if (smaps_overlaps(lo, lo + 4096) != 1 || m[4095] != 0x5a)
			bad |= 8;
		_exit(bad);
	}
	int status = 0;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child: wait status 0x%x (exit bits: 1 pool in smaps, "
		      "2 range taken, 4 close, 8 own mapping gone)", status);
	ck_assert_int_eq(tu_save(c, 2, &set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	char why[512];
	ck_assert_msg(tu_check_root(dir, 2, &set, why, sizeof(why)) == 0,
		      "%s", why);
	tu_set_free(&set);
}
END_TEST

/* ---- ckpt_poll observes, never consumes ---- */

struct poll_arg {
	ckpt *c;
	int rc, polls;
};

/* A progress watcher: polls until the save is over, then twice more. */
static void *poll_thread(void *p)
{
	struct poll_arg *a = p;
	ckpt_progress pr;
	while ((a->rc = ckpt_poll(a->c, &pr)) == 1 && a->polls++ < 200000)
		usleep(100);
	a->rc = ckpt_poll(a->c, &pr);
	a->rc = ckpt_poll(a->c, &pr) == a->rc ? a->rc : 12345;
	return NULL;
}

/* A background failure seen by a watcher's ckpt_poll is still reported by
 * ckpt_wait (_i 0), the next ckpt_save (_i 1) or ckpt_close (_i 2). */
START_TEST(test_poll_observes)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	tu_set set;
	big_set(&set);
	atomic_store(&fail_armed, 1);
	atomic_store(&gate_enabled, 1);
	eng_io_set(&hook_io);
	int rc = tu_save_async(c, 1, &set);
	ck_assert_msg(rc == 0, "save: %d (%s)", rc, ckpt_errmsg(c));
	struct poll_arg pa = {c, 0, 0};
	pthread_t th;
	pthread_create(&th, NULL, poll_thread, &pa);
	gate_release();
	pthread_join(th, NULL);
	eng_io_set(NULL);
	atomic_store(&fail_armed, 0);
	ck_assert_msg(pa.rc == -ENOSPC, "watcher's poll: %d", pa.rc);
	ckpt_progress pr;
	ck_assert_int_eq(ckpt_poll(c, &pr), -ENOSPC);
	ck_assert_int_eq(pr.state, CKPT_STATE_FAILED);
	ck_assert_int_eq(pr.status, -ENOSPC);
	if (_i == 0) {
		ck_assert_int_eq(ckpt_wait(c), -ENOSPC);
		/* collected by ckpt_wait: the next save starts */
		ck_assert_int_eq(ckpt_save(c, 2, &t, 1), 0);
		ck_assert_int_eq(ckpt_wait(c), 0);
	} else if (_i == 1) {
		rc = ckpt_save(c, 2, &t, 1);
		ck_assert_msg(rc == CKPT_E_PREVIOUS, "next save: %d (%s)", rc,
			      ckpt_errmsg(c));
		ck_assert_msg(strstr(ckpt_errmsg(c), "step 1"), "%s",
			      ckpt_errmsg(c));
		ck_assert_int_eq(ckpt_save(c, 2, &t, 1), 0);
		ck_assert_int_eq(ckpt_wait(c), 0);
	} else {
		ck_assert_int_eq(ckpt_close(c), -ENOSPC);
		c = NULL;
	}
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
}
END_TEST

/* A step the format cannot record is refused before anything is copied
 * or created; 2^63-1 itself saves. */
START_TEST(test_step_range)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	const uint64_t bad[] = {(uint64_t)INT64_MAX + 1, UINT64_MAX};
	for (int i = 0; i < 2; i++) {
		int rc = ckpt_save(c, bad[i], &t, 1);
		ck_assert_msg(rc == -EINVAL, "step %llu: %d",
			      (unsigned long long)bad[i], rc);
		ck_assert_msg(strstr(ckpt_errmsg(c), "2^63-1"), "%s",
			      ckpt_errmsg(c));
		ck_assert_int_eq(tu_count_suffix(dir, ""), 0);
	}
	ck_assert_int_eq(ckpt_save(c, (uint64_t)INT64_MAX, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	uint64_t latest = 0;
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	ck_assert_uint_eq(latest, (uint64_t)INT64_MAX);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

START_TEST(test_commit_misuse)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	/* nothing saved: no host index */
	int rc = ckpt_commit(c, 9);
	ck_assert_msg(rc == CKPT_E_INCOMPLETE || rc == CKPT_E_NOTFOUND,
		      "commit of nothing: %d", rc);
	ck_assert_msg(ckpt_errmsg(c)[0], "no message");
	uint64_t st;
	ck_assert_int_eq(ckpt_latest(c, &st), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST


START_TEST(test_close_waits)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	tu_set set;
	big_set(&set);
	ck_assert_int_eq(tu_save_async(c, 4, &set), 0);
	/* close right away: it waits, the step is committed */
	ck_assert_int_eq(ckpt_close(c), 0);
	char why[512];
	ck_assert_msg(tu_check_root(dir, 4, &set, why, sizeof(why)) == 0, "%s",
		      why);
	tu_set_free(&set);
}
END_TEST


/* ckpt_gc never touches the step this handle is saving, even when it is
 * older than the newest committed step (it looks like debris). */
START_TEST(test_gc_spares_inflight)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_root(dir);
	ckpt_tensor t = good_tensor("w");
	ck_assert_int_eq(ckpt_save(c, 5, &t, 1), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	tu_set set;
	big_set(&set);
	atomic_store(&gate_enabled, 1);
	eng_io_set(&hook_io);
	ck_assert_int_eq(tu_save_async(c, 3, &set), 0);
	ckpt_gc_report rep;
	ck_assert_int_eq(ckpt_gc(c, 0, 0, 0, NULL, NULL, &rep), 0);
	char *sd = tu_path("%s/step-%020d", dir, 3);
	ck_assert_msg(tu_exists(sd), "gc removed the step being saved");
	gate_release();
	ck_assert_int_eq(ckpt_wait(c), 0);
	eng_io_set(NULL);
	char why[512];
	ck_assert_msg(tu_check_root(dir, 3, &set, why, sizeof(why)) == 0, "%s",
		      why);
	/* the newest stays the newest */
	uint64_t l;
	ck_assert_int_eq(ckpt_latest(c, &l), 0);
	ck_assert_uint_eq(l, 5);
	ck_assert_int_eq(ckpt_close(c), 0);
	free(sd);
	tu_set_free(&set);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("api");
	TCase *tc = tu_tcase("api", 60);
	tcase_add_test(tc, test_null_args);
	tcase_add_test(tc, test_destructors_null);
	tcase_add_test(tc, test_bad_names);
	tcase_add_test(tc, test_dupname);
	tcase_add_test(tc, test_bad_tensor_fields);
	tcase_add_test(tc, test_settings_validation);
	tcase_add_test(tc, test_staging_zero);
	tcase_add_test(tc, test_strerror);
	tcase_add_test(tc, test_dtype_codec_names);
	tcase_add_test(tc, test_busy);
	tcase_add_test(tc, test_exists);
	tcase_add_test(tc, test_reader_misuse);
	tcase_add_test(tc, test_failed_save_wait);
	tcase_add_test(tc, test_failed_save_previous);
	tcase_add_test(tc, test_close_reports_failure);
	tcase_add_test(tc, test_fork_child);
	tcase_add_test(tc, test_fork_pool);
	tcase_add_test(tc, test_commit_misuse);
	tcase_add_test(tc, test_close_waits);
	tcase_add_test(tc, test_gc_spares_inflight);
	tcase_add_loop_test(tc, test_poll_observes, 0, 3);
	tcase_add_test(tc, test_step_range);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
