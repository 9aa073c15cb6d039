/*
 * test_alloc.c - allocation failure injected into ckpt_open, ckpt_save +
 * ckpt_wait (also borrowed: CKPT_SAVE_BORROW), ckpt_commit and the
 * reader (open, read, read_slice, read_batch, read_alloc, verify).
 *
 * The executable defines malloc, calloc, realloc, free, posix_memalign,
 * aligned_alloc, memalign, strdup, strndup and mmap. A definition in the
 * executable wins over every shared library's (libc, libzstd, libjansson
 * and libc's own internal callers all reach it through the PLT), and each
 * forwards to the next definition found by dlsym(RTLD_NEXT): glibc's, or
 * the sanitizer runtime's in an ASan/TSan build, which then still sees
 * and leak-checks every block. The few allocations dlsym itself makes
 * before the real functions are known come from a small static arena.
 *
 * While armed, allocations are counted in the chosen scope (every
 * thread, the caller thread only, or background threads only) and the Nth
 * one fails (mode NTH) or every one from the Nth on fails (mode FROM).
 * Each test loops N = 1, 2, ... until an iteration completes without
 * reaching the failure point, and prints how many injection points the
 * phase had. For every N:
 *  - a failed call returns -ENOMEM with a non-empty message, leaves no
 *    handle behind (open) or a handle that closes cleanly;
 *  - after a failed save or commit the step is not listed, no COMMIT is
 *    in its directory, the previous step is still the latest and
 *    verifies, and a retry with allocations working succeeds;
 *  - a call that succeeds although an allocation failed (a tolerated
 *    failure, such as pinning buffers) produced correct data;
 *  - nothing leaks: LeakSanitizer checks every failure path in the ASan
 *    build (CI runs the engine suite there). A count of live blocks
 *    cannot do it in the plain build: the dynamic linker keeps per-thread
 *    blocks (TLS vectors) cached with thread stacks, so the count moves
 *    with thread creation, not with leaks.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "testutil.h"

/* ------------------------------------------------------------------ */
/* Interposer                                                         */
/* ------------------------------------------------------------------ */

/* The sanitizer runtimes allocate before their shadow memory exists, so
 * the interposer itself must not be instrumented. */
#define NOSAN __attribute__((no_sanitize("address", "thread", "undefined")))

enum scope { SC_ALL, SC_CALLER, SC_BACKGROUND };
enum mode { MD_NTH, MD_FROM };

static atomic_int armed;      /* allocations are counted while set */
static atomic_int mmap_armed; /* mmap calls are counted while set */
static atomic_int inj_scope, inj_mode;
static atomic_long inj_count, inj_target, inj_fired;
static _Thread_local int is_caller;
/* Set once a thread runs its start routine: what a sanitizer runtime
 * allocates while it sets a new thread up must not fail. */
static _Thread_local int is_started;
/* Set while jansson allocates (see json_malloc_marked); volatile, as
 * malloc is a builtin and the compiler would drop the stores around it. */
static _Thread_local volatile int in_jansson;

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *,
				  void *(*)(void *), void *);

/* Bootstrap arena for what dlsym allocates while resolving. */
static _Alignas(64) unsigned char arena[64 << 10];
static atomic_size_t arena_used;
static _Thread_local int resolving;

NOSAN static int in_arena(const void *p)
{
	return (const unsigned char *)p >= arena &&
	       (const unsigned char *)p < arena + sizeof(arena);
}

NOSAN static void *arena_alloc(size_t n)
{
	size_t off = atomic_fetch_add(&arena_used, (n + 63) & ~(size_t)63);

	if (off + n > sizeof(arena))
		return NULL;
	return memset(arena + off, 0, n);
}

NOSAN static void resolve(void)
{
	if (real_free || resolving)
		return;
	resolving = 1;
	real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(
		RTLD_NEXT, "posix_memalign");
	real_aligned_alloc =
		(void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
	real_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
	real_mmap = (void *(*)(void *, size_t, int, int, int,
			       off_t))dlsym(RTLD_NEXT, "mmap");
	real_pthread_create =
		(int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
			 void *))dlsym(RTLD_NEXT, "pthread_create");
	real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	resolving = 0;
	if (!real_malloc || !real_calloc || !real_realloc || !real_free ||
	    !real_posix_memalign || !real_aligned_alloc || !real_memalign ||
	    !real_mmap || !real_pthread_create)
		abort();
}

