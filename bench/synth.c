/*
 * synth.c - synthetic transformer-like models (see synth.h).
 *
 * Values come from a 64 Ki-entry table of N(0, 0.02) samples indexed by a
 * counter-based hash (splitmix64 of key + counter), so any element can be
 * produced independently of the others: filling parallelises trivially and
 * the demo can regenerate a tensor to check a restore. The table keeps the
 * value distribution (sign, exponent spread, mantissa noise) realistic,
 * which is what matters for the float codec's ratio. It also holds the
 * small timing, sizing and file-system helpers the benchmarks share.
 */
#include "synth.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TABLE_SIZE 65536u
#define PIECE_BYTES (4u << 20) /* unit of work when filling */

static float table_f32[TABLE_SIZE];
static uint16_t table_bf16[TABLE_SIZE];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ull

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	/* round to nearest even; the table has no NaNs */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static void table_init(void)
{
	uint64_t ctr = 12345;

	for (unsigned i = 0; i < TABLE_SIZE; i += 2) {
		/* Box-Muller on two uniforms in (0, 1] */
		double u1 = ((mix64(ctr++ * GOLDEN) >> 11) + 1.0) /
			    9007199254740992.0;
		double u2 = ((mix64(ctr++ * GOLDEN) >> 11) + 1.0) /
			    9007199254740992.0;
		double r = sqrt(-2.0 * log(u1)) * 0.02;

		table_f32[i] = (float)(r * cos(2.0 * M_PI * u2));
		table_f32[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
	}
	for (unsigned i = 0; i < TABLE_SIZE; i++)
		table_bf16[i] = f32_to_bf16(table_f32[i]);
}

static uint64_t tensor_key(uint64_t seed, size_t i)
{
	return mix64(seed * 0xd6e8feb86659fd93ull + i * GOLDEN + 1);
}

/* Elements [e0, e0 + n) of a tensor with key `key`. */
static void gen_elems(int dtype, uint64_t key, uint64_t seed, uint64_t e0,
		      uint64_t n, void *dst)
{
	uint64_t e = e0, end = e0 + n;

	if (dtype == CKPT_BF16) {
		uint16_t *p = dst;

		while (e < end) {
			uint64_t u = mix64(key + (e >> 2) * GOLDEN);
			unsigned k = e & 3;

			for (; k < 4 && e < end; k++, e++)
				*p++ = table_bf16[(u >> (16 * k)) & 0xffff];
		}
	} else if (dtype == CKPT_F32) {
		float *p = dst;

		while (e < end) {
			uint64_t u = mix64(key + (e >> 2) * GOLDEN);
			unsigned k = e & 3;

			for (; k < 4 && e < end; k++, e++)
				*p++ = table_f32[(u >> (16 * k)) & 0xffff];
		}
	} else if (dtype == CKPT_I64) {
		int64_t *p = dst;

		for (; e < end; e++)
			*p++ = (int64_t)seed;
	} else {
		uint8_t *p = dst;
		size_t w = ckpt_dtype_size(dtype);

		for (; e < end; e++)
			for (size_t b = 0; b < w; b++)
				*p++ = (uint8_t)mix64(key + e * w + b);
	}
}

void synth_fill_range(const struct synth_model *m, size_t i, uint64_t seed,
		      uint64_t off, uint64_t len, void *dst)
{
	const struct synth_tensor *t = &m->t[i];
	size_t w = ckpt_dtype_size(t->dtype);

	pthread_once(&table_once, table_init);
	gen_elems(t->dtype, tensor_key(seed, i), seed, off / w, len / w, dst);
}

/* ---- planning ---- */

static int add_tensor(struct synth_model *m, size_t *cap, int dtype,
		      uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt,
		      ...) __attribute__((format(printf, 7, 8)));

static int add_tensor(struct synth_model *m, size_t *cap, int dtype,
		      uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt,
		      ...)
{
	struct synth_tensor *t;
	va_list ap;

	if (m->count == *cap) {
		size_t ncap = *cap ? *cap * 2 : 64;
		void *p = realloc(m->t, ncap * sizeof(*m->t));

		if (!p)
			return -ENOMEM;
		m->t = p;
		*cap = ncap;
	}
	t = &m->t[m->count++];
	memset(t, 0, sizeof(*t));
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof(t->name), fmt, ap);
	va_end(ap);
	t->dtype = dtype;
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->nbytes = ckpt_dtype_size(dtype);
	for (uint32_t k = 0; k < ndim; k++)
		t->nbytes *= t->shape[k];
	m->total_bytes += t->nbytes;
	return 0;
}

