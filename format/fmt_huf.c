/*
 * fmt_huf.c - static canonical Huffman coder for byte planes (plane mode 2
 * of the float codec, SPEC.md section 5.3).
 *
 * A plane of n bytes is coded with one code of at most FMT_HUF_MAXLEN bits
 * per symbol, in 4 bit streams: with q = ceil(n / 4), stream s codes
 * bytes [min(s*q, n), min((s+1)*q, n)). Layout:
 *     128 bytes  code length of symbol x in nibble (x & 1) of byte x / 2
 *                (low nibble for even x), 0 = symbol absent
 *     4 x u32    byte size of streams 0..3
 *     streams 0..3, back to back.
 * The lengths must form a complete prefix code (Kraft sum exactly 1), so
 * every FMT_HUF_MAXLEN-bit window decodes to a symbol. Codes are the
 * canonical ones of DEFLATE (RFC 1951, 3.2.2) and are written into the
 * stream starting with their most significant bit, bits filling each byte
 * from its least significant bit up; a stream ends with the last symbol's
 * bits, zero-padded to a byte.
 *
 * Encoding knows each stream's exact size in advance (from per-stream
 * histograms) and writes straight into place; the fast loops store and
 * load 8 bytes at a time only while 8 bytes remain in the stream, and the
 * tails go byte by byte, so nothing is ever read or written outside the
 * stream. fmt_huf_encode_elems codes the exponent plane of floats without
 * splitting it off or counting it (its code comes from a sample): it
 * writes each stream into a quarter of dst and moves them together.
 * Decoding checks the lengths, the sizes, and that every stream is
 * consumed exactly, with zero padding.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "fmt_huf.h"

#define TBITS FMT_HUF_MAXLEN
#define TSIZE (1u << TBITS)
#define TMASK (TSIZE - 1u)

/* Up to 8 bytes of b[pos..size), zeros past the end. */
static inline uint64_t ld64_tail(const uint8_t *b, size_t size, size_t pos)
{
	uint64_t v = 0;

	if (pos + 8 <= size)
		return fmt_get_u64(b + pos);
	for (unsigned k = 0; k < 8 && pos + k < size; k++)
		v |= (uint64_t)b[pos + k] << (8 * k);
	return v;
}

/* Stream s covers plane bytes [seg(s), seg(s + 1)). */
static inline size_t seg(size_t n, unsigned s)
{
	size_t q = n / FMT_HUF_STREAMS + (n % FMT_HUF_STREAMS != 0);
	size_t x = q * s;

	return x < n ? x : n;
}

static void hist1(const uint8_t *p, size_t n, uint32_t h[256])
{
	/* 8 tables so that runs of one symbol do not serialize on one
	 * counter */
	uint32_t t[8][256];
	size_t i = 0;

	memset(t, 0, sizeof(t));
	for (; i + 16 <= n; i += 16) {
		uint64_t a = fmt_get_u64(p + i), b = fmt_get_u64(p + i + 8);

		t[0][a & 0xff]++;
		t[1][(a >> 8) & 0xff]++;
		t[2][(a >> 16) & 0xff]++;
		t[3][(a >> 24) & 0xff]++;
		t[4][(a >> 32) & 0xff]++;
		t[5][(a >> 40) & 0xff]++;
		t[6][(a >> 48) & 0xff]++;
		t[7][a >> 56]++;
		t[0][b & 0xff]++;
		t[1][(b >> 8) & 0xff]++;
		t[2][(b >> 16) & 0xff]++;
		t[3][(b >> 24) & 0xff]++;
		t[4][(b >> 32) & 0xff]++;
		t[5][(b >> 40) & 0xff]++;
		t[6][(b >> 48) & 0xff]++;
		t[7][b >> 56]++;
	}
	for (; i < n; i++)
		t[i & 7][p[i]]++;
	for (unsigned x = 0; x < 256; x++)
		h[x] = t[0][x] + t[1][x] + t[2][x] + t[3][x] + t[4][x] +
		       t[5][x] + t[6][x] + t[7][x];
}

void fmt_huf_hist(const uint8_t *p, size_t n,
		  uint32_t h[FMT_HUF_STREAMS][256])
{
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++)
		hist1(p + seg(n, s), seg(n, s + 1) - seg(n, s), h[s]);
}