NOSAN static int in_scope(void)
{
	switch (atomic_load(&inj_scope)) {
	case SC_CALLER:
		return is_caller;
	case SC_BACKGROUND:
		return !is_caller;
	default:
		return 1;
	}
}

/* Counts one allocation; 1 if it must fail. */
NOSAN static int should_fail(atomic_int *arm, size_t size)
{
	long n;

	if (!atomic_load(arm) || !(is_started || is_caller) || !in_scope())
		return 0;
	/* jansson 2.14 aborts (assert in its lexer) when the growth of its
	 * token buffer fails, akheron/jansson#362; that buffer doubles from
	 * 16 bytes, and its requests cannot be told apart from jansson's
	 * other power-of-two ones, which are spared too. */
	if (in_jansson && size >= 16 && !(size & (size - 1)))
		return 0;
	n = atomic_fetch_add(&inj_count, 1) + 1;
	if (n == atomic_load(&inj_target) ||
	    (atomic_load(&inj_mode) == MD_FROM &&
	     n > atomic_load(&inj_target))) {
		atomic_fetch_add(&inj_fired, 1);
		errno = ENOMEM; /* as malloc does: opendir() relies on it */
		return 1;
	}
	return 0;
}

NOSAN void *malloc(size_t n)
{
	resolve();
	if (!real_malloc)
		return arena_alloc(n);
	if (should_fail(&armed, n))
		return NULL;
	return real_malloc(n);
}

NOSAN void *calloc(size_t k, size_t n)
{
	resolve();
	if (!real_calloc)
		return n && k > SIZE_MAX / n ? NULL : arena_alloc(k * n);
	if (should_fail(&armed, k * n))
		return NULL;
	return real_calloc(k, n);
}

NOSAN void free(void *p)
{
	if (!p || in_arena(p))
		return;
	resolve();
	real_free(p);
}

NOSAN void *realloc(void *p, size_t n)
{
	void *q;

	resolve();
	if (in_arena(p)) {
		/* Rare (dlsym's buffers): copy what can be copied. */
		q = malloc(n);
		if (q)
			memcpy(q, p,
			       n < (size_t)(arena + sizeof(arena) -
					    (unsigned char *)p) ?
				       n :
				       (size_t)(arena + sizeof(arena) -
						(unsigned char *)p));
		return q;
	}
	if (!p)
		return malloc(n);
	if (n == 0) {
		free(p);
		return NULL;
	}
	if (should_fail(&armed, n))
		return NULL;
	return real_realloc(p, n);
}

NOSAN int posix_memalign(void **out, size_t align, size_t n)
{
	int r;

	resolve();
	if (should_fail(&armed, n))
		return ENOMEM;
	r = real_posix_memalign(out, align, n);
	return r;
}

NOSAN void *aligned_alloc(size_t align, size_t n)
{
	resolve();
	if (should_fail(&armed, n))
		return NULL;
	return real_aligned_alloc(align, n);
}

NOSAN void *memalign(size_t align, size_t n)
{
	resolve();
	if (should_fail(&armed, n))
		return NULL;
	return real_memalign(align, n);
}

NOSAN char *strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);

	return d ? memcpy(d, s, n) : NULL;
}

NOSAN char *strndup(const char *s, size_t max)
{
	size_t n = strnlen(s, max);
	char *d = malloc(n + 1);

	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = 0;
	return d;
}

NOSAN void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	resolve();
	if (should_fail(&mmap_armed, 0)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return real_mmap(addr, len, prot, flags, fd, off);
}

/* jansson's allocator, installed before the library chains its own
 * wrapper onto it. */
static void *json_malloc_marked(size_t n)
{
	void *p;

	in_jansson = 1;
	p = malloc(n);
	in_jansson = 0;
	return p;
}

typedef struct start_arg {
	void *(*fn)(void *);
	void *arg;
} start_arg;

NOSAN static void *start_thread(void *p)
{
	start_arg a = *(start_arg *)p;

	real_free(p);
	is_started = 1;
	return a.fn(a.arg);
}

