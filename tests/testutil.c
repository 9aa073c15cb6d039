/*
 * testutil.c - see testutil.h. Plain POSIX; the one use of engine
 * internals is tu_check_reader_path (the reader's path counters, internal.h).
 */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <liburing.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ------------------------------------------------------------------ */
/* running and temp dirs                                              */
/* ------------------------------------------------------------------ */

static char session_dir[4096];
static char test_dir[4200];
static pid_t test_dir_pid;
static char *extra_dirs[256]; /* more dirs of one test, inside test_dir */
static int nextra;

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

char *tu_path(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) {
		fprintf(stderr, "out of memory\n");
		abort();
	}
	return s;
}

static int rm_cb(const char *path, const struct stat *sb, int flag,
		 struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	if (flag == FTW_DP || flag == FTW_D)
		return rmdir(path) ? 0 : 0;
	unlink(path);
	return 0;
}

int tu_rm_rf(const char *path)
{
	struct stat st;
	if (lstat(path, &st))
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlink(path) ? -errno : 0;
	/* make everything writable first: a test may have chmod'ed things */
	if (nftw(path, rm_cb, 32, FTW_DEPTH | FTW_PHYS))
		return -errno;
	return 0;
}

static const char *tmp_base(void)
{
	const char *t = getenv("TMPDIR");
	return t && *t ? t : "/tmp";
}

static void test_dir_cleanup(void)
{
	if (test_dir[0] && getpid() == test_dir_pid &&
	    !getenv("CKPT_TEST_KEEP"))
		tu_rm_rf(test_dir);
}

const char *tu_tmpdir(void)
{
	static int registered;
	if (test_dir[0] && getpid() == test_dir_pid) {
		/* a second call in one test: give a new one, same cleanup */
		char *p = tu_path("%s/XXXXXX", test_dir);
		if (!mkdtemp(p)) {
			perror("mkdtemp");
			abort();
		}
		if (nextra < 256)
			extra_dirs[nextra++] = p; /* reachable: valid until exit */
		return p;
	}
	const char *base = session_dir[0] ? session_dir : tmp_base();
	snprintf(test_dir, sizeof(test_dir), "%s/t-XXXXXX", base);
	if (!mkdtemp(test_dir)) {
		perror("mkdtemp");
		abort();
	}
	test_dir_pid = getpid();
	if (!registered) {
		registered = 1;
		atexit(test_dir_cleanup);
	}
	return test_dir;
}

void tu_skip_all(const char *why)
{
	fprintf(stderr, "SKIP: %s\n", why);
	exit(77);
}

TCase *tu_tcase(const char *name, double timeout_s)
{
	TCase *tc = tcase_create(name);
	const char *m = getenv("CKPT_TEST_TIMEOUT_MULT");
	double mult = m ? atof(m) : 1.0;
	if (mult <= 0)
		mult = 1.0;
	tcase_set_timeout(tc, timeout_s * mult);
	return tc;
}

static pid_t main_pid;

/* meson kills a test that times out with SIGTERM: remove the session
 * directory on the way out (only the runner process owns it). */
static void term_handler(int sig)
{
	if (getpid() == main_pid && !getenv("CKPT_TEST_KEEP"))
		tu_rm_rf(session_dir);
	signal(sig, SIG_DFL);
	raise(sig);
}

int tu_main(Suite *s)
{
	snprintf(session_dir, sizeof(session_dir), "%s/ckpt-test-XXXXXX",
		 tmp_base());
	if (!mkdtemp(session_dir)) {
		perror("mkdtemp");
		return 1;
	}
	main_pid = getpid();
	signal(SIGTERM, term_handler);
	signal(SIGINT, term_handler);
	signal(SIGHUP, term_handler);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_ENV);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	if (!getenv("CKPT_TEST_KEEP"))
		tu_rm_rf(session_dir);
	else
		fprintf(stderr, "kept %s\n", session_dir);
	return failed ? 1 : 0;
}

