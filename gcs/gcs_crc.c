/* gcs_crc.c - CRC32C for Cloud Storage: ISA-L for the bytes, GF(2)
 * arithmetic to combine the crcs of pieces, base64 for x-goog-hash.
 *
 * ISA-L's crc32_iscsi works on the raw register (no pre/post inversion),
 * so gcs_crc32c() inverts on the way in and out: the running value is the
 * finished crc of the bytes so far and can be fed back in. Combining uses
 * crc(A||B) = crc(A) * x^(8*len(B)) mod P  xor  crc(B), in the reflected
 * bit order the crc uses, with x^(2^k) taken from a small table.
 */
#include "gcs.h"

#include <isa-l/crc.h>
#include <limits.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u /* Castagnoli, reflected */

uint32_t gcs_crc32c(uint32_t crc, const void *p, size_t n)
{
	const unsigned char *b = p;
	uint32_t r = ~crc;

	while (n > 0) {
		/* ISA-L takes an int length */
		int step = n > (size_t)INT_MAX / 2 ? INT_MAX / 2 : (int)n;

		r = crc32_iscsi((unsigned char *)b, step, r);
		b += step;
		n -= (size_t)step;
	}
	return ~r;
}

/* a * b modulo P, both reflected (bit 31 is x^0). */
static uint32_t mulmod(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, prod = 0;

	while (m) {
		if (a & m) {
			prod ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return prod;
}

/* x^(8 * nbytes) mod P */
static uint32_t xpow8n(uint64_t nbytes)
{
	uint32_t sq = 1u << 30; /* x^1 */
	uint32_t r = 1u << 31;  /* x^0 */
	unsigned k;

	/* x^(2^k) for k = 0, 1, 2: reach x^8 = x^(2^3) first */
	for (k = 0; k < 3; k++)
		sq = mulmod(sq, sq);
	while (nbytes) {
		if (nbytes & 1)
			r = mulmod(sq, r);
		nbytes >>= 1;
		sq = mulmod(sq, sq);
	}
	return r;
}

uint32_t gcs_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	return mulmod(xpow8n(len_b), crc_a) ^ crc_b;
}

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void gcs_crc32c_b64(uint32_t crc, char out[9])
{
	unsigned char be[4] = { crc >> 24, crc >> 16, crc >> 8, crc };
	uint32_t v = (uint32_t)be[0] << 16 | (uint32_t)be[1] << 8 | be[2];

	out[0] = b64[v >> 18 & 63];
	out[1] = b64[v >> 12 & 63];
	out[2] = b64[v >> 6 & 63];
	out[3] = b64[v & 63];
	v = (uint32_t)be[3] << 16;
	out[4] = b64[v >> 18 & 63];
	out[5] = b64[v >> 12 & 63];
	out[6] = '=';
	out[7] = '=';
	out[8] = 0;
}

int gcs_crc32c_from_b64(const char *s, size_t n, uint32_t *crc)
{
	uint64_t acc = 0;
	size_t i;

	/* 4 bytes -> 6 significant chars + "==" */
	if (n != 8 || s[6] != '=' || s[7] != '=')
		return -1;
	for (i = 0; i < 6; i++) {
		const char *q = memchr(b64, s[i], 64);

		if (!q || !s[i])
			return -1;
		acc = acc << 6 | (uint64_t)(q - b64);
	}
	/* 36 bits read, the low 4 must be zero padding */
	if (acc & 15)
		return -1;
	*crc = (uint32_t)(acc >> 4);
	return 0;
}
