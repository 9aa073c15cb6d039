/*
 * fmt_huf.h - static Huffman coding of one byte plane (plane mode 2 of the
 * float codec, SPEC.md section 5.3). Internal to format/; declared here so
 * that the tests can drive the coder directly.
 */
#ifndef CKPT_FMT_HUF_H
#define CKPT_FMT_HUF_H

#include <stddef.h>
#include <stdint.h>

#define FMT_HUF_MAXLEN 11
#define FMT_HUF_STREAMS 4
#define FMT_HUF_HDR (128u + 4u * FMT_HUF_STREAMS) /* lengths + sizes */

/* Byte histograms of p[0..n), one per stream (segment, see fmt_huf.c). */
void fmt_huf_hist(const uint8_t *p, size_t n,
		  uint32_t h[FMT_HUF_STREAMS][256]);

/*
 * Code lengths (1..FMT_HUF_MAXLEN, 0 for absent symbols) of a complete
 * prefix code for the counts cnt[0..256). Returns 0, or -1 if fewer than
 * two symbols occur (no Huffman code then).
 */
int fmt_huf_lengths(const uint64_t cnt[256], uint8_t len[256]);

/*
 * Encoded size (header included) of p[0..n) with histograms h and code
 * lengths len (from fmt_huf_lengths over the summed histograms).
 */
uint64_t fmt_huf_size(const uint32_t h[FMT_HUF_STREAMS][256],
		      const uint8_t len[256]);

/*
 * Encodes p[0..n) into dst[0..cap). h and len as above. Returns the size
 * written (fmt_huf_size(h, len)), or 0 if that exceeds cap or h and len do
 * not match. pairs, if not NULL, is FMT_HUF_PAIRS scratch entries that
 * let large planes be coded two symbols per lookup.
 */
#define FMT_HUF_PAIRS 65536u
size_t fmt_huf_encode(const uint8_t *p, size_t n,
		      const uint32_t h[FMT_HUF_STREAMS][256],
		      const uint8_t len[256], uint8_t *dst, size_t cap,
		      uint32_t *pairs);

/*
 * Encodes the exponent plane of the n elements of width w (2 or 4) at src
 * (byte w-1 of each element rotated left by one bit, the plane the float
 * codec splits off first) straight from the elements, into dst[0..cap),
 * with code lengths len (a complete code that need not give every symbol
 * a length). Returns the size written, or 0 if a symbol of the plane has
 * no code, the code is not complete, or the result (each stream in a
 * quarter of cap) does not fit. pairs is FMT_HUF_PAIRS scratch entries.
 */
size_t fmt_huf_encode_elems(const uint8_t *src, size_t n, unsigned w,
			    const uint8_t len[256], uint8_t *dst, size_t cap,
			    uint32_t *pairs);

/*
 * Decodes a mode-2 plane of exactly n bytes from src[0..len) into
 * dst[0..n). Validates everything; returns 0 or CKPT_E_CORRUPT with a
 * message prefixed by `what`.
 */
int fmt_huf_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n,
		   const char *what, char *err, size_t errlen);

#endif