static int copy_file(const char *src, const char *dst, mode_t mode)
{
	int in = open(src, O_RDONLY), out = -1, rc = 0;
	char buf[1 << 16];
	if (in < 0)
		return -errno;
	out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, mode & 0777);
	if (out < 0) {
		rc = -errno;
		goto out;
	}
	for (;;) {
		ssize_t n = read(in, buf, sizeof(buf));
		if (n < 0) {
			rc = -errno;
			goto out;
		}
		if (n == 0)
			break;
		if (write(out, buf, (size_t)n) != n) {
			rc = -EIO;
			goto out;
		}
	}
out:
	if (out >= 0)
		close(out);
	close(in);
	return rc;
}

int tu_copy_tree(const char *src, const char *dst)
{
	DIR *d = opendir(src);
	int rc = 0;
	if (!d)
		return -errno;
	if (mkdir(dst, 0755) && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *s = tu_path("%s/%s", src, e->d_name);
		char *t = tu_path("%s/%s", dst, e->d_name);
		struct stat st;
		if (lstat(s, &st))
			rc = -errno;
		else if (S_ISDIR(st.st_mode))
			rc = tu_copy_tree(s, t);
		else if (S_ISREG(st.st_mode))
			rc = copy_file(s, t, st.st_mode);
		free(s);
		free(t);
		if (rc)
			goto out;
	}
out:
	closedir(d);
	return rc;
}

/* ------------------------------------------------------------------ */
/* deterministic data                                                 */
/* ------------------------------------------------------------------ */

void tu_rng_seed(tu_rng *r, uint64_t seed)
{
	/* splitmix64 so that nearby seeds give unrelated streams */
	uint64_t z = seed + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	r->s = z ? z : 0x2545f4914f6cdd1dull;
}

uint64_t tu_rng_next(tu_rng *r)
{
	uint64_t x = r->s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	r->s = x;
	return x * 0x2545f4914f6cdd1dull;
}

uint64_t tu_rng_below(tu_rng *r, uint64_t n)
{
	return tu_rng_next(r) % n;
}

double tu_rng_unit(tu_rng *r)
{
	return (double)(tu_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double tu_rng_normal(tu_rng *r)
{
	double s = 0;
	for (int i = 0; i < 12; i++)
		s += tu_rng_unit(r);
	return s - 6.0;
}

uint64_t tu_hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++) {
		h ^= (uint8_t)*s;
		h *= 0x100000001b3ull;
	}
	return h;
}

uint16_t tu_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((x >> 16) | 0x40);
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

uint16_t tu_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	uint32_t exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
	if (exp == 0xff)
		return sign | 0x7c00 | (mant ? 0x200 : 0);
	int e = (int)exp - 127 + 15;
	if (e >= 0x1f)
		return sign | 0x7c00;
	if (e <= 0) {
		if (e < -10)
			return sign;
		mant |= 0x800000;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

void tu_fill_bytes(void *buf, size_t n, uint64_t seed)
{
	tu_rng r;
	tu_rng_seed(&r, seed);
	uint8_t *p = buf;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = tu_rng_next(&r);
		memcpy(p + i, &v, 8);
	}
	if (i < n) {
		uint64_t v = tu_rng_next(&r);
		memcpy(p + i, &v, n - i);
	}
}

void tu_fill_bf16_normal(uint16_t *buf, size_t n, uint64_t seed, double sd)
{
	tu_rng r;
	tu_rng_seed(&r, seed);
	for (size_t i = 0; i < n; i++)
		buf[i] = tu_f32_to_bf16((float)(tu_rng_normal(&r) * sd));
}