struct leaf {
	uint64_t w;
	unsigned sym;
};

static int leaf_cmp(const void *a, const void *b)
{
	const struct leaf *x = a, *y = b;

	if (x->w != y->w)
		return x->w < y->w ? -1 : 1;
	return x->sym < y->sym ? -1 : x->sym > y->sym;
}

/*
 * Huffman's algorithm with two queues over the sorted leaves; if the
 * longest code exceeds FMT_HUF_MAXLEN the counts are halved (keeping
 * every present symbol at >= 1) and the tree rebuilt. With all weights
 * equal the depth is at most 8, so this terminates.
 */
int fmt_huf_lengths(const uint64_t cnt[256], uint8_t len[256])
{
	struct leaf lv[256];
	uint64_t wt[511];
	uint16_t parent[511];
	uint8_t depth[511];
	unsigned m = 0;

	memset(len, 0, 256);
	for (unsigned x = 0; x < 256; x++)
		if (cnt[x]) {
			lv[m].sym = x;
			m++;
		}
	if (m < 2)
		return -1;
	for (unsigned shift = 0; shift < 64; shift++) {
		unsigned a = 0, b = m, maxd = 0;

		for (unsigned i = 0; i < m; i++) {
			uint64_t w = cnt[lv[i].sym] >> shift;

			lv[i].w = w ? w : 1;
		}
		qsort(lv, m, sizeof(lv[0]), leaf_cmp);
		for (unsigned i = 0; i < m; i++)
			wt[i] = lv[i].w;
		for (unsigned k = m; k < 2 * m - 1; k++) {
			unsigned x[2];

			for (unsigned t = 0; t < 2; t++) {
				if (a < m && (b >= k || wt[a] <= wt[b]))
					x[t] = a++;
				else
					x[t] = b++;
			}
			wt[k] = wt[x[0]] + wt[x[1]];
			parent[x[0]] = parent[x[1]] = (uint16_t)k;
		}
		depth[2 * m - 2] = 0;
		for (unsigned k = 2 * m - 2; k-- > 0;)
			depth[k] = (uint8_t)(depth[parent[k]] + 1);
		for (unsigned i = 0; i < m; i++)
			if (depth[i] > maxd)
				maxd = depth[i];
		if (maxd <= FMT_HUF_MAXLEN) {
			for (unsigned i = 0; i < m; i++)
				len[lv[i].sym] = depth[i];
			return 0;
		}
	}
	return -1; /* not reached */
}

uint64_t fmt_huf_size(const uint32_t h[FMT_HUF_STREAMS][256],
		      const uint8_t len[256])
{
	uint64_t total = FMT_HUF_HDR;

	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		uint64_t bits = 0;

		for (unsigned x = 0; x < 256; x++)
			bits += (uint64_t)h[s][x] * len[x];
		total += (bits + 7) / 8;
	}
	return total;
}

/*
 * Canonical codes of DEFLATE, bit-reversed within their length (the
 * stream is filled from the least significant bit). Returns -1 unless the
 * lengths are <= FMT_HUF_MAXLEN and form a complete code.
 */
static int canon_codes(const uint8_t len[256], uint16_t code[256])
{
	unsigned count[FMT_HUF_MAXLEN + 1] = { 0 }, next[FMT_HUF_MAXLEN + 1];
	unsigned c = 0, kraft = 0;

	for (unsigned x = 0; x < 256; x++) {
		if (len[x] > FMT_HUF_MAXLEN)
			return -1;
		if (len[x]) {
			count[len[x]]++;
			kraft += TSIZE >> len[x];
		}
	}
	if (kraft != TSIZE)
		return -1;
	for (unsigned l = 1; l <= FMT_HUF_MAXLEN; l++) {
		c = (c + count[l - 1]) << 1;
		next[l] = c;
	}
	for (unsigned x = 0; x < 256; x++) {
		unsigned l = len[x], v, r = 0;

		code[x] = 0;
		if (!l)
			continue;
		v = next[l]++;
		for (unsigned k = 0; k < l; k++)
			r |= ((v >> k) & 1u) << (l - 1 - k);
		code[x] = (uint16_t)r;
	}
	return 0;
}