/* Bytes of one layer of width d (bf16 matrices; norms bf16 or f32). */
static uint64_t layer_bytes(uint64_t d, uint64_t ffn, size_t norm_w)
{
	return (4 * d * d + 3 * d * ffn) * 2 + 2 * d * norm_w;
}

int synth_plan(struct synth_model *m, uint64_t target, uint32_t layers,
	       unsigned flags)
{
	size_t norm_w = (flags & SYNTH_F32_NORMS) ? 4 : 2;
	int norm_dt = (flags & SYNTH_F32_NORMS) ? CKPT_F32 : CKPT_BF16;
	uint32_t nominal = layers ? layers : 40;
	uint64_t d = 128, ffn, vocab, fixed, per;
	size_t cap = 0;
	int err = 0;

	memset(m, 0, sizeof(*m));
	/* ~12 d^2 per layer plus embedding and head of 16 d^2 each */
	while ((12ull * nominal + 32) * (d + 128) * (d + 128) * 2 <= target &&
	       d < 16384)
		d += 128;
	ffn = (d * 8 / 3 + 127) / 128 * 128;
	vocab = 16 * d;
	per = layer_bytes(d, ffn, norm_w);
	fixed = 2 * vocab * d * 2 + d * norm_w;
	if (fixed + per > target)
		return -EINVAL;
	if (!layers)
		layers = (uint32_t)((target - fixed) / per);
	m->d_model = (uint32_t)d;
	m->layers = layers;

	err = add_tensor(m, &cap, CKPT_BF16, 2, vocab, d,
			 "model.embed_tokens.weight");
	for (uint32_t l = 0; l < layers && !err; l++) {
		static const char *const attn[] = { "q", "k", "v", "o" };

		for (int k = 0; k < 4 && !err; k++)
			err = add_tensor(
				m, &cap, CKPT_BF16, 2, d, d,
				"model.layers.%u.self_attn.%s_proj.weight", l,
				attn[k]);
		if (!err)
			err = add_tensor(m, &cap, CKPT_BF16, 2, ffn, d,
					 "model.layers.%u.mlp.gate_proj.weight",
					 l);
		if (!err)
			err = add_tensor(m, &cap, CKPT_BF16, 2, ffn, d,
					 "model.layers.%u.mlp.up_proj.weight",
					 l);
		if (!err)
			err = add_tensor(m, &cap, CKPT_BF16, 2, d, ffn,
					 "model.layers.%u.mlp.down_proj.weight",
					 l);
		if (!err)
			err = add_tensor(
				m, &cap, norm_dt, 1, d, 0,
				"model.layers.%u.input_layernorm.weight", l);
		if (!err)
			err = add_tensor(
				m, &cap, norm_dt, 1, d, 0,
				"model.layers.%u.post_attention_layernorm.weight",
				l);
	}
	if (!err)
		err = add_tensor(m, &cap, norm_dt, 1, d, 0,
				 "model.norm.weight");
	if (!err)
		err = add_tensor(m, &cap, CKPT_BF16, 2, vocab, d,
				 "lm_head.weight");
	if (!err && (flags & SYNTH_STEP_SCALAR))
		err = add_tensor(m, &cap, CKPT_I64, 0, 0, 0, "trainer.step");
	if (!err && (flags & SYNTH_EXACT) && m->total_bytes + 2 <= target)
		err = add_tensor(m, &cap, CKPT_BF16, 1,
				 (target - m->total_bytes) / 2, 0,
				 "extra.filler");
	if (err)
		synth_free(m);
	return err;
}

int synth_alloc(struct synth_model *m)
{
	for (size_t i = 0; i < m->count; i++) {
		uint64_t n = (m->t[i].nbytes + 63) / 64 * 64;

		m->t[i].data = aligned_alloc(64, n ? n : 64);
		if (!m->t[i].data)
			return -ENOMEM;
	}
	return 0;
}

void synth_free(struct synth_model *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->count; i++)
		free(m->t[i].data);
	free(m->t);
	memset(m, 0, sizeof(*m));
}

/* ---- parallel fill ---- */

struct fill_job {
	struct synth_model *m;
	uint64_t seed;
	atomic_size_t next; /* next piece to fill */
	size_t *piece_tensor;
	uint64_t *piece_off;
	size_t pieces;
};