void tu_fill_dtype(int dtype, void *buf, size_t nbytes, uint64_t seed)
{
	tu_rng r;
	tu_rng_seed(&r, seed ^ ((uint64_t)dtype << 56));
	uint8_t *p = buf;
	size_t es = ckpt_dtype_size(dtype);
	if (es == 0)
		es = 1;
	size_t n = nbytes / es, i;
	for (i = 0; i < n; i++) {
		uint8_t *q = p + i * es;
		switch (dtype) {
		case CKPT_BOOL:
			*q = (uint8_t)(tu_rng_next(&r) >> 63);
			break;
		case CKPT_BF16: {
			uint16_t v = tu_f32_to_bf16(
				(float)(tu_rng_normal(&r) * 0.02));
			memcpy(q, &v, 2);
			break;
		}
		case CKPT_F16: {
			uint16_t v = tu_f32_to_f16(
				(float)(tu_rng_normal(&r) * 0.02));
			memcpy(q, &v, 2);
			break;
		}
		case CKPT_F32: {
			float v = (float)tu_rng_normal(&r);
			memcpy(q, &v, 4);
			break;
		}
		case CKPT_F64: {
			double v = tu_rng_normal(&r);
			memcpy(q, &v, 8);
			break;
		}
		case CKPT_I16:
		case CKPT_I32:
		case CKPT_I64: {
			int64_t v = (int64_t)tu_rng_below(&r, 2001) - 1000;
			if ((tu_rng_next(&r) & 15) == 0)
				v = (int64_t)tu_rng_next(&r);
			memcpy(q, &v, es); /* little-endian truncation */
			break;
		}
		case CKPT_U16:
		case CKPT_U32:
		case CKPT_U64: {
			uint64_t v = tu_rng_below(&r, 5000);
			if ((tu_rng_next(&r) & 15) == 0)
				v = tu_rng_next(&r);
			memcpy(q, &v, es);
			break;
		}
		default: {
			uint64_t v = tu_rng_next(&r);
			memcpy(q, &v, es < 8 ? es : 8);
		}
		}
	}
	for (i = n * es; i < nbytes; i++)
		p[i] = (uint8_t)tu_rng_next(&r);
}

/* ------------------------------------------------------------------ */
/* tensor sets                                                        */
/* ------------------------------------------------------------------ */

uint64_t tu_count(uint32_t ndim, const uint64_t *dims)
{
	uint64_t n = 1;
	for (uint32_t i = 0; i < ndim; i++)
		n *= dims[i];
	return n;
}

void tu_set_init(tu_set *s)
{
	memset(s, 0, sizeof(*s));
}

void tu_set_free(tu_set *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->t[i].name);
		free(s->t[i].data);
	}
	free(s->t);
	memset(s, 0, sizeof(*s));
}

static tu_tensor *set_push(tu_set *s, const char *name, int dtype,
			   uint32_t ndim, const uint64_t *shape)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 16;
		s->t = realloc(s->t, s->cap * sizeof(*s->t));
		if (!s->t)
			abort();
	}
	tu_tensor *t = &s->t[s->n++];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	t->dtype = dtype;
	t->ndim = ndim;
	for (uint32_t i = 0; i < ndim && i < CKPT_MAX_NDIM; i++)
		t->shape[i] = shape[i];
	return t;
}

tu_tensor *tu_set_add(tu_set *s, const char *name, int dtype, uint32_t ndim,
		      const uint64_t *shape, uint64_t seed)
{
	tu_tensor *t = set_push(s, name, dtype, ndim, shape);
	t->nbytes = tu_count(ndim, shape) * ckpt_dtype_size(dtype);
	t->data = xmalloc(t->nbytes);
	tu_fill_dtype(dtype, t->data, t->nbytes, seed);
	return t;
}

tu_tensor *tu_set_add_nofill(tu_set *s, const char *name, int dtype,
			     uint32_t ndim, const uint64_t *shape)
{
	tu_tensor *t = set_push(s, name, dtype, ndim, shape);
	t->nbytes = tu_count(ndim, shape) * ckpt_dtype_size(dtype);
	t->data = xmalloc(t->nbytes);
	return t;
}