#define PUT(s, x)                                                      \
	do {                                                           \
		unsigned sym_ = (x);                                   \
		uint32_t e_ = ct[sym_];                                \
		b##s |= (uint64_t)(e_ & 0xffffu) << n##s;              \
		n##s += e_ >> 16;                                      \
	} while (0)

/* min(k, iterations of 6 bytes with an 8-byte store left before end) */
static inline size_t room(const uint8_t *end, const uint8_t *op, size_t k)
{
	size_t left = (size_t)(end - op), r;

	if (left < 8)
		return 0;
	r = (left - 8) / 6 + 1;
	return r < k ? r : k;
}

#define FLUSH(s)                                                       \
	do {                                                           \
		fmt_put_u64(op##s, b##s);                                     \
		op##s += n##s >> 3;                                    \
		b##s >>= n##s & ~7u;                                   \
		n##s &= 7u;                                            \
	} while (0)

/*
 * Symbols come from plane bytes (w = 1, fmt_huf_encode) or straight from
 * the elements (w = 2 or 4, fmt_huf_encode_elems): then the symbol of
 * element i is byte w-1 of the element rotated left by one bit, i.e. bits
 * [8w-9, 8w-1) of it. Stream sizes are not known in
 * advance (there is no histogram), so stream s is written into its own
 * quarter of dst past the header and the four are moved together at the
 * end. Pairs with a symbol that has no code look up ESC, which adds no
 * bits and is ORed into `miss`: the plane is refused after the loop.
 */
#define ESC (1u << 23)

static inline unsigned esym(const uint8_t *src, size_t i, unsigned w)
{
	if (w == 2)
		return (fmt_get_u16(src + 2 * i) >> 7) & 0xffu;
	return (fmt_get_u32(src + 4 * i) >> 23) & 0xffu;
}

/* Symbols of elements i and i + 1 as a pairs index: a | b << 8. */
static inline unsigned epair(const uint8_t *src, size_t i, unsigned w)
{
	uint64_t v;

	if (w == 1)
		return fmt_get_u16(src + i);
	if (w == 2) {
		uint32_t x = fmt_get_u32(src + 2 * i);

		return ((x >> 7) & 0xffu) | ((x >> 15) & 0xff00u);
	}
	v = fmt_get_u64(src + 4 * i);
	return (unsigned)(((v >> 23) & 0xffu) | ((v >> 47) & 0xff00u));
}

#define PUTE(s, q)                                                     \
	do {                                                           \
		uint32_t e_ = pairs[epair(src, (q), w)];               \
		miss |= e_;                                            \
		b##s |= (uint64_t)(e_ & 0x3fffffu) << n##s;            \
		n##s += e_ >> 24;                                      \
	} while (0)

/* One symbol of a stream's tail, bytes stored one at a time: 0, or -1 if
 * the stream has no room left. */
static inline int put1(unsigned x, const uint16_t code[256],
		       const uint8_t len[256], uint64_t *bits, unsigned *nb,
		       uint8_t **op, const uint8_t *end)
{
	*bits |= (uint64_t)code[x] << *nb;
	*nb += len[x];
	while (*nb >= 8) {
		if (*op >= end)
			return -1;
		*(*op)++ = (uint8_t)*bits;
		*bits >>= 8;
		*nb -= 8;
	}
	return 0;
}

/* pairs[a | b << 8]: the bits of a then b (<= 22) and their count << 24,
 * for the present symbols; ESC elsewhere if esc. */
static void fill_pairs(uint32_t *pairs, const uint16_t code[256],
		       const uint8_t len[256], int esc)
{
	uint8_t present[256];
	unsigned np = 0;

	for (unsigned x = 0; x < 256; x++)
		if (len[x])
			present[np++] = (uint8_t)x;
	if (esc)
		for (unsigned k = 0; k < FMT_HUF_PAIRS; k++)
			pairs[k] = ESC;
	for (unsigned a = 0; a < np; a++)
		for (unsigned b = 0; b < np; b++) {
			unsigned x = present[a], y = present[b];

			pairs[x | y << 8] = (code[x] | (uint32_t)code[y] << len[x]) |
					    (uint32_t)(len[x] + len[y]) << 24;
		}
}

/*
 * The paired loop of both coders: symbols q[s] + i, q[s] + i + 1, ... of
 * stream s, two per lookup, 4 per stream and flush (at most 7 + 44 bits
 * in each buffer), for as many groups of 4 as the shortest stream (m)
 * and the room left in every stream allow. An iteration stores 8 bytes
 * at op and advances op by at most 6 (51 bits): k iterations are safe
 * while op + 8 + 6 * (k - 1) <= end in every stream. Returns how far it
 * got; the entries looked up are ORed into *missp.
 */
static inline __attribute__((always_inline)) size_t
pair_loop(const uint8_t *src, const unsigned w, const size_t q[4], size_t m,
	  const uint32_t *pairs, uint8_t *op[4], uint8_t *const end[4],
	  uint64_t bits[4], unsigned nb[4], uint32_t *missp)
{
	const size_t q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
	uint8_t *op0 = op[0], *op1 = op[1], *op2 = op[2], *op3 = op[3];
	uint64_t b0 = bits[0], b1 = bits[1], b2 = bits[2], b3 = bits[3];
	unsigned n0 = nb[0], n1 = nb[1], n2 = nb[2], n3 = nb[3];
	uint32_t miss = 0;
	size_t i = 0;

	for (;;) {
		size_t k = (m - i) / 4, r;

		r = room(end[0], op0, k); r = room(end[1], op1, r);
		r = room(end[2], op2, r); r = room(end[3], op3, r);
		if (r == 0)
			break;
		for (size_t stop = i + 4 * r; i < stop; i += 4) {
			PUTE(0, q0 + i); PUTE(1, q1 + i);
			PUTE(2, q2 + i); PUTE(3, q3 + i);
			PUTE(0, q0 + i + 2); PUTE(1, q1 + i + 2);
			PUTE(2, q2 + i + 2); PUTE(3, q3 + i + 2);
			FLUSH(0); FLUSH(1); FLUSH(2); FLUSH(3);
		}
	}
	op[0] = op0; op[1] = op1; op[2] = op2; op[3] = op3;
	bits[0] = b0; bits[1] = b1; bits[2] = b2; bits[3] = b3;
	nb[0] = n0; nb[1] = n1; nb[2] = n2; nb[3] = n3;
	*missp = miss;
	return i;
}

size_t fmt_huf_encode(const uint8_t *p, size_t n,
		      const uint32_t h[FMT_HUF_STREAMS][256],
		      const uint8_t len[256], uint8_t *dst, size_t cap,
		      uint32_t *pairs)
{
	unsigned npresent = 0;
	uint16_t code[256];
	uint32_t ct[256];
	uint64_t total = FMT_HUF_HDR, size[FMT_HUF_STREAMS];
	uint8_t *op[FMT_HUF_STREAMS], *end[FMT_HUF_STREAMS];
	uint64_t bits[FMT_HUF_STREAMS];
	unsigned nb[FMT_HUF_STREAMS];
	size_t i = 0;

	if (canon_codes(len, code))
		return 0;
	for (unsigned x = 0; x < 256; x++) {
		ct[x] = code[x] | (uint32_t)len[x] << 16;
		npresent += len[x] != 0;
	}
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		uint64_t b = 0;

		for (unsigned x = 0; x < 256; x++) {
			if (h[s][x] && !len[x])
				return 0; /* a symbol without a code */
			b += (uint64_t)h[s][x] * len[x];
		}
		size[s] = (b + 7) / 8;
		total += size[s];
	}
	if (total > cap || size[0] > UINT32_MAX)
		return 0;
	for (unsigned x = 0; x < 256; x += 2)
		dst[x / 2] = (uint8_t)(len[x] | len[x + 1] << 4);
	op[0] = dst + FMT_HUF_HDR;
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		fmt_put_u32(dst + 128 + 4 * s, (uint32_t)size[s]);
		end[s] = op[s] + size[s];
		if (s + 1 < FMT_HUF_STREAMS)
			op[s + 1] = end[s];
		bits[s] = 0;
		nb[s] = 0;
	}
	if (pairs && (uint64_t)npresent * npresent <= n) {
		const size_t q[4] = { seg(n, 0), seg(n, 1), seg(n, 2),
				      seg(n, 3) };
		uint32_t miss;

		fill_pairs(pairs, code, len, 0);
		i = pair_loop(p, 1, q, seg(n, 4) - seg(n, 3), pairs, op, end,
			      bits, nb, &miss);
	} else {
		/* 4 symbols of <= 11 bits per stream and flush: at most
		 * 7 + 44 bits in each buffer. The last segment is the
		 * shortest. */
		const uint8_t *q0 = p + seg(n, 0), *q1 = p + seg(n, 1);
		const uint8_t *q2 = p + seg(n, 2), *q3 = p + seg(n, 3);
		size_t m = seg(n, 4) - seg(n, 3);
		uint8_t *op0 = op[0], *op1 = op[1], *op2 = op[2], *op3 = op[3];
		uint64_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;
		unsigned n0 = 0, n1 = 0, n2 = 0, n3 = 0;

		for (; i + 4 <= m; i += 4) {
			if ((size_t)(end[0] - op0) < 8 ||
			    (size_t)(end[1] - op1) < 8 ||
			    (size_t)(end[2] - op2) < 8 ||
			    (size_t)(end[3] - op3) < 8)
				break;
			PUT(0, q0[i]); PUT(1, q1[i]); PUT(2, q2[i]); PUT(3, q3[i]);
			PUT(0, q0[i + 1]); PUT(1, q1[i + 1]);
			PUT(2, q2[i + 1]); PUT(3, q3[i + 1]);
			PUT(0, q0[i + 2]); PUT(1, q1[i + 2]);
			PUT(2, q2[i + 2]); PUT(3, q3[i + 2]);
			PUT(0, q0[i + 3]); PUT(1, q1[i + 3]);
			PUT(2, q2[i + 3]); PUT(3, q3[i + 3]);
			FLUSH(0); FLUSH(1); FLUSH(2); FLUSH(3);
		}
		op[0] = op0; op[1] = op1; op[2] = op2; op[3] = op3;
		bits[0] = b0; bits[1] = b1; bits[2] = b2; bits[3] = b3;
		nb[0] = n0; nb[1] = n1; nb[2] = n2; nb[3] = n3;
	}
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		for (size_t k = seg(n, s) + i; k < seg(n, s + 1); k++)
			if (put1(p[k], code, len, &bits[s], &nb[s], &op[s],
				 end[s]))
				return 0;
	}
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		if (nb[s]) {
			if (op[s] >= end[s])
				return 0;
			*op[s]++ = (uint8_t)bits[s];
		}
		if (op[s] != end[s])
			return 0;
	}
	return (size_t)total;
}