NOSAN int pthread_create(pthread_t *t, const pthread_attr_t *attr,
			 void *(*fn)(void *), void *arg)
{
	start_arg *a;
	int r;

	resolve();
	a = real_malloc(sizeof(*a));
	if (!a)
		return EAGAIN;
	a->fn = fn;
	a->arg = arg;
	r = real_pthread_create(t, attr, start_thread, a);
	if (r)
		real_free(a);
	return r;
}

/* Starts counting from zero; the `target`th allocation fails. */
static void arm(int scope, int mode, long target)
{
	atomic_store(&inj_scope, scope);
	atomic_store(&inj_mode, mode);
	atomic_store(&inj_count, 0);
	atomic_store(&inj_fired, 0);
	atomic_store(&inj_target, target);
	atomic_store(&armed, 1);
}

static void disarm(void)
{
	atomic_store(&armed, 0);
	atomic_store(&mmap_armed, 0);
}

/* Counting stops between the calls under test (the test's own checks
 * allocate) and resumes where it stopped. */
static void pause_inj(void)
{
	atomic_store(&armed, 0);
}

static void resume_inj(void)
{
	atomic_store(&armed, 1);
}

/* ------------------------------------------------------------------ */
/* Helpers                                                            */
/* ------------------------------------------------------------------ */

static const char *scope_names[] = { "all threads", "caller thread",
				     "background threads" };
static const char *mode_names[] = { "nth", "from nth on" };

static char why[1024];

static ckpt *open_ok(const char *root, const ckpt_settings *s);

/* Removes all but the newest two committed steps and all debris, with
 * allocations working: a retention pass that failed in an iteration
 * leaves steps behind, and each step costs the next scan allocations, so
 * without this the number of injection points could grow with N. */
static void trim_root(const char *root)
{
	ckpt_settings s;
	ckpt *c;
	int rc;

	tu_settings(&s);
	s.staging_bytes = 0;
	c = open_ok(root, &s);
	rc = ckpt_gc(c, 2, 0, 0, NULL, NULL, NULL);
	ck_assert_msg(rc == 0, "gc: %s", ckpt_errmsg(c));
	ckpt_close(c);
}

/* Progress of the loops on stderr with CKPT_ALLOC_VERBOSE=1. */
static int verbose(void)
{
	const char *v = getenv("CKPT_ALLOC_VERBOSE");

	return v && *v == '1';
}

/* Enough for anything the engine allocates in one phase here; a loop
 * that reaches it means the injection never stops being hit. */
#define MAX_POINTS 20000

static void make_set(tu_set *set)
{
	uint64_t w[2] = { 256, 256 }; /* bf16, 128 KiB: two 64 KiB chunks */
	uint64_t f[2] = { 100, 33 };
	uint64_t b[1] = { 1000 };

	tu_set_init(set);
	tu_set_add(set, "a.w", CKPT_BF16, 2, w, 1);
	tu_set_add(set, "b.f32", CKPT_F32, 2, f, 2);
	tu_set_add(set, "c.u8", CKPT_U8, 1, b, 3);
	tu_set_add(set, "d.scalar", CKPT_I64, 0, NULL, 4);
}

/* Saves lend the set (CKPT_SAVE_BORROW) instead of copying it. */
static int borrow_saves;

/* ckpt_save of the whole set (tu_save_async would allocate while armed). */
static int save_set(ckpt *c, uint64_t step, const tu_set *set)
{
	ckpt_save_opts o;
	ckpt_tensor v[8];

	/* no ck_assert here: Check allocates in every assertion */
	if (set->n > 8)
		abort();
	tu_set_view(set, v);
	ckpt_save_opts_default(&o);
	o.flags = borrow_saves ? CKPT_SAVE_BORROW : 0;
	return ckpt_save_ex(c, step, v, set->n, &o);
}

static ckpt *open_ok(const char *root, const ckpt_settings *s)
{
	ckpt *c = NULL;
	int rc = ckpt_open(&c, root, s);

	ck_assert_msg(rc == 0, "ckpt_open: %s", ckpt_errmsg(NULL));
	return c;
}

/* The error of a call that failed because an allocation failed. */
static void check_enomem(int rc, const char *what, const char *msg, long n)
{
	ck_assert_msg(rc == -ENOMEM,
		      "N=%ld: %s returned %d (%s: %s), want -ENOMEM", n, what,
		      rc, ckpt_strerror(rc), msg ? msg : "(null)");
	ck_assert_msg(msg && *msg, "N=%ld: %s failed without a message", n,
		      what);
}