void *tu_global_data(int dtype, uint32_t ndim, const uint64_t *shape,
		     uint64_t seed, uint64_t *nbytes)
{
	uint64_t n = tu_count(ndim, shape) * ckpt_dtype_size(dtype);
	void *p = xmalloc(n);
	tu_fill_dtype(dtype, p, n, seed);
	if (nbytes)
		*nbytes = n;
	return p;
}

void tu_extract_box(const void *src, uint32_t ndim, const uint64_t *shape,
		    size_t elem, const uint64_t *off, const uint64_t *ext,
		    void *dst)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	if (ndim == 0) {
		memcpy(d, s, elem);
		return;
	}
	uint64_t total = tu_count(ndim, ext);
	if (total == 0)
		return;
	uint64_t row = ext[ndim - 1] * elem;
	uint64_t rows = total / ext[ndim - 1];
	uint64_t idx[CKPT_MAX_NDIM] = {0};
	for (uint64_t r = 0; r < rows; r++) {
		/* source linear index of (off + idx) with last dim at off */
		uint64_t lin = 0;
		for (uint32_t k = 0; k < ndim; k++)
			lin = lin * shape[k] + off[k] + (k + 1 < ndim ? idx[k] : 0);
		memcpy(d + r * row, s + lin * elem, row);
		for (int k = (int)ndim - 2; k >= 0; k--) {
			if (++idx[k] < ext[k])
				break;
			idx[k] = 0;
		}
	}
}

tu_tensor *tu_set_add_slice(tu_set *s, const char *name, int dtype,
			    uint32_t ndim, const uint64_t *shape,
			    const uint64_t *off, const uint64_t *ext,
			    uint64_t seed)
{
	tu_tensor *t = set_push(s, name, dtype, ndim, shape);
	size_t es = ckpt_dtype_size(dtype);
	t->sliced = 1;
	for (uint32_t i = 0; i < ndim; i++) {
		t->off[i] = off[i];
		t->ext[i] = ext[i];
	}
	t->nbytes = tu_count(ndim, ext) * es;
	t->data = xmalloc(t->nbytes);
	void *g = tu_global_data(dtype, ndim, shape, seed, NULL);
	tu_extract_box(g, ndim, shape, es, off, ext, t->data);
	free(g);
	return t;
}

ckpt_tensor tu_bytes_tensor(const char *name, void *data, uint64_t n,
			    uint64_t *dim)
{
	*dim = n;
	return (ckpt_tensor){ .name = name,
			      .dtype = CKPT_U8,
			      .ndim = 1,
			      .shape = dim,
			      .data = data,
			      .nbytes = n };
}

void tu_set_view(const tu_set *s, ckpt_tensor *out)
{
	for (size_t i = 0; i < s->n; i++) {
		const tu_tensor *t = &s->t[i];
		memset(&out[i], 0, sizeof(out[i]));
		out[i].name = t->name;
		out[i].dtype = t->dtype;
		out[i].ndim = t->ndim;
		out[i].shape = t->shape;
		out[i].slice_offset = t->sliced ? t->off : NULL;
		out[i].slice_extent = t->sliced ? t->ext : NULL;
		out[i].data = t->data;
		out[i].nbytes = t->nbytes;
	}
}

uint64_t tu_set_bytes(const tu_set *s)
{
	uint64_t b = 0;
	for (size_t i = 0; i < s->n; i++)
		b += s->t[i].nbytes;
	return b;
}

int tu_save_async(ckpt *c, uint64_t step, const tu_set *s)
{
	ckpt_tensor *v = xmalloc((s->n ? s->n : 1) * sizeof(*v));
	tu_set_view(s, v);
	int rc = ckpt_save(c, step, v, s->n);
	free(v);
	return rc;
}

int tu_save(ckpt *c, uint64_t step, const tu_set *s)
{
	int rc = tu_save_async(c, step, s);
	if (rc)
		return rc;
	return ckpt_wait(c);
}

