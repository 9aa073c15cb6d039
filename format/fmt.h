/*
 * fmt.h - format v1 of ckpt: byte layouts, codecs, metadata documents.
 *
 * This module knows nothing of the engine: it turns structs into bytes and
 * bytes into validated structs, and encodes/decodes chunks. It does no file
 * I/O. SPEC.md is the normative description; this header mirrors it.
 *
 * Errors: 0, -ENOMEM, -EINVAL, or the CKPT_E_* codes of ckpt.h
 * (CKPT_E_CORRUPT, CKPT_E_VERSION, CKPT_E_CODEC, CKPT_E_MISMATCH). Functions
 * that validate input take `char *err, size_t errlen` and write there a
 * message naming what is wrong and where (field, byte offset, tensor).
 */
#ifndef CKPT_FMT_H
#define CKPT_FMT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckpt.h"

#define FMT_VERSION 1       /* what a step without references is written as */
#define FMT_VERSION_DEDUP 2 /* a deduplicating save (SPEC.md section 16) */
#define FMT_VERSION_MAX 2   /* newest version read */
#define FMT_H128_SEED 0x636b70745f646470ull /* "ckpt_ddp": XXH3-128 seed */
#define FMT_MAX_REFS FMT_MAX_FILES_PER_HOST /* refs per index */
#define FMT_ALIGN 4096u              /* file offsets of chunks, headers */
#define FMT_STREAM_ALIGN 64u         /* tensors start at multiples of this in
                                        a host's data stream */
#define FMT_SHARD_HDR_SIZE 4096u     /* shard file header, padded */
#define FMT_CHUNK_HDR_SIZE 64u       /* chunk header, before the payload */
#define FMT_META_HDR_SIZE 64u        /* header of index and commit files */
#define FMT_MIN_CHUNK (64u * 1024u)
#define FMT_MAX_CHUNK (64u * 1024u * 1024u)
#define FMT_MAX_FILES_PER_HOST 1024u
#define FMT_MAX_HOSTS 65536u
#define FMT_MAX_META_BYTES (1ull << 30) /* index / commit documents */

/* ---- little-endian helpers and canonical hashes ---- */
/* Inline: the codecs' hot loops use them too. */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FMT_LE16(v) __builtin_bswap16(v)
#define FMT_LE32(v) __builtin_bswap32(v)
#define FMT_LE64(v) __builtin_bswap64(v)
#else
#define FMT_LE16(v) (v)
#define FMT_LE32(v) (v)
#define FMT_LE64(v) (v)
#endif
static inline void fmt_put_u16(uint8_t *p, uint16_t v)
{
	v = FMT_LE16(v);
	memcpy(p, &v, 2);
}
static inline void fmt_put_u32(uint8_t *p, uint32_t v)
{
	v = FMT_LE32(v);
	memcpy(p, &v, 4);
}
static inline void fmt_put_u64(uint8_t *p, uint64_t v)
{
	v = FMT_LE64(v);
	memcpy(p, &v, 8);
}
static inline uint16_t fmt_get_u16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return FMT_LE16(v);
}
static inline uint32_t fmt_get_u32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return FMT_LE32(v);
}
static inline uint64_t fmt_get_u64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return FMT_LE64(v);
}
/* XXH3-64 stored in xxHash's canonical (big-endian) byte order. */
void fmt_put_hash(uint8_t *p, uint64_t h);
uint64_t fmt_get_hash(const uint8_t *p);
uint64_t fmt_xxh3(const void *p, size_t n);
/* 16 lower-case hex digits <-> u64; parse returns -1 if malformed. */
void fmt_hash_hex(uint64_t h, char out[17]);
int fmt_hash_parse(const char *s, uint64_t *out);
/* 32 hex digits (high half first) <-> out[0] high, out[1] low; -1 if
 * malformed. fmt_xxh128: XXH3-128 seeded with FMT_H128_SEED. */
int fmt_hash128_parse(const char *s, uint64_t out[2]);
void fmt_xxh128(const void *p, size_t n, uint64_t out[2]);
/* fmt_xxh3 and fmt_xxh128 of the same bytes, read once (no allocation). */
uint64_t fmt_xxh3_pair(const void *p, size_t n, uint64_t h128[2]);