/* `want` is the newest committed step, `absent` must not be visible. */
static void check_root(const char *root, uint64_t want, uint64_t absent,
		       const tu_set *set, long n)
{
	ckpt_settings s;
	ckpt *c;
	uint64_t latest = 0;
	ckpt_step_info *steps = NULL;
	size_t count = 0, i;
	char *commit;
	int rc;

	tu_settings(&s);
	s.staging_bytes = 0;
	c = open_ok(root, &s);
	rc = ckpt_latest(c, &latest);
	ck_assert_msg(rc == 0 && latest == want,
		      "N=%ld: latest %d %llu, want %llu", n, rc,
		      (unsigned long long)latest, (unsigned long long)want);
	ck_assert_int_eq(ckpt_list(c, &steps, &count), 0);
	for (i = 0; i < count; i++)
		ck_assert_msg(steps[i].step != absent,
			      "N=%ld: failed step %llu is listed", n,
			      (unsigned long long)absent);
	ckpt_free(steps);
	ckpt_close(c);
	if (absent) {
		char *dir = tu_step_dir(root, absent);

		commit = tu_path("%s/COMMIT", dir);
		ck_assert_msg(!tu_exists(commit), "N=%ld: %s exists", n,
			      commit);
		free(commit);
		free(dir);
	}
	rc = tu_check_root(root, want, set, why, sizeof(why));
	ck_assert_msg(rc == 0, "N=%ld: step %llu: %s", n,
		      (unsigned long long)want, why);
}

static void report(const char *phase, int scope, int mode, long points,
		   long failed_calls)
{
	fprintf(stderr,
		"alloc: %-28s %-18s %-11s %5ld injection points, %ld calls "
		"failed cleanly\n",
		phase, scope_names[scope], mode_names[mode], points,
		failed_calls);
}

/* ------------------------------------------------------------------ */
/* ckpt_open                                                          */
/* ------------------------------------------------------------------ */

static void open_loop(int scope, int mode, int use_mmap)
{
	const char *root = tu_tmpdir();
	const char *phase = use_mmap ? "ckpt_open (mmap)" : "ckpt_open";
	ckpt_settings s;
	tu_set set;
	ckpt *c;
	uint64_t step = 1;
	long n, failed = 0;

	is_caller = 1;
	tu_settings(&s);
	make_set(&set);
	c = open_ok(root, &s);
	ck_assert_int_eq(tu_save(c, step, &set), 0);
	ckpt_close(c);
	for (n = 1; n < MAX_POINTS; n++) {
		int rc;

		arm(scope, mode, n);
		if (use_mmap) {
			atomic_store(&armed, 0);
			atomic_store(&mmap_armed, 1);
		}
		c = NULL;
		rc = ckpt_open(&c, root, &s);
		disarm();
		if (!atomic_load(&inj_fired)) {
			ck_assert_msg(rc == 0, "N=%ld: ckpt_open: %s", n,
				      ckpt_errmsg(NULL));
			ckpt_close(c);
			break;
		}
		if (rc < 0) {
			check_enomem(rc, "ckpt_open", ckpt_errmsg(NULL), n);
			ck_assert_ptr_null(c);
			failed++;
		} else {
			/* Tolerated: the handle must still save. */
			rc = tu_save(c, ++step, &set);
			ck_assert_msg(rc == 0,
				      "N=%ld: open succeeded after a failed "
				      "allocation, then save: %s: %s",
				      n, ckpt_strerror(rc), ckpt_errmsg(c));
			ck_assert_int_eq(ckpt_close(c), 0);
			check_root(root, step, 0, &set, n);
		}
	}
	ck_assert_int_lt(n, MAX_POINTS);
	report(phase, scope, mode, n - 1, failed);
	tu_set_free(&set);
}

START_TEST(test_open_nth)
{
	open_loop(SC_ALL, MD_NTH, 0);
}
END_TEST

START_TEST(test_open_from)
{
	open_loop(SC_ALL, MD_FROM, 0);
}
END_TEST

START_TEST(test_open_mmap)
{
	open_loop(SC_ALL, MD_NTH, 1);
}
END_TEST

