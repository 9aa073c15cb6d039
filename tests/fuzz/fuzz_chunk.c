/*
 * fuzz_chunk - libFuzzer target for the chunk codecs.
 *
 * Byte 0 selects what is done with the rest of the input:
 *   bit 7     0: decode mode, 1: round-trip mode
 *   bits 0-1  codec (3 is an unknown codec, for decode mode)
 *   bits 2-3  element width 1, 2, 4 or 8
 *   bit 6     decode mode: raw_len is in units of 16 bytes
 *   bits 4-5  round-trip mode: zstd level 1..4
 *   bit 6     round-trip mode: weights mode
 * Decode mode: bytes 1-2 are a little-endian u16 L; raw_len = L + 1 (or
 * (L + 1) * 16 with bit 6, up to 1 MiB); bytes 3.. are the payload, decoded
 * into an exactly raw_len-byte heap buffer (ASan catches any write past
 * it). Must never crash; a successful codec-none decode must be a copy.
 * Round-trip mode: bytes 1.. are raw data, encoded with every codec,
 * decoded again; abort() on any failure or mismatch.
 * Weights mode (the float codec's fast path, which needs large chunks of
 * trained-weight-like elements): 1 MiB of elements of width 2 or 4
 * (width 1 and 8 are taken as 2 and 4) drawn near N(0, 0.02) from a
 * fixed seed, then patched by the input, 6 bytes a patch: a u32 element
 * index (modulo the count) and the u16 that becomes the element's top
 * 16 bits (the sign, the exponent, the top of the mantissa); round-trip
 * as above.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"

#define CHECK(cond)                                                        \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, \
				#cond);                                    \
			abort();                                           \
		}                                                          \
	} while (0)

static fmt_codec_ctx *ctx;

static void decode_mode(unsigned sel, const uint8_t *p, size_t n)
{
	int codec = sel & 3, width = 1 << ((sel >> 2) & 3);
	size_t raw_len;
	uint8_t *raw;
	char err[256];
	int rc;

	if (n < 2)
		return;
	raw_len = (size_t)(p[0] | p[1] << 8) + 1;
	if (sel & 0x40)
		raw_len *= 16;
	p += 2;
	n -= 2;
	raw = malloc(raw_len);
	if (!raw)
		return;
	/* An empty payload is passed as a valid pointer of length 0. */
	rc = fmt_chunk_decode(ctx, codec, width, n ? p : (const uint8_t *)"",
			      n, raw, raw_len, err, sizeof(err));
	if (rc == 0) {
		CHECK(codec != 3);
		if (codec == CKPT_CODEC_NONE)
			CHECK(n == raw_len && memcmp(raw, p, n) == 0);
	}
	free(raw);
}

static void roundtrip_mode(unsigned sel, const uint8_t *raw, size_t n)
{
	int width = 1 << ((sel >> 2) & 3), level = 1 + ((sel >> 4) & 3);
	size_t cap, stored;
	uint8_t *out, *back;
	char err[256];

	if (n < 1 || n > FMT_MAX_CHUNK)
		return;
	cap = fmt_codec_bound(n);
	out = malloc(cap);
	back = malloc(n);
	if (!out || !back)
		goto done;
	for (int codec = 0; codec < CKPT_CODEC_COUNT; codec++) {
		int used = -1, rc;

		rc = fmt_chunk_encode(ctx, codec, level, width, raw, n, out,
				      cap, &used, &stored);
		if (rc == -ENOMEM)
			continue;
		CHECK(rc == 0);
		CHECK(used >= 0 && used < CKPT_CODEC_COUNT);
		CHECK(stored >= 1 && stored <= n);
		CHECK(used != CKPT_CODEC_NONE || stored == n);
		memset(back, 0xa5, n);
		rc = fmt_chunk_decode(ctx, used, width, out, stored, back, n,
				      err, sizeof(err));
		if (rc)
			fprintf(stderr, "codec %d (used %d) width %d level %d "
				"raw %zu stored %zu: %s\n", codec, used,
				width, level, n, stored, err);
		CHECK(rc == 0);
		CHECK(memcmp(back, raw, n) == 0);
	}
done:
	free(out);
	free(back);
}

#define WEIGHTS_LEN (1u << 20)

/* WEIGHTS_LEN bytes of elements of width w near N(0, 0.02), the same
 * for every input: drawn once per width. */
static const uint8_t *weights_base(unsigned w)
{
	static uint8_t *base[2];
	uint8_t **b = &base[w == 4];
	uint64_t x = 0x9e3779b97f4a7c15ull;

	if (*b)
		return *b;
	if (!(*b = malloc(WEIGHTS_LEN)))
		abort();
	for (size_t i = 0; i < WEIGHTS_LEN / w; i++) {
		double g = 0;
		float f;
		uint32_t v;

		for (int k = 0; k < 4; k++) { /* a centred sum of uniforms */
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			g += (double)(x >> 11) / 9007199254740992.0 - 0.5;
		}
		f = (float)(g * 0.02 * 1.7320508);
		memcpy(&v, &f, 4);
		if (w == 2) {
			(*b)[2 * i] = (uint8_t)(v >> 16);
			(*b)[2 * i + 1] = (uint8_t)(v >> 24);
		} else {
			memcpy(*b + 4 * i, &v, 4);
		}
	}
	return *b;
}

static void weights_mode(unsigned sel, const uint8_t *p, size_t n)
{
	unsigned w = (sel >> 2) & 2 ? 4 : 2; /* widths 1, 2, 4, 8: 2, 2, 4, 4 */
	const size_t cnt = WEIGHTS_LEN / w;
	static uint8_t *raw;

	if (!raw && !(raw = malloc(WEIGHTS_LEN)))
		abort();
	memcpy(raw, weights_base(w), WEIGHTS_LEN);
	for (; n >= 6; p += 6, n -= 6) {
		size_t i = (p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 |
			    (size_t)p[3] << 24) % cnt;

		raw[w * i + w - 2] = p[4];
		raw[w * i + w - 1] = p[5];
	}
	roundtrip_mode((sel & ~0x4cu) | (w == 2 ? 1u : 2u) << 2, raw,
		       WEIGHTS_LEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ctx && !(ctx = fmt_codec_ctx_new()))
		abort();
	if (size < 1)
		return 0;
	if ((data[0] & 0xc0) == 0xc0)
		weights_mode(data[0], data + 1, size - 1);
	else if (data[0] & 0x80)
		roundtrip_mode(data[0], data + 1, size - 1);
	else
		decode_mode(data[0], data + 1, size - 1);
	return 0;
}