static inline __attribute__((always_inline)) size_t
enc_elems(const uint8_t *src, size_t n, const unsigned w,
	  const uint8_t len[256], const uint16_t code[256], uint8_t *dst,
	  size_t cap, const uint32_t *pairs)
{
	size_t r = (cap - FMT_HUF_HDR) / FMT_HUF_STREAMS, i;
	const size_t q[4] = { seg(n, 0), seg(n, 1), seg(n, 2), seg(n, 3) };
	uint8_t *st[FMT_HUF_STREAMS], *op[FMT_HUF_STREAMS],
		*end[FMT_HUF_STREAMS], *at;
	uint64_t bits[FMT_HUF_STREAMS] = { 0 };
	unsigned nb[FMT_HUF_STREAMS] = { 0 };
	uint32_t miss;

	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		st[s] = op[s] = dst + FMT_HUF_HDR + s * r;
		end[s] = st[s] + r;
	}
	i = pair_loop(src, w, q, seg(n, 4) - seg(n, 3), pairs, op, end, bits,
		      nb, &miss);
	if (miss & ESC)
		return 0;
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		for (size_t k = seg(n, s) + i; k < seg(n, s + 1); k++) {
			unsigned x = esym(src, k, w);

			if (!len[x] || put1(x, code, len, &bits[s], &nb[s],
					    &op[s], end[s]))
				return 0;
		}
		if (nb[s]) {
			if (op[s] >= end[s])
				return 0;
			*op[s]++ = (uint8_t)bits[s];
		}
	}
	for (unsigned x = 0; x < 256; x += 2)
		dst[x / 2] = (uint8_t)(len[x] | len[x + 1] << 4);
	at = dst + FMT_HUF_HDR;
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		size_t sz = (size_t)(op[s] - st[s]);

		/* at <= st[s]: every earlier stream took at most r bytes */
		memmove(at, st[s], sz);
		at += sz;
		fmt_put_u32(dst + 128 + 4 * s, (uint32_t)sz);
	}
	return (size_t)(at - dst);
}

