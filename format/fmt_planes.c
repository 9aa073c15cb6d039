/*
 * fmt_planes.c - the float codec's byte-plane transforms (SPEC.md 5.3):
 * each little-endian element of w = 2, 4 or 8 bytes rotated left by one
 * bit (the sign to bit 0) and split into w byte planes, most significant
 * byte first, and back. They are the codec's hot loops (they run over
 * every byte written and read): w = 2 and w = 4 have SSE2 versions on
 * x86-64, with portable scalar loops elsewhere and for the tails. No I/O,
 * no allocation.
 */
#include <stddef.h>
#include <stdint.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fmt.h"
#include "fmt_planes.h"

/* planes[j] receives byte (w-1-j) of each rotated element; n elements.
 * split2 and split4 skip plane 0 if its pointer is NULL. */
static void split2(const uint8_t *src, size_t n, uint8_t *p0, uint8_t *p1)
{
	size_t i = 0;

#if defined(__SSE2__)
	const __m128i lo = _mm_set1_epi16(0x00ff);

	for (; i + 16 <= n; i += 16) {
		__m128i a = _mm_loadu_si128((const __m128i *)(src + 2 * i));
		__m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));

		a = _mm_or_si128(_mm_slli_epi16(a, 1), _mm_srli_epi16(a, 15));
		b = _mm_or_si128(_mm_slli_epi16(b, 1), _mm_srli_epi16(b, 15));
		if (p0)
			_mm_storeu_si128((__m128i *)(p0 + i),
					 _mm_packus_epi16(_mm_srli_epi16(a, 8),
							  _mm_srli_epi16(b, 8)));
		_mm_storeu_si128((__m128i *)(p1 + i),
				 _mm_packus_epi16(_mm_and_si128(a, lo),
						  _mm_and_si128(b, lo)));
	}
#endif
	for (; i < n; i++) {
		uint16_t x = fmt_get_u16(src + 2 * i);

		x = (uint16_t)((x << 1) | (x >> 15));
		if (p0)
			p0[i] = (uint8_t)(x >> 8);
		p1[i] = (uint8_t)x;
	}
}

static void join2(const uint8_t *p0, const uint8_t *p1, size_t n,
		  uint8_t *dst)
{
	size_t i = 0;

#if defined(__SSE2__)
	for (; i + 16 <= n; i += 16) {
		__m128i h = _mm_loadu_si128((const __m128i *)(p0 + i));
		__m128i l = _mm_loadu_si128((const __m128i *)(p1 + i));
		__m128i a = _mm_unpacklo_epi8(l, h);
		__m128i b = _mm_unpackhi_epi8(l, h);

		a = _mm_or_si128(_mm_srli_epi16(a, 1), _mm_slli_epi16(a, 15));
		b = _mm_or_si128(_mm_srli_epi16(b, 1), _mm_slli_epi16(b, 15));
		_mm_storeu_si128((__m128i *)(dst + 2 * i), a);
		_mm_storeu_si128((__m128i *)(dst + 2 * i + 16), b);
	}
#endif
	for (; i < n; i++) {
		uint16_t x = (uint16_t)((p0[i] << 8) | p1[i]);

		fmt_put_u16(dst + 2 * i, (uint16_t)((x >> 1) | (x << 15)));
	}
}

#if defined(__SSE2__)
static inline __m128i rotl32_1(__m128i v)
{
	return _mm_or_si128(_mm_slli_epi32(v, 1), _mm_srli_epi32(v, 31));
}

/* Byte k (0 = least significant) of 16 u32 lanes in a..d, as 16 bytes. */
static inline __m128i byte_of(__m128i a, __m128i b, __m128i c, __m128i d,
			      int k)
{
	const __m128i m = _mm_set1_epi32(0xff);
	__m128i x, y;

	switch (k) {
	case 0:
		break;
	case 1:
		a = _mm_srli_epi32(a, 8); b = _mm_srli_epi32(b, 8);
		c = _mm_srli_epi32(c, 8); d = _mm_srli_epi32(d, 8);
		break;
	case 2:
		a = _mm_srli_epi32(a, 16); b = _mm_srli_epi32(b, 16);
		c = _mm_srli_epi32(c, 16); d = _mm_srli_epi32(d, 16);
		break;
	default:
		a = _mm_srli_epi32(a, 24); b = _mm_srli_epi32(b, 24);
		c = _mm_srli_epi32(c, 24); d = _mm_srli_epi32(d, 24);
		break;
	}
	if (k != 3) {
		a = _mm_and_si128(a, m); b = _mm_and_si128(b, m);
		c = _mm_and_si128(c, m); d = _mm_and_si128(d, m);
	}
	x = _mm_packs_epi32(a, b); /* values <= 255: no saturation */
	y = _mm_packs_epi32(c, d);
	return _mm_packus_epi16(x, y);
}
#endif