/* Worker and writer threads allocate when they start (codec contexts):
 * fail every background allocation while the handle starts up; once
 * allocations work again, saves must succeed. The threads may or may not
 * have reached their allocations within the window; the outcome must be
 * the same either way. */
START_TEST(test_open_background)
{
	const char *root = tu_tmpdir();
	ckpt_settings s;
	tu_set set;
	ckpt *c;
	long fired;
	int rc;

	is_caller = 1;
	tu_settings(&s);
	make_set(&set);
	arm(SC_BACKGROUND, MD_FROM, 1);
	c = NULL;
	rc = ckpt_open(&c, root, &s);
	usleep(200 * 1000);
	disarm();
	fired = atomic_load(&inj_fired);
	ck_assert_msg(rc == 0, "ckpt_open: %s", ckpt_errmsg(NULL));
	rc = tu_save(c, 1, &set);
	ck_assert_msg(rc == 0,
		      "save after %ld failed background allocations at "
		      "startup: %s: %s",
		      fired, ckpt_strerror(rc), ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_close(c), 0);
	check_root(root, 1, 0, &set, 0);
	fprintf(stderr,
		"alloc: ckpt_open startup: %ld background allocations "
		"failed, then saves work\n",
		fired);
	tu_set_free(&set);
}
END_TEST

/* ------------------------------------------------------------------ */
/* ckpt_save + ckpt_wait                                              */
/* ------------------------------------------------------------------ */

/* Saves deduplicate (CKPT_F_DEDUP): every chunk refers to the step
 * before, so commit's check of the refs runs under the failures too. */
static int dedup_saves;

static void save_settings(ckpt_settings *s)
{
	tu_settings(s);
	if (dedup_saves)
		s->flags |= CKPT_F_DEDUP;
	/* retention runs after every commit: its allocations too */
	s->keep_last = 2;
}

static void save_loop(int scope, int mode)
{
	const char *root = tu_tmpdir();
	ckpt_settings s;
	tu_set set;
	ckpt *c;
	uint64_t step = 1;
	long n, failed = 0, warm;

	is_caller = 1;
	save_settings(&s);
	make_set(&set);
	c = open_ok(root, &s);
	ck_assert_int_eq(tu_save(c, step, &set), 0);
	ckpt_close(c);
	for (n = 0; n < MAX_POINTS; n++) {
		int rc;

		trim_root(root);
		if (verbose())
			fprintf(stderr, "save N=%ld\n", n);
		c = open_ok(root, &s);
		/* n == 0: warm-up, nothing fails */
		arm(scope, mode, n ? n : MAX_POINTS * 10);
		rc = save_set(c, step + 1, &set);
		if (rc == 0 && borrow_saves)
			rc = ckpt_wait_released(c, -1);
		if (rc == 0)
			rc = ckpt_wait(c);
		disarm();
		if (n && !atomic_load(&inj_fired)) {
			ck_assert_msg(rc == 0, "N=%ld: save: %s", n,
				      ckpt_errmsg(c));
			ck_assert_int_eq(ckpt_close(c), 0);
			break;
		}
		warm = atomic_load(&inj_count);
		if (rc) {
			check_enomem(rc, "save", ckpt_errmsg(c), n);
			failed++;
			check_root(root, step, step + 1, &set, n);
			rc = tu_save(c, step + 1, &set);
			ck_assert_msg(rc == 0, "N=%ld: retry after ENOMEM: %s",
				      n, ckpt_errmsg(c));
		}
		ck_assert_int_eq(ckpt_close(c), 0);
		step++;
		check_root(root, step, 0, &set, n);
		/* the interposer sees the engine's allocations at all */
		if (!n)
			ck_assert_int_gt(warm, 0);
	}
	ck_assert_int_lt(n, MAX_POINTS);
	report("ckpt_save+ckpt_wait", scope, mode, n - 1, failed);
	tu_set_free(&set);
}

START_TEST(test_save_nth)
{
	save_loop(SC_ALL, MD_NTH);
}
END_TEST

START_TEST(test_save_background)
{
	save_loop(SC_BACKGROUND, MD_NTH);
}
END_TEST

START_TEST(test_save_caller)
{
	save_loop(SC_CALLER, MD_NTH);
}
END_TEST