size_t fmt_huf_encode_elems(const uint8_t *src, size_t n, unsigned w,
			    const uint8_t len[256], uint8_t *dst, size_t cap,
			    uint32_t *pairs)
{
	uint16_t code[256];

	if ((w != 2 && w != 4) || !pairs || n < 4 ||
	    cap < FMT_HUF_HDR + 4 * 8 || cap - FMT_HUF_HDR > UINT32_MAX ||
	    canon_codes(len, code))
		return 0;
	fill_pairs(pairs, code, len, 1);
	if (w == 2)
		return enc_elems(src, n, 2, len, code, dst, cap, pairs);
	return enc_elems(src, n, 4, len, code, dst, cap, pairs);
}

static int bad(const char *what, char *err, size_t errlen, const char *fmt,
	       ...) __attribute__((format(printf, 4, 5)));

static int bad(const char *what, char *err, size_t errlen, const char *fmt,
	       ...)
{
	va_list ap;
	int k;

	if (err && errlen) {
		k = snprintf(err, errlen, "%s: huffman: ", what);
		if (k >= 0 && (size_t)k < errlen) {
			va_start(ap, fmt);
			vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
			va_end(ap);
		}
	}
	return CKPT_E_CORRUPT;
}

#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE32(e) __builtin_bswap32(e)
#else
#define LE32(e) (e)
#endif