static void *fill_worker(void *arg)
{
	struct fill_job *j = arg;
	size_t k;

	while ((k = atomic_fetch_add(&j->next, 1)) < j->pieces) {
		size_t i = j->piece_tensor[k];
		struct synth_tensor *t = &j->m->t[i];
		uint64_t off = j->piece_off[k];
		uint64_t len = t->nbytes - off;

		if (len > PIECE_BYTES)
			len = PIECE_BYTES;
		synth_fill_range(j->m, i, j->seed, off, len,
				 (uint8_t *)t->data + off);
	}
	return NULL;
}

void synth_fill(struct synth_model *m, uint64_t seed, unsigned threads)
{
	struct fill_job j = { .m = m, .seed = seed };
	pthread_t tid[64];
	size_t n = 0;

	pthread_once(&table_once, table_init);
	if (!threads) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);

		threads = c > 0 ? (unsigned)c : 1;
	}
	if (threads > 64)
		threads = 64;
	for (size_t i = 0; i < m->count; i++)
		n += (m->t[i].nbytes + PIECE_BYTES - 1) / PIECE_BYTES;
	j.piece_tensor = malloc((n + 1) * sizeof(size_t));
	j.piece_off = malloc((n + 1) * sizeof(uint64_t));
	if (!j.piece_tensor || !j.piece_off) {
		threads = 0; /* fall back to a serial fill below */
	} else {
		for (size_t i = 0; i < m->count; i++)
			for (uint64_t off = 0; off < m->t[i].nbytes;
			     off += PIECE_BYTES) {
				j.piece_tensor[j.pieces] = i;
				j.piece_off[j.pieces++] = off;
			}
	}
	if (threads) {
		unsigned started = 0;

		atomic_init(&j.next, 0);
		for (; started + 1 < threads; started++)
			if (pthread_create(&tid[started], NULL, fill_worker,
					   &j))
				break;
		fill_worker(&j);
		for (unsigned k = 0; k < started; k++)
			pthread_join(tid[k], NULL);
	} else {
		for (size_t i = 0; i < m->count; i++)
			synth_fill_range(m, i, seed, 0, m->t[i].nbytes,
					 m->t[i].data);
	}
	free(j.piece_tensor);
	free(j.piece_off);
}

void synth_to_ckpt(const struct synth_model *m, ckpt_tensor *out)
{
	for (size_t i = 0; i < m->count; i++) {
		const struct synth_tensor *t = &m->t[i];

		memset(&out[i], 0, sizeof(out[i]));
		out[i].name = t->name;
		out[i].dtype = t->dtype;
		out[i].ndim = t->ndim;
		out[i].shape = t->shape;
		out[i].data = t->data;
		out[i].nbytes = t->nbytes;
	}
}

void synth_warm(void *p, size_t n)
{
	/* through a volatile pointer: the call cannot be recognised */
	static void *(*volatile set)(void *, int, size_t) = memset;

	set(p, 0, n);
}

void synth_touch(const void *p, size_t n)
{
	const volatile uint8_t *b = p;
	uint8_t x = 0;

	for (size_t o = 0; o < n; o += 4096)
		x ^= b[o];
	(void)x;
}

int synth_drop_caches(void)
{
	int fd, err = 0;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, "3\n", 2) != 2)
		err = -errno;
	close(fd);
	return err;
}

static int rm_cb(const char *path, const struct stat *sb, int flag,
		 struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path) ? -1 : 0;
}

void synth_rm_tree(const char *path)
{
	nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

void synth_mkdir_p(const char *dir)
{
	char buf[4096];

	snprintf(buf, sizeof(buf), "%s", dir);
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			mkdir(buf, 0755);
			*p = '/';
		}
	mkdir(buf, 0755);
}

double synth_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int synth_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		v *= 1024.0;
		end++;
		break;
	case 'm':
	case 'M':
		v *= 1024.0 * 1024;
		end++;
		break;
	case 'g':
	case 'G':
		v *= 1024.0 * 1024 * 1024;
		end++;
		break;
	case 't':
	case 'T':
		v *= 1024.0 * 1024 * 1024 * 1024;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	else if (*end == 'B')
		end++;
	if (*end || v > 1.8e19)
		return -1;
	*out = (uint64_t)v;
	return 0;
}

const char *synth_fmt_bytes(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024.0 && u < 4) {
		d /= 1024.0;
		u++;
	}
	snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", d, unit[u]);
	return buf;
}