static void whyf(char *why, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void whyf(char *why, size_t len, const char *fmt, ...)
{
	if (!why || !len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

int tu_check_set(ckpt_reader *r, const tu_set *s, char *why, size_t whylen)
{
	for (size_t i = 0; i < s->n; i++) {
		const tu_tensor *t = &s->t[i];
		void *buf = xmalloc(t->nbytes);
		memset(buf, 0xA5, t->nbytes);
		int rc;
		if (t->sliced)
			rc = ckpt_read_slice(r, t->name, t->off, t->ext, buf,
					     t->nbytes);
		else
			rc = ckpt_read(r, t->name, buf, t->nbytes);
		if (rc) {
			whyf(why, whylen, "read \"%.200s\": %s (%d): %s",
			     t->name, ckpt_strerror(rc), rc,
			     ckpt_reader_errmsg(r));
			free(buf);
			return rc;
		}
		if (t->nbytes && memcmp(buf, t->data, t->nbytes)) {
			uint64_t k = 0;
			const uint8_t *a = buf, *b = t->data;
			while (a[k] == b[k])
				k++;
			whyf(why, whylen,
			     "tensor \"%.200s\": byte %llu of %llu differs "
			     "(got %02x want %02x)",
			     t->name, (unsigned long long)k,
			     (unsigned long long)t->nbytes, a[k], b[k]);
			free(buf);
			return 1;
		}
		free(buf);
	}
	return 0;
}

int tu_check_root(const char *root, uint64_t step, const tu_set *s,
		  char *why, size_t whylen)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, root, step, NULL);
	if (rc) {
		whyf(why, whylen, "reader_open: %s (%d): %s", ckpt_strerror(rc),
		     rc, ckpt_reader_errmsg(NULL));
		return rc;
	}
	rc = ckpt_reader_verify(r, NULL, NULL);
	if (rc) {
		whyf(why, whylen, "verify: %s (%d): %s", ckpt_strerror(rc), rc,
		     ckpt_reader_errmsg(r));
		goto out;
	}
	rc = tu_check_set(r, s, why, whylen);
out:
	{
		/* a ring the reader had to abandon is recovered from, but
		 * the log should say so (test_reader_ring.c) */
		eng_reader_io_stats st;

		eng_reader_io_stats_get(r, &st);
		if (st.uring_stalls)
			fprintf(stderr, "note: %s step %llu: the reader's "
				"io_uring stalled %llu time(s); read again "
				"with pread\n", root, (unsigned long long)step,
				(unsigned long long)st.uring_stalls);
	}
	ckpt_reader_close(r);
	return rc;
}

/* ------------------------------------------------------------------ */
/* files                                                              */
/* ------------------------------------------------------------------ */

char *tu_step_dir(const char *root, uint64_t step)
{
	return tu_path("%s/step-%020llu", root, (unsigned long long)step);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int tu_list_files(const char *dir, char ***names)
{
	DIR *d = opendir(dir);
	*names = NULL;
	if (!d)
		return -errno;
	int n = 0, cap = 0;
	char **v = NULL;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *p = tu_path("%s/%s", dir, e->d_name);
		struct stat st;
		int reg = !lstat(p, &st) && S_ISREG(st.st_mode);
		free(p);
		if (!reg)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			v = realloc(v, (size_t)cap * sizeof(*v));
			if (!v)
				abort();
		}
		v[n++] = strdup(e->d_name);
	}
	closedir(d);
	if (n)
		qsort(v, (size_t)n, sizeof(*v), cmp_str);
	*names = v;
	return n;
}

void tu_free_names(char **names, int n)
{
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

int tu_count_suffix(const char *dir, const char *suffix)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int n = 0;
	size_t sl = strlen(suffix);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		size_t l = strlen(e->d_name);
		if (l >= sl && !strcmp(e->d_name + l - sl, suffix))
			n++;
		char *p = tu_path("%s/%s", dir, e->d_name);
		struct stat st;
		if (!lstat(p, &st) && S_ISDIR(st.st_mode))
			n += tu_count_suffix(p, suffix);
		free(p);
	}
	closedir(d);
	return n;
}