static void split4(const uint8_t *src, size_t n, uint8_t *const p[4])
{
	size_t i = 0;

#if defined(__SSE2__)
	for (; i + 16 <= n; i += 16) {
		const uint8_t *s = src + 4 * i;
		__m128i a = rotl32_1(_mm_loadu_si128((const __m128i *)s));
		__m128i b = rotl32_1(_mm_loadu_si128((const __m128i *)(s + 16)));
		__m128i c = rotl32_1(_mm_loadu_si128((const __m128i *)(s + 32)));
		__m128i d = rotl32_1(_mm_loadu_si128((const __m128i *)(s + 48)));

		if (p[0])
			_mm_storeu_si128((__m128i *)(p[0] + i),
					 byte_of(a, b, c, d, 3));
		_mm_storeu_si128((__m128i *)(p[1] + i), byte_of(a, b, c, d, 2));
		_mm_storeu_si128((__m128i *)(p[2] + i), byte_of(a, b, c, d, 1));
		_mm_storeu_si128((__m128i *)(p[3] + i), byte_of(a, b, c, d, 0));
	}
#endif
	for (; i < n; i++) {
		uint32_t x = fmt_get_u32(src + 4 * i);

		x = (x << 1) | (x >> 31);
		if (p[0])
			p[0][i] = (uint8_t)(x >> 24);
		p[1][i] = (uint8_t)(x >> 16);
		p[2][i] = (uint8_t)(x >> 8);
		p[3][i] = (uint8_t)x;
	}
}

static void join4(const uint8_t *const p[4], size_t n, uint8_t *dst)
{
	size_t i = 0;

#if defined(__SSE2__)
	for (; i + 16 <= n; i += 16) {
		__m128i b3 = _mm_loadu_si128((const __m128i *)(p[0] + i));
		__m128i b2 = _mm_loadu_si128((const __m128i *)(p[1] + i));
		__m128i b1 = _mm_loadu_si128((const __m128i *)(p[2] + i));
		__m128i b0 = _mm_loadu_si128((const __m128i *)(p[3] + i));
		__m128i l0 = _mm_unpacklo_epi8(b0, b1), l1 = _mm_unpackhi_epi8(b0, b1);
		__m128i h0 = _mm_unpacklo_epi8(b2, b3), h1 = _mm_unpackhi_epi8(b2, b3);
		__m128i v[4];

		v[0] = _mm_unpacklo_epi16(l0, h0);
		v[1] = _mm_unpackhi_epi16(l0, h0);
		v[2] = _mm_unpacklo_epi16(l1, h1);
		v[3] = _mm_unpackhi_epi16(l1, h1);
		for (int k = 0; k < 4; k++) {
			__m128i x = _mm_or_si128(_mm_srli_epi32(v[k], 1),
						 _mm_slli_epi32(v[k], 31));

			_mm_storeu_si128((__m128i *)(dst + 4 * i + 16 * k), x);
		}
	}
#endif
	for (; i < n; i++) {
		uint32_t x = ((uint32_t)p[0][i] << 24) | ((uint32_t)p[1][i] << 16) |
			     ((uint32_t)p[2][i] << 8) | p[3][i];

		fmt_put_u32(dst + 4 * i, (x >> 1) | (x << 31));
	}
}

static void split8(const uint8_t *src, size_t n, uint8_t *const p[8])
{
	for (size_t i = 0; i < n; i++) {
		uint64_t x = fmt_get_u64(src + 8 * i);

		x = (x << 1) | (x >> 63);
		p[0][i] = (uint8_t)(x >> 56);
		p[1][i] = (uint8_t)(x >> 48);
		p[2][i] = (uint8_t)(x >> 40);
		p[3][i] = (uint8_t)(x >> 32);
		p[4][i] = (uint8_t)(x >> 24);
		p[5][i] = (uint8_t)(x >> 16);
		p[6][i] = (uint8_t)(x >> 8);
		p[7][i] = (uint8_t)x;
	}
}

static void join8(const uint8_t *const p[8], size_t n, uint8_t *dst)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t x = 0;

		for (int j = 0; j < 8; j++)
			x = (x << 8) | p[j][i];
		fmt_put_u64(dst + 8 * i, (x >> 1) | (x << 63));
	}
}

void fmt_planes_split(const uint8_t *src, size_t n, unsigned w,
		      uint8_t *const p[8])
{
	if (w == 2)
		split2(src, n, p[0], p[1]);
	else if (w == 4)
		split4(src, n, p);
	else
		split8(src, n, p);
}

void fmt_planes_join(const uint8_t *const p[8], size_t n, unsigned w,
		     uint8_t *dst)
{
	if (w == 2)
		join2(p[0], p[1], n, dst);
	else if (w == 4)
		join4(p, n, dst);
	else
		join8(p, n, dst);
}