START_TEST(test_save_from)
{
	save_loop(SC_ALL, MD_FROM);
}
END_TEST

/* Borrowed saves: the same outcomes, and the memory is released (the
 * wait returns) whatever failed. */
START_TEST(test_save_borrow)
{
	borrow_saves = 1;
	save_loop(SC_ALL, MD_NTH);
	borrow_saves = 0;
}
END_TEST

/* Deduplicating saves: a failed allocation is -ENOMEM there too, never
 * taken for a base that is not committed. */
START_TEST(test_save_dedup)
{
	dedup_saves = 1;
	save_loop(SC_ALL, MD_NTH);
	dedup_saves = 0;
}
END_TEST

/* ------------------------------------------------------------------ */
/* ckpt_commit (two hosts)                                            */
/* ------------------------------------------------------------------ */

static void commit_loop(int mode)
{
	const char *root = tu_tmpdir();
	uint64_t shape[2] = { 256, 64 }, ext[2] = { 128, 64 };
	uint64_t off0[2] = { 0, 0 }, off1[2] = { 128, 0 };
	uint64_t vec[1] = { 777 };
	ckpt_settings s0, s1;
	tu_set set0, set1, all;
	uint64_t step = 0;
	long n, failed = 0;

	is_caller = 1;
	save_settings(&s0);
	s0.host_count = 2;
	s1 = s0;
	s1.host_index = 1;
	tu_set_init(&set0);
	tu_set_init(&set1);
	tu_set_init(&all);
	tu_set_add_slice(&set0, "g", CKPT_F32, 2, shape, off0, ext, 9);
	tu_set_add_slice(&set1, "g", CKPT_F32, 2, shape, off1, ext, 9);
	tu_set_add_slice(&all, "g", CKPT_F32, 2, shape, off0, ext, 9);
	tu_set_add_slice(&all, "g", CKPT_F32, 2, shape, off1, ext, 9);
	tu_set_add(&set0, "h0", CKPT_BF16, 1, vec, 10);
	tu_set_add(&all, "h0", CKPT_BF16, 1, vec, 10);
	tu_set_add(&set1, "h1", CKPT_U8, 1, vec, 11);
	tu_set_add(&all, "h1", CKPT_U8, 1, vec, 11);
	for (n = 0; n < MAX_POINTS; n++) {
		ckpt *c0, *c1;
		int rc;

		if (step)
			trim_root(root);
		if (verbose())
			fprintf(stderr, "commit N=%ld\n", n);
		c0 = open_ok(root, &s0);
		c1 = open_ok(root, &s1);
		step++;
		ck_assert_int_eq(tu_save(c0, step, &set0), 0);
		ck_assert_int_eq(tu_save(c1, step, &set1), 0);
		arm(SC_ALL, mode, n ? n : MAX_POINTS * 10);
		rc = ckpt_commit(c0, step);
		disarm();
		if (n && !atomic_load(&inj_fired)) {
			ck_assert_msg(rc == 0, "N=%ld: commit: %s", n,
				      ckpt_errmsg(c0));
			ckpt_close(c0);
			ckpt_close(c1);
			break;
		}
		if (rc) {
			ck_assert_msg(n > 0, "commit: %s", ckpt_errmsg(c0));
			check_enomem(rc, "ckpt_commit", ckpt_errmsg(c0), n);
			failed++;
			check_root(root, step - 1, step, &all, n);
			rc = ckpt_commit(c0, step);
			ck_assert_msg(rc == 0, "N=%ld: commit retry: %s", n,
				      ckpt_errmsg(c0));
		}
		ck_assert_int_eq(ckpt_close(c0), 0);
		ck_assert_int_eq(ckpt_close(c1), 0);
		check_root(root, step, 0, &all, n);
	}
	ck_assert_int_lt(n, MAX_POINTS);
	report("ckpt_commit (2 hosts)", SC_ALL, mode, n - 1, failed);
	tu_set_free(&set0);
	tu_set_free(&set1);
	tu_set_free(&all);
}

START_TEST(test_commit_nth)
{
	commit_loop(MD_NTH);
}
END_TEST

