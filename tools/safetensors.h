/*
 * safetensors.h - reading and writing the safetensors container for
 * ckptctl import/export, plus the small text helpers ckptctl shares.
 *
 * File layout (https://github.com/huggingface/safetensors): 8-byte
 * little-endian header length N, N bytes of JSON header (padded with
 * spaces), then the byte buffer. Header: {"name": {"dtype": "BF16",
 * "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
 * {"key": "value"}} with offsets relative to the byte buffer.
 *
 * The reader treats the file as hostile: every length and offset is
 * checked before use and errors name the tensor.
 */
#ifndef CKPTCTL_SAFETENSORS_H
#define CKPTCTL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ckpt.h"

/* Headers beyond this are refused (the reference implementation uses the
 * same bound) so a crafted length cannot make us allocate gigabytes. */
#define ST_MAX_HEADER (100u * 1024 * 1024)

/* Safetensors dtype name of a ckpt dtype ("BF16"), NULL if none. */
const char *st_dtype_name(int ckpt_dtype);
/* ckpt dtype of a safetensors dtype name, CKPT_DTYPE_INVALID if unknown. */
int st_dtype_from_name(const char *name);

typedef struct st_tensor {
	const char *name; /* points into the parsed header (st_file.root) */
	int dtype;        /* enum ckpt_dtype */
	uint32_t ndim;
	uint64_t shape[CKPT_MAX_NDIM];
	uint64_t begin; /* offsets into the byte buffer */
	uint64_t end;
} st_tensor;

typedef struct st_file {
	int fd;
	uint8_t *map; /* whole file, read-only */
	uint64_t file_size;
	uint64_t header_len;
	const uint8_t *data; /* byte buffer: map + 8 + header_len */
	uint64_t data_len;
	json_t *root;       /* parsed header */
	json_t *metadata;   /* "__metadata__" object or NULL (borrowed) */
	st_tensor *tensors; /* sorted by begin offset */
	size_t count;
} st_file;

/*
 * Maps and validates `path`. Returns 0, or -1 with a message in err
 * (which names the file and, where it applies, the tensor).
 */
int st_open(st_file *f, const char *path, char *err, size_t errlen);
void st_close(st_file *f);

/* A tensor to describe in a header being written. */
typedef struct st_entry {
	const char *name;
	int dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes;
} st_entry;

/*
 * Builds the header of a file holding entries e[0..n) contiguously in that
 * order, with string metadata pairs meta[0..2*nmeta) (key, value, ...).
 * *out (malloc'd) receives the 8-byte length prefix followed by the JSON
 * padded with spaces to a multiple of 8; *outlen is its total size, i.e.
 * where the byte buffer starts. Returns 0 or -1 with err set.
 */
int st_header_build(const st_entry *e, size_t n, const char *const *meta,
		    size_t nmeta, char **out, size_t *outlen, char *err,
		    size_t errlen);

/*
 * Copies `s` into buf (size len, always NUL-terminated) with everything
 * that could confuse a terminal or a reader escaped: control characters,
 * backslash, invalid UTF-8 bytes (\xNN) and C1 controls (\u0080..).
 * Long strings are cut with "...". Returns buf.
 */
char *st_escape(const char *s, char *buf, size_t len);

#endif /* CKPTCTL_SAFETENSORS_H */