/* One lookup: 1 to 3 symbols (e: s1 | s2 << 8 | s3 << 16 | count << 24
 * | bits << 26), stored as 4 bytes; the caller leaves room. */
#define GET(s)                                                         \
	do {                                                           \
		uint32_t e_ = D[v##s & TMASK];                         \
		uint32_t w_ = LE32(e_);                                \
		memcpy(op##s, &w_, 4);                                 \
		op##s += (e_ >> 24) & 3u;                              \
		v##s >>= e_ >> 26;                                     \
		c##s += e_ >> 26;                                      \
	} while (0)

#define STREAM5(s)                                                     \
	do {                                                           \
		uint64_t v##s = fmt_get_u64(ip##s) >> bo##s;                  \
		unsigned c##s = bo##s;                                 \
		GET(s); GET(s); GET(s); GET(s); GET(s);                \
		ip##s += c##s >> 3;                                    \
		bo##s = c##s & 7u;                                     \
	} while (0)

int fmt_huf_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n,
		   const char *what, char *err, size_t errlen)
{
	uint8_t L[256];
	uint16_t code[256];
	uint16_t T[TSIZE];
	uint32_t D[TSIZE];
	uint64_t sum = 0;
	size_t sz[FMT_HUF_STREAMS], pos[FMT_HUF_STREAMS] = { 0 };
	unsigned bo[FMT_HUF_STREAMS] = { 0 };
	const uint8_t *base[FMT_HUF_STREAMS];
	size_t done[FMT_HUF_STREAMS];

	if (len < FMT_HUF_HDR)
		return bad(what, err, errlen, "%zu bytes, header needs %u",
			   len, FMT_HUF_HDR);
	for (unsigned x = 0; x < 256; x++) {
		L[x] = (uint8_t)((src[x / 2] >> (4 * (x & 1))) & 15u);
		if (L[x] > FMT_HUF_MAXLEN)
			return bad(what, err, errlen,
				   "symbol %u: code length %u", x, L[x]);
	}
	if (canon_codes(L, code))
		return bad(what, err, errlen,
			   "code lengths do not form a complete code");
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		sz[s] = fmt_get_u32(src + 128 + 4 * s);
		base[s] = src + FMT_HUF_HDR + sum;
		sum += sz[s];
	}
	if (sum != len - FMT_HUF_HDR)
		return bad(what, err, errlen,
			   "streams take %llu bytes, payload has %zu",
			   (unsigned long long)sum, len - FMT_HUF_HDR);
	for (unsigned x = 0; x < 256; x++) {
		unsigned l = L[x];

		if (!l)
			continue;
		for (unsigned k = code[x]; k < TSIZE; k += 1u << l)
			T[k] = (uint16_t)(x << 4 | l);
	}
	/* up to 3 symbols per entry, as many as fit in TBITS bits */
	for (unsigned k = 0; k < TSIZE; k++) {
		uint32_t syms = 0;
		unsigned cnt = 0, used = 0;

		while (cnt < 3) {
			unsigned e = T[k >> used], l = e & 15u;

			if (used + l > TBITS)
				break;
			syms |= (uint32_t)(e >> 4) << (8 * cnt);
			cnt++;
			used += l;
		}
		D[k] = syms | (uint32_t)cnt << 24 | (uint32_t)used << 26;
	}
	{
		/* Fast loop: 5 lookups (<= 55 bits, <= 15 symbols, stores
		 * up to 16 bytes) per stream per 8-byte load, while 8
		 * input bytes and 16 output bytes remain in every
		 * stream. */
		uint8_t *op0 = dst + seg(n, 0), *op1 = dst + seg(n, 1);
		uint8_t *op2 = dst + seg(n, 2), *op3 = dst + seg(n, 3);
		const uint8_t *ip0 = base[0], *ip1 = base[1];
		const uint8_t *ip2 = base[2], *ip3 = base[3];
		unsigned bo0 = 0, bo1 = 0, bo2 = 0, bo3 = 0;

		if (sz[0] >= 8 && sz[1] >= 8 && sz[2] >= 8 && sz[3] >= 8 &&
		    seg(n, 4) - seg(n, 3) >= 16) {
			const uint8_t *il0 = base[0] + sz[0] - 8;
			const uint8_t *il1 = base[1] + sz[1] - 8;
			const uint8_t *il2 = base[2] + sz[2] - 8;
			const uint8_t *il3 = base[3] + sz[3] - 8;
			const uint8_t *ol0 = dst + seg(n, 1) - 16;
			const uint8_t *ol1 = dst + seg(n, 2) - 16;
			const uint8_t *ol2 = dst + seg(n, 3) - 16;
			const uint8_t *ol3 = dst + seg(n, 4) - 16;

			while (ip0 <= il0 && ip1 <= il1 && ip2 <= il2 &&
			       ip3 <= il3 && op0 <= ol0 && op1 <= ol1 &&
			       op2 <= ol2 && op3 <= ol3) {
				STREAM5(0);
				STREAM5(1);
				STREAM5(2);
				STREAM5(3);
			}
		}
		done[0] = (size_t)(op0 - dst);
		done[1] = (size_t)(op1 - dst);
		done[2] = (size_t)(op2 - dst);
		done[3] = (size_t)(op3 - dst);
		pos[0] = (size_t)(ip0 - base[0]);
		pos[1] = (size_t)(ip1 - base[1]);
		pos[2] = (size_t)(ip2 - base[2]);
		pos[3] = (size_t)(ip3 - base[3]);
		bo[0] = bo0; bo[1] = bo1; bo[2] = bo2; bo[3] = bo3;
	}
	for (unsigned s = 0; s < FMT_HUF_STREAMS; s++) {
		uint64_t bits;

		for (size_t i = done[s]; i < seg(n, s + 1); i++) {
			unsigned e, c;
			uint64_t v;

			if (pos[s] > sz[s])
				return bad(what, err, errlen,
					   "stream %u overrun (%zu bytes)", s,
					   sz[s]);
			v = ld64_tail(base[s], sz[s], pos[s]) >> bo[s];
			e = T[v & TMASK];
			dst[i] = (uint8_t)(e >> 4);
			c = bo[s] + (e & 15u);
			pos[s] += c >> 3;
			bo[s] = c & 7u;
		}
		bits = (uint64_t)pos[s] * 8 + bo[s];
		if ((bits + 7) / 8 != sz[s])
			return bad(what, err, errlen,
				   "stream %u: %zu bytes, its symbols use %llu "
				   "bits", s, sz[s], (unsigned long long)bits);
		if (bo[s] && (base[s][pos[s]] >> bo[s]) != 0)
			return bad(what, err, errlen,
				   "stream %u: nonzero padding bits", s);
	}
	return 0;
}