static inline uint64_t fmt_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* ---- names inside a checkpoint root ---- */
/* "step-%020llu"; parse returns 0 and sets *step, or -1 if `name` is not
 * exactly such a name. */
void fmt_step_dirname(uint64_t step, char out[32]);
int fmt_step_parse(const char *name, uint64_t *step);
/* Shard file "h%05u-f%03u.shard", index "h%05u.index", "COMMIT", "latest". */
void fmt_shard_name(uint32_t host, uint32_t file, char out[32]);
void fmt_index_name(uint32_t host, char out[32]);
#define FMT_COMMIT_NAME "COMMIT"
#define FMT_LATEST_NAME "latest"
#define FMT_TMP_SUFFIX ".tmp"

/* ---- validation helpers ---- */
/* 1 if s[0..n) is valid UTF-8 without NUL, 1 <= n <= CKPT_MAX_NAME. */
int fmt_name_valid(const char *s, size_t n);
/* product of dims * elem size with overflow check; -1 on overflow. */
int fmt_shape_bytes(const uint64_t *dims, uint32_t ndim, size_t elem,
		    uint64_t *out);

/* ---- shard file header (4096 bytes) ---- */
typedef struct fmt_shard_hdr {
	uint64_t step;
	uint8_t save_id[16];
	uint32_t host_index;
	uint32_t host_count;
	uint32_t file_index;
	uint32_t version; /* encode: 0 means FMT_VERSION; decode sets it */
} fmt_shard_hdr;

/* Writes FMT_SHARD_HDR_SIZE bytes (zero padded) at out. */
void fmt_shard_hdr_encode(const fmt_shard_hdr *h, uint8_t *out);
/* Validates magic, version, header checksum. */
int fmt_shard_hdr_decode(const uint8_t *in, size_t n, fmt_shard_hdr *h,
			 char *err, size_t errlen);

/* ---- chunk header (64 bytes, then payload, then zero padding) ---- */
typedef struct fmt_chunk_hdr {
	uint8_t codec;          /* enum ckpt_codec */
	uint8_t elem_width;     /* 1, 2, 4 or 8: element size for CODEC_FLOAT */
	uint32_t raw_len;       /* bytes after decoding, <= FMT_MAX_CHUNK */
	uint32_t stored_len;    /* payload bytes following the header */
	uint64_t stream_offset; /* of the first raw byte in the host stream */
	uint64_t raw_xxh3;      /* XXH3-64 of the raw bytes */
} fmt_chunk_hdr;

void fmt_chunk_hdr_encode(const fmt_chunk_hdr *h, uint8_t out[64]);
/* Validates magic, header checksum, codec, widths and lengths. */
int fmt_chunk_hdr_decode(const uint8_t *in, size_t n, fmt_chunk_hdr *h,
			 char *err, size_t errlen);
/* Bytes a chunk occupies in its file: align_up(64 + stored_len, 4096). */
static inline uint64_t fmt_chunk_span(uint32_t stored_len)
{
	return fmt_align_up((uint64_t)FMT_CHUNK_HDR_SIZE + stored_len,
			    FMT_ALIGN);
}

/* ---- codecs ---- */
typedef struct fmt_codec_ctx fmt_codec_ctx; /* one per thread */
fmt_codec_ctx *fmt_codec_ctx_new(void);
void fmt_codec_ctx_free(fmt_codec_ctx *c);
/* fmt_chunk_decode_parts calls fn(dst, n) before it writes each run of up
 * to FMT_PREPARE_BLOCK bytes of a part's destination (the engine faults
 * fresh pages in there: format/ does no system calls). NULL: none. */
#define FMT_PREPARE_BLOCK (256u * 1024u)
void fmt_codec_ctx_set_prepare(fmt_codec_ctx *c,
			       void (*fn)(void *dst, size_t n));

/* Largest payload encode may produce for raw_len bytes (any codec). */
size_t fmt_codec_bound(size_t raw_len);

/*
 * Encodes raw[0..raw_len) with `codec` (zstd `level`; `elem_width` for
 * CKPT_CODEC_FLOAT; widths other than 2/4/8 make FLOAT behave as ZSTD) into
 * out[0..out_cap). Sets *codec_used (CKPT_CODEC_NONE if the result would not
 * be smaller than raw: then out holds a copy of raw) and *stored_len.
 * out_cap must be >= fmt_codec_bound(raw_len).
 */
