/*
 * fuzz_headers - libFuzzer target for the binary headers:
 * fmt_shard_hdr_decode and fmt_chunk_hdr_decode.
 *
 * Byte 0 holds flags, the rest is the header:
 *   bit 0  recompute the header checksum (bytes 56..63, XXH3 of 0..55) of
 *          a copy before decoding, so that mutations get past it
 *   bit 1  zero-pad the copy to the 4096 bytes of a shard header
 * A header that decodes must re-encode to exactly the bytes it came from
 * (the decoders check every byte: magic, reserved fields, padding,
 * checksum); abort() otherwise.
 */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned flags;
	uint8_t *buf, re[FMT_SHARD_HDR_SIZE];
	size_t n;
	char err[256];
	fmt_shard_hdr sh;
	fmt_chunk_hdr ch;

	if (size < 1)
		return 0;
	flags = data[0];
	data++;
	size--;
	n = size;
	if ((flags & 2) && n < FMT_SHARD_HDR_SIZE)
		n = FMT_SHARD_HDR_SIZE;
	/* exactly n bytes on the heap: ASan sees any read past the end */
	buf = malloc(n ? n : 1);
	if (!buf)
		return 0;
	memset(buf, 0, n);
	memcpy(buf, data, size);
	if ((flags & 1) && n >= 64)
		fmt_put_hash(buf + 56, fmt_xxh3(buf, 56));

	if (fmt_chunk_hdr_decode(buf, n, &ch, err, sizeof(err)) == 0) {
		fmt_chunk_hdr back;

		CHECK(n >= FMT_CHUNK_HDR_SIZE);
		fmt_chunk_hdr_encode(&ch, re);
		CHECK(memcmp(re, buf, FMT_CHUNK_HDR_SIZE) == 0);
		CHECK(fmt_chunk_hdr_decode(re, FMT_CHUNK_HDR_SIZE, &back, err,
					   sizeof(err)) == 0);
		CHECK(back.codec == ch.codec &&
		      back.elem_width == ch.elem_width &&
		      back.raw_len == ch.raw_len &&
		      back.stored_len == ch.stored_len &&
		      back.stream_offset == ch.stream_offset &&
		      back.raw_xxh3 == ch.raw_xxh3);
	}
	if (fmt_shard_hdr_decode(buf, n, &sh, err, sizeof(err)) == 0) {
		fmt_shard_hdr back;

		CHECK(n >= FMT_SHARD_HDR_SIZE);
		fmt_shard_hdr_encode(&sh, re);
		CHECK(memcmp(re, buf, FMT_SHARD_HDR_SIZE) == 0);
		CHECK(fmt_shard_hdr_decode(re, FMT_SHARD_HDR_SIZE, &back, err,
					   sizeof(err)) == 0);
		CHECK(back.step == sh.step &&
		      memcmp(back.save_id, sh.save_id, 16) == 0 &&
		      back.host_index == sh.host_index &&
		      back.host_count == sh.host_count &&
		      back.file_index == sh.file_index);
	}
	free(buf);
	return 0;
}