int64_t tu_file_size(const char *path)
{
	struct stat st;
	if (stat(path, &st))
		return -errno;
	return (int64_t)st.st_size;
}

int tu_flip_bit(const char *path, uint64_t off, unsigned bit)
{
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return -errno;
	uint8_t b;
	int rc = 0;
	if (pread(fd, &b, 1, (off_t)off) != 1) {
		rc = -EIO;
		goto out;
	}
	b ^= (uint8_t)(1u << (bit & 7));
	if (pwrite(fd, &b, 1, (off_t)off) != 1)
		rc = -EIO;
out:
	close(fd);
	return rc;
}

int tu_truncate(const char *path, uint64_t len)
{
	return truncate(path, (off_t)len) ? -errno : 0;
}

int tu_read_file(const char *path, uint8_t **buf, size_t *len)
{
	int fd = open(path, O_RDONLY);
	*buf = NULL;
	*len = 0;
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st)) {
		close(fd);
		return -errno;
	}
	uint8_t *b = xmalloc((size_t)st.st_size);
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = pread(fd, b + got, (size_t)st.st_size - got,
				  (off_t)got);
		if (n <= 0) {
			free(b);
			close(fd);
			return n < 0 ? -errno : -EIO;
		}
		got += (size_t)n;
	}
	close(fd);
	*buf = b;
	*len = got;
	return 0;
}

int tu_write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	size_t done = 0;
	while (done < len) {
		ssize_t n = pwrite(fd, (const uint8_t *)buf + done, len - done,
				   (off_t)done);
		if (n <= 0) {
			close(fd);
			return n < 0 ? -errno : -EIO;
		}
		done += (size_t)n;
	}
	close(fd);
	return 0;
}

int tu_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

void tu_settings(ckpt_settings *s)
{
	ckpt_settings_default(s);
	s->staging_bytes = 8u << 20;
	s->chunk_bytes = 64u << 10;
	s->threads = 2;
	s->files_per_host = 2;
}

/* ---- I/O paths ---- */

int tu_uring_works(void)
{
	struct io_uring ring;

	if (io_uring_queue_init(4, &ring, 0) < 0)
		return 0;
	io_uring_queue_exit(&ring);
	return 1;
}

int tu_sqe_cancel_to_nop(void *p, int on)
{
	struct io_uring_sqe *sqe = p;
	uint64_t ud = sqe->user_data;

	if (!on || sqe->opcode != IORING_OP_ASYNC_CANCEL)
		return 0;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_NOP;
	sqe->user_data = ud;
	return 1;
}

int tu_check_reader_path(ckpt_reader *r, uint32_t flags, const char *root,
			 char *why, size_t whylen)
{
	eng_reader_io_stats st;
	int want_uring = !(flags & CKPT_F_NO_URING) && tu_uring_works();
	int want_direct = !(flags & CKPT_F_NO_DIRECT) &&
			  eng_probe_direct(root);
	uint64_t want_fallbacks = !(flags & CKPT_F_NO_URING) && !want_uring;

	eng_reader_io_stats_get(r, &st);
	fprintf(stderr, "reader flags 0x%x: %llu io_uring reads, %llu preads, "
		"%llu O_DIRECT files, %llu ring fallbacks\n", flags,
		(unsigned long long)st.uring_reads,
		(unsigned long long)st.pread_reads,
		(unsigned long long)st.direct_files,
		(unsigned long long)st.uring_fallbacks);
	if (want_uring ? st.uring_reads == 0 || st.pread_reads != 0
		       : st.uring_reads != 0 || st.pread_reads == 0)
		snprintf(why, whylen, "reader flags 0x%x: want %s, got %llu "
			 "io_uring reads and %llu preads", flags,
			 want_uring ? "io_uring" : "pread",
			 (unsigned long long)st.uring_reads,
			 (unsigned long long)st.pread_reads);
	else if (want_direct != (st.direct_files > 0))
		snprintf(why, whylen, "reader flags 0x%x: want O_DIRECT %s, "
			 "got %llu O_DIRECT files", flags,
			 want_direct ? "on" : "off",
			 (unsigned long long)st.direct_files);
	else if (st.uring_fallbacks != want_fallbacks)
		snprintf(why, whylen, "reader flags 0x%x: %llu ring fallbacks",
			 flags, (unsigned long long)st.uring_fallbacks);
	else
		return 0;
	return -1;
}