int fmt_chunk_encode(fmt_codec_ctx *c, int codec, int level, int elem_width,
		     const void *raw, size_t raw_len, void *out, size_t out_cap,
		     int *codec_used, size_t *stored_len);

/*
 * Decodes a payload into raw[0..raw_len) and checks that exactly raw_len
 * bytes result. Never reads outside stored[0..stored_len) nor writes
 * outside raw[0..raw_len), whatever the payload holds. Does not check the
 * hash (the caller does, with fmt_xxh3).
 */
int fmt_chunk_decode(fmt_codec_ctx *c, int codec, int elem_width,
		     const void *stored, size_t stored_len, void *raw,
		     size_t raw_len, char *err, size_t errlen);

/* A run [off, off + len) of a chunk's raw bytes and where it goes (dst
 * NULL: produced for the hash only). */
typedef struct fmt_part {
	uint64_t off, len;
	uint8_t *dst;
} fmt_part;

/*
 * fmt_chunk_decode into several destinations at once, with the XXH3-64 of
 * all raw_len raw bytes in *xxh3, hashed block by block as they are
 * produced (while in the cache: no second pass over the output, no
 * intermediate copy). parts[0..nparts) tile [0, raw_len) in order; with
 * codec float every part boundary below raw_len is a multiple of
 * elem_width. -EINVAL (nothing decoded) if not; otherwise the checks and
 * errors of fmt_chunk_decode.
 */
int fmt_chunk_decode_parts(fmt_codec_ctx *c, int codec, int elem_width,
			   const void *stored, size_t stored_len,
			   size_t raw_len, const fmt_part *parts, size_t nparts,
			   uint64_t *xxh3, char *err, size_t errlen);

/* ---- metadata files: 64-byte header + JSON document ---- */
enum fmt_meta_kind { FMT_META_INDEX = 1, FMT_META_COMMIT = 2 };

/* Frames body[0..len) (a JSON document) for a file of `kind`. Returns a
 * malloc'd buffer of FMT_META_HDR_SIZE + len bytes in *out. */
int fmt_meta_wrap(int kind, const char *body, size_t len, uint8_t **out,
		  size_t *out_len);
/* The same with the frame's version (1..FMT_VERSION_MAX). */
int fmt_meta_wrap_v(int kind, uint32_t version, const char *body, size_t len,
		    uint8_t **out, size_t *out_len);
/* Checks the frame of a whole file's bytes (magic, version, kind, length ==
 * file size - 64, body hash) and returns a pointer to the body inside
 * `file`. */
int fmt_meta_unwrap(int kind, const uint8_t *file, size_t file_len,
		    const char **body, size_t *body_len, char *err,
		    size_t errlen);

/* ---- host index ---- */
typedef struct fmt_file_entry {
	char name[32];
	uint64_t size;
	uint64_t xxh3;          /* of the whole file */
	uint32_t host;
	int32_t kind;           /* enum ckpt_file_kind */
} fmt_file_entry;

typedef struct fmt_tensor_entry {
	char *name;             /* NUL-terminated, validated UTF-8 */
	size_t name_len;
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[CKPT_MAX_NDIM];
	uint64_t offset[CKPT_MAX_NDIM];
	uint64_t extent[CKPT_MAX_NDIM];
	uint64_t stream_offset; /* multiple of FMT_STREAM_ALIGN */
	uint64_t nbytes;        /* product(extent) * dtype size */
} fmt_tensor_entry;

typedef struct fmt_chunk_entry {
	uint32_t file;          /* index into fmt_index.files */
	uint8_t codec;
	uint8_t elem_width;
	uint32_t raw_len;
	uint32_t stored_len;
	uint64_t file_offset;   /* of the chunk header, multiple of 4096 */
	uint64_t stream_offset;
	uint64_t raw_xxh3;
	uint64_t h128[2]; /* version 2: XXH3-128 (FMT_H128_SEED) of the raw
			     bytes, high then low half; 0 in version 1 */
} fmt_chunk_entry;

/* Version 2: a shard file of an older step of the same host that chunks
 * of this index refer to (chunk.file >= nfiles: refs[file - nfiles]). */
typedef struct fmt_ref_entry {
	uint64_t step; /* < the index's step */
	char name[32]; /* h<host>-f<f>.shard of this index's host */
	uint64_t size;
	uint64_t xxh3; /* of the whole file */
	uint32_t file; /* the f of its name */
} fmt_ref_entry;