START_TEST(test_commit_from)
{
	commit_loop(MD_FROM);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Reader                                                             */
/* ------------------------------------------------------------------ */

enum {
	OP_OPEN,
	OP_READ,
	OP_SLICE,
	OP_BATCH,
	OP_ALLOC,
	OP_VERIFY,
	OP_CLOSE,
	OP_COUNT
};
static const char *op_names[OP_COUNT] = {
	"ckpt_reader_open", "ckpt_read",       "ckpt_read_slice",
	"ckpt_read_batch",  "ckpt_read_alloc", "ckpt_reader_verify",
	"ckpt_reader_close"
};

typedef struct read_ctx {
	const char *root;
	const tu_set *set;
	uint8_t *whole, *box, *box_want, *b_buf, *c_buf;
	uint64_t box_bytes;
} read_ctx;

static const uint64_t box_off[2] = { 3, 5 }, box_ext[2] = { 100, 200 };

/* One failed or successful op: a failure must be -ENOMEM with a message. */
static int op_result(int rc, ckpt_reader *r, int op, long n, long *failed)
{
	if (rc) {
		check_enomem(rc, op_names[op], ckpt_reader_errmsg(r), n);
		ck_assert_msg(atomic_load(&inj_fired) > 0,
			      "N=%ld: %s failed but no allocation failed", n,
			      op_names[op]);
		(*failed)++;
	}
	return rc;
}

/* Runs every reader op armed; returns the counts after each op. */
static void read_ops(read_ctx *x, long n, long *failed, long *after)
{
	const tu_set *set = x->set;
	ckpt_settings rs;
	ckpt_reader *r = NULL;
	ckpt_read_req req[3];
	void *got = NULL;
	uint64_t got_bytes = 0;
	size_t i;
	int rc;

	tu_settings(&rs);
	resume_inj();
	rc = ckpt_reader_open(&r, x->root, CKPT_LATEST, &rs);
	pause_inj();
	after[OP_OPEN] = atomic_load(&inj_count);
	if (op_result(rc, NULL, OP_OPEN, n, failed)) {
		ck_assert_ptr_null(r);
		return;
	}

	memset(x->whole, 0, set->t[0].nbytes);
	resume_inj();
	rc = ckpt_read(r, "a.w", x->whole, set->t[0].nbytes);
	pause_inj();
	after[OP_READ] = atomic_load(&inj_count);
	if (!op_result(rc, r, OP_READ, n, failed))
		ck_assert(!memcmp(x->whole, set->t[0].data, set->t[0].nbytes));

	memset(x->box, 0, x->box_bytes);
	resume_inj();
	rc = ckpt_read_slice(r, "a.w", box_off, box_ext, x->box, x->box_bytes);
	pause_inj();
	after[OP_SLICE] = atomic_load(&inj_count);
	if (!op_result(rc, r, OP_SLICE, n, failed))
		ck_assert(!memcmp(x->box, x->box_want, x->box_bytes));

	memset(req, 0, sizeof(req));
	req[0].name = "b.f32";
	req[0].dst = x->b_buf;
	req[0].dst_bytes = set->t[1].nbytes;
	req[1].name = "c.u8";
	req[1].dst = x->c_buf;
	req[1].dst_bytes = set->t[2].nbytes;
	req[2].name = "a.w";
	req[2].offset = box_off;
	req[2].extent = box_ext;
	req[2].dst = x->box;
	req[2].dst_bytes = x->box_bytes;
	memset(x->box, 0, x->box_bytes);
	memset(x->b_buf, 0, set->t[1].nbytes);
	memset(x->c_buf, 0, set->t[2].nbytes);
	resume_inj();
	rc = ckpt_read_batch(r, req, 3);
	pause_inj();
	after[OP_BATCH] = atomic_load(&inj_count);
	for (i = 0; i < 3; i++)
		ck_assert_msg(req[i].status == 0 || req[i].status == -ENOMEM,
			      "N=%ld: batch request %zu: %d", n, i,
			      req[i].status);
	if (!op_result(rc, r, OP_BATCH, n, failed)) {
		ck_assert(!memcmp(x->b_buf, set->t[1].data, set->t[1].nbytes));
		ck_assert(!memcmp(x->c_buf, set->t[2].data, set->t[2].nbytes));
		ck_assert(!memcmp(x->box, x->box_want, x->box_bytes));
	}

	resume_inj();
	rc = ckpt_read_alloc(r, "b.f32", &got, &got_bytes);
	pause_inj();
	after[OP_ALLOC] = atomic_load(&inj_count);
	if (!op_result(rc, r, OP_ALLOC, n, failed)) {
		ck_assert_uint_eq(got_bytes, set->t[1].nbytes);
		ck_assert(!memcmp(got, set->t[1].data, got_bytes));
	} else {
		ck_assert_ptr_null(got);
	}
	ckpt_free(got);

	resume_inj();
	rc = ckpt_reader_verify(r, NULL, NULL);
	pause_inj();
	after[OP_VERIFY] = atomic_load(&inj_count);
	op_result(rc, r, OP_VERIFY, n, failed);

	resume_inj();
	ckpt_reader_close(r);
	pause_inj();
	after[OP_CLOSE] = atomic_load(&inj_count);
}

static void read_loop(int scope, int mode)
{
	const char *root = tu_tmpdir();
	ckpt_settings s;
	tu_set set;
	read_ctx x;
	ckpt *c;
	long n, failed = 0, after[OP_COUNT];
	int op;

	is_caller = 1;
	tu_settings(&s);
	make_set(&set);
	c = open_ok(root, &s);
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	memset(&x, 0, sizeof(x));
	x.set = &set;
	x.root = root;
	x.box_bytes = box_ext[0] * box_ext[1] * 2;
	x.whole = malloc(set.t[0].nbytes);
	x.box = malloc(x.box_bytes);
	x.box_want = malloc(x.box_bytes);
	x.b_buf = malloc(set.t[1].nbytes);
	x.c_buf = malloc(set.t[2].nbytes);
	ck_assert(x.whole && x.box && x.box_want && x.b_buf && x.c_buf);
	tu_extract_box(set.t[0].data, 2, set.t[0].shape, 2, box_off, box_ext,
		       x.box_want);
	for (n = 0; n < MAX_POINTS; n++) {
		arm(scope, mode, n ? n : MAX_POINTS * 10);
		pause_inj();
		memset(after, 0, sizeof(after));
		read_ops(&x, n, &failed, after);
		disarm();
		if (!n)
			ck_assert_int_gt(after[OP_CLOSE], 0);
		if (n && !atomic_load(&inj_fired))
			break;
	}
	ck_assert_int_lt(n, MAX_POINTS);
	report("reader (all ops)", scope, mode, n - 1, failed);
	for (op = 0; op < OP_COUNT; op++)
		fprintf(stderr, "alloc:   %-24s %5ld injection points\n",
			op_names[op], after[op] - (op ? after[op - 1] : 0));
	free(x.whole);
	free(x.box);
	free(x.box_want);
	free(x.b_buf);
	free(x.c_buf);
	tu_set_free(&set);
}

START_TEST(test_read_nth)
{
	read_loop(SC_ALL, MD_NTH);
}
END_TEST

START_TEST(test_read_background)
{
	read_loop(SC_BACKGROUND, MD_NTH);
}
END_TEST

START_TEST(test_read_from)
{
	read_loop(SC_ALL, MD_FROM);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("alloc");

	json_set_alloc_funcs(json_malloc_marked, free);
	TCase *open = tu_tcase("open", 300), *save = tu_tcase("save", 600);
	TCase *commit = tu_tcase("commit", 600), *read = tu_tcase("read", 600);

	tcase_add_test(open, test_open_nth);
	tcase_add_test(open, test_open_from);
	tcase_add_test(open, test_open_mmap);
	tcase_add_test(open, test_open_background);
	tcase_add_test(save, test_save_nth);
	tcase_add_test(save, test_save_background);
	tcase_add_test(save, test_save_caller);
	tcase_add_test(save, test_save_from);
	tcase_add_test(save, test_save_borrow);
	tcase_add_test(save, test_save_dedup);
	tcase_add_test(commit, test_commit_nth);
	tcase_add_test(commit, test_commit_from);
	tcase_add_test(read, test_read_nth);
	tcase_add_test(read, test_read_background);
	tcase_add_test(read, test_read_from);
	suite_add_tcase(s, open);
	suite_add_tcase(s, save);
	suite_add_tcase(s, commit);
	suite_add_tcase(s, read);
	return tu_main(s);
}