/* ------------------------------------------------------------------ */
/* loopback servers                                                   */
/* ------------------------------------------------------------------ */

#define TU_PYTHON "/usr/bin/python3"
#define TU_SERVER_PATIENCE_S 60.0

double tu_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The port the server wrote, or 0 while the file is absent or empty. */
static int read_port(const char *portfile)
{
	FILE *f = fopen(portfile, "r");
	int port = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%d", &port) != 1 || port <= 0)
		port = 0;
	fclose(f);
	return port;
}

static void server_exec(const char *script, const char *portfile,
			const char *const *args)
{
	const char *argv[40] = { TU_PYTHON, script, "--port-file", portfile };
	int k = 4, null = open("/dev/null", O_WRONLY);

	/* the server goes when the test does, however it ends */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (null >= 0 && !getenv("TU_SERVER_VERBOSE"))
		dup2(null, 1);
	while (args && *args && k < 39)
		argv[k++] = *args++;
	argv[k] = NULL;
	execv(TU_PYTHON, (char *const *)argv);
	_exit(127);
}

void tu_server_start(tu_server *s, const char *script, const char *const *args)
{
	const char *src = getenv("CKPT_TEST_SRCDIR");
	const char *m = getenv("CKPT_TEST_TIMEOUT_MULT");
	double patience =
		TU_SERVER_PATIENCE_S * (m && atof(m) > 0 ? atof(m) : 1.0);
	char *path, *portfile;
	double t0 = tu_now_s();
	int port;

	if (access(TU_PYTHON, X_OK) != 0)
		tu_skip_all(TU_PYTHON " is missing: cannot run the servers");
	path = strchr(script, '/') ?
		       tu_path("%s", script) :
		       tu_path("%s/servers/%s", src ? src : "tests", script);
	if (access(path, R_OK) != 0) {
		fprintf(stderr, "server %s is missing\n", path);
		tu_skip_all("a server of tests/servers is missing");
	}
	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "%s/tu-server-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(s->dir)) {
		fprintf(stderr, "%s: mkdtemp: %s\n", s->dir, strerror(errno));
		exit(1);
	}
	portfile = tu_path("%s/port", s->dir);
	fflush(NULL);
	s->pid = fork();
	if (s->pid < 0) {
		fprintf(stderr, "fork: %s\n", strerror(errno));
		exit(1);
	}
	if (s->pid == 0)
		server_exec(path, portfile, args);
	while ((port = read_port(portfile)) == 0) {
		if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
			fprintf(stderr, "%s exited at start\n", path);
			exit(1);
		}
		if (tu_now_s() - t0 > patience) {
			fprintf(stderr, "%s did not listen in %.0f s\n", path,
				patience);
			kill(s->pid, SIGKILL);
			exit(1);
		}
		usleep(10000);
	}
	snprintf(s->host, sizeof(s->host), "127.0.0.1:%d", port);
	snprintf(s->url, sizeof(s->url), "http://%s", s->host);
	free(portfile);
	free(path);
}

int tu_server_stop(tu_server *s)
{
	char *portfile;
	int st = -1;

	if (s->pid > 0) {
		kill(s->pid, SIGTERM);
		if (waitpid(s->pid, &st, 0) != s->pid)
			st = -1;
		s->pid = 0;
	}
	if (s->dir[0]) {
		portfile = tu_path("%s/port", s->dir);
		unlink(portfile);
		free(portfile);
		rmdir(s->dir);
		s->dir[0] = 0;
	}
	return st;
}