typedef struct fmt_index {
	uint64_t step;
	uint8_t save_id[16];
	uint32_t host_index;
	uint32_t host_count;
	uint32_t chunk_bytes;
	uint64_t stream_bytes;
	size_t nfiles;
	fmt_file_entry *files;  /* shard files of this host, kind SHARD */
	size_t ntensors;
	fmt_tensor_entry *tensors;
	size_t nchunks;
	fmt_chunk_entry *chunks; /* sorted by stream_offset, contiguous,
	                            covering [0, stream_bytes) */
	int32_t reason; /* enum ckpt_save_reason; unspecified if absent */
	uint32_t version; /* 1 or 2 (0 encodes as 1); refs need 2 */
	size_t nrefs;
	fmt_ref_entry *refs; /* version 2: older files chunks refer to */
} fmt_index;

/* The file a chunk's `file` number names: files[] or refs[] (NULL if out
 * of range); its name for messages. */
const char *fmt_index_file_name(const fmt_index *ix, uint32_t file);

/* Serializes to a framed file image (malloc'd). */
int fmt_index_encode(const fmt_index *ix, uint8_t **out, size_t *out_len);
/*
 * Parses and validates a whole index file: frame, JSON types, every
 * number's range (dtype, ndim, shapes, slice inside shape, nbytes,
 * stream ranges inside stream_bytes and non-overlapping, chunks contiguous
 * and covering the stream, chunk spans inside their file's size and not
 * overlapping, file offsets aligned, names valid and unique).
 */
int fmt_index_decode(const uint8_t *file, size_t file_len, fmt_index *ix,
		     char *err, size_t errlen);
void fmt_index_free(fmt_index *ix); /* frees members, not ix itself */

/* ---- slices of one tensor across hosts ---- */
/* One slice of a global tensor as stored by one host. */
typedef struct fmt_slice {
	const fmt_tensor_entry *t;
	uint32_t host;
} fmt_slice;

/*
 * Checks the rule that ties the indexes of a step together (SPEC.md
 * section 7, "Multi-host"): slices with one name agree on dtype, ndim and global shape,
 * lie inside that shape, and no two of them share an element (a slice
 * with an empty extent holds none; two slices of a scalar overlap).
 * v[0..n) holds the slices of one name or of every name of every host;
 * each host lists a name at most once (fmt_index_decode checks that).
 * Reorders v: by name, and within a name by position. Sets *distinct (if
 * not NULL) to the number of distinct names. O(n log n) for the usual
 * shardings, allocates nothing. Returns 0, CKPT_E_MISMATCH (disagreement
 * or overlap; the message names the tensor and both hosts),
 * CKPT_E_CORRUPT (a slice outside its shape) or -EINVAL (NULL entries).
 */
int fmt_slices_check(fmt_slice *v, size_t n, uint64_t *distinct, char *err,
		     size_t errlen);

/* ---- commit record ---- */
typedef struct fmt_commit {
	uint64_t step;
	uint32_t host_count;
	int64_t commit_unix_ns;
	uint64_t tensor_count;  /* distinct global tensors */
	uint64_t raw_bytes;
	uint64_t stored_bytes;  /* sum of all file sizes */
	size_t nfiles;
	fmt_file_entry *files;  /* every index and shard file of every host */
	int32_t reason; /* enum ckpt_save_reason; unspecified if absent */
	uint32_t version; /* 1 or 2 (0 encodes as 1) */
	size_t nrefs;
	uint64_t *refs; /* version 2: steps the indexes refer to, descending,
			   distinct, each < step */
} fmt_commit;

int fmt_commit_encode(const fmt_commit *cm, uint8_t **out, size_t *out_len);
/* Validates frame, types, ranges, names (each a valid index/shard name of a
 * host < host_count, no duplicates, exactly one index per host). */
int fmt_commit_decode(const uint8_t *file, size_t file_len, fmt_commit *cm,
		      char *err, size_t errlen);
void fmt_commit_free(fmt_commit *cm);
/* The entry of file `name` in a decoded record, or NULL (names are unique
 * there). */
const fmt_file_entry *fmt_commit_find(const fmt_commit *cm, const char *name);

#endif /* CKPT_FMT_H */
