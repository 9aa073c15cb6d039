/*
 * fuzz_meta - libFuzzer target for the metadata decoders: index and commit
 * files (fmt_meta_unwrap, fmt_index_decode, fmt_commit_decode).
 *
 * The input is tried twice: as a whole file image (frame checks included),
 * and as a JSON body framed here with fmt_meta_wrap so that mutations reach
 * the JSON validators instead of dying on the body checksum (if the input
 * already starts with a frame, as the seeds do, its body is used).
 *
 * Whatever decodes must survive a round trip: encode, decode again, and
 * the two decoded structs must be equal and the second encoding identical
 * to the first. Any mismatch abort()s.
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
			fprintf(stderr, "%s:%d: round trip: %s\n",         \
				__FILE__, __LINE__, #cond);                \
			abort();                                           \
		}                                                          \
	} while (0)

static int file_eq(const fmt_file_entry *a, const fmt_file_entry *b,
		   int with_host_kind)
{
	return strncmp(a->name, b->name, sizeof(a->name)) == 0 &&
	       a->size == b->size && a->xxh3 == b->xxh3 &&
	       (!with_host_kind || (a->host == b->host && a->kind == b->kind));
}

static int index_eq(const fmt_index *a, const fmt_index *b)
{
	if (a->step != b->step || memcmp(a->save_id, b->save_id, 16) ||
	    a->host_index != b->host_index || a->host_count != b->host_count ||
	    a->chunk_bytes != b->chunk_bytes ||
	    a->stream_bytes != b->stream_bytes || a->nfiles != b->nfiles ||
	    a->ntensors != b->ntensors || a->nchunks != b->nchunks ||
	    a->version != b->version || a->nrefs != b->nrefs)
		return 0;
	for (size_t i = 0; i < a->nrefs; i++)
		if (a->refs[i].step != b->refs[i].step ||
		    strncmp(a->refs[i].name, b->refs[i].name,
			    sizeof(a->refs[i].name)) ||
		    a->refs[i].size != b->refs[i].size ||
		    a->refs[i].xxh3 != b->refs[i].xxh3 ||
		    a->refs[i].file != b->refs[i].file)
			return 0;
	for (size_t i = 0; i < a->nfiles; i++)
		if (!file_eq(&a->files[i], &b->files[i], 1))
			return 0;
	for (size_t i = 0; i < a->ntensors; i++) {
		const fmt_tensor_entry *x = &a->tensors[i], *y = &b->tensors[i];

		if (x->name_len != y->name_len ||
		    memcmp(x->name, y->name, x->name_len) ||
		    x->dtype != y->dtype || x->ndim != y->ndim ||
		    x->ndim > CKPT_MAX_NDIM ||
		    x->stream_offset != y->stream_offset ||
		    x->nbytes != y->nbytes)
			return 0;
		for (uint32_t d = 0; d < x->ndim; d++)
			if (x->shape[d] != y->shape[d] ||
			    x->offset[d] != y->offset[d] ||
			    x->extent[d] != y->extent[d])
				return 0;
	}
	for (size_t i = 0; i < a->nchunks; i++) {
		const fmt_chunk_entry *x = &a->chunks[i], *y = &b->chunks[i];

		if (x->file != y->file || x->codec != y->codec ||
		    x->elem_width != y->elem_width ||
		    x->raw_len != y->raw_len || x->stored_len != y->stored_len ||
		    x->file_offset != y->file_offset ||
		    x->stream_offset != y->stream_offset ||
		    x->raw_xxh3 != y->raw_xxh3 || x->h128[0] != y->h128[0] ||
		    x->h128[1] != y->h128[1])
			return 0;
	}
	return 1;
}

static int commit_eq(const fmt_commit *a, const fmt_commit *b)
{
	if (a->step != b->step || a->host_count != b->host_count ||
	    a->commit_unix_ns != b->commit_unix_ns ||
	    a->tensor_count != b->tensor_count ||
	    a->raw_bytes != b->raw_bytes || a->stored_bytes != b->stored_bytes ||
	    a->nfiles != b->nfiles || a->version != b->version ||
	    a->nrefs != b->nrefs)
		return 0;
	for (size_t i = 0; i < a->nfiles; i++)
		if (!file_eq(&a->files[i], &b->files[i], 1))
			return 0;
	for (size_t i = 0; i < a->nrefs; i++)
		if (a->refs[i] != b->refs[i])
			return 0;
	return 1;
}

static void index_roundtrip(const uint8_t *file, size_t len)
{
	char err[256];
	fmt_index a, b;
	uint8_t *e1 = NULL, *e2 = NULL;
	size_t n1 = 0, n2 = 0;
	int rc;

	if (fmt_index_decode(file, len, &a, err, sizeof(err)) != 0)
		return;
	rc = fmt_index_encode(&a, &e1, &n1);
	if (rc == -ENOMEM)
		goto out;
	CHECK(rc == 0);
	rc = fmt_index_decode(e1, n1, &b, err, sizeof(err));
	if (rc)
		fprintf(stderr, "re-decode: %s\n", err);
	CHECK(rc == 0);
	CHECK(index_eq(&a, &b));
	CHECK(fmt_index_encode(&b, &e2, &n2) == 0);
	CHECK(n1 == n2 && memcmp(e1, e2, n1) == 0);
	fmt_index_free(&b);
out:
	free(e1);
	free(e2);
	fmt_index_free(&a);
}

static void commit_roundtrip(const uint8_t *file, size_t len)
{
	char err[256];
	fmt_commit a, b;
	uint8_t *e1 = NULL, *e2 = NULL;
	size_t n1 = 0, n2 = 0;
	int rc;

	if (fmt_commit_decode(file, len, &a, err, sizeof(err)) != 0)
		return;
	rc = fmt_commit_encode(&a, &e1, &n1);
	if (rc == -ENOMEM)
		goto out;
	CHECK(rc == 0);
	rc = fmt_commit_decode(e1, n1, &b, err, sizeof(err));
	if (rc)
		fprintf(stderr, "re-decode: %s\n", err);
	CHECK(rc == 0);
	CHECK(commit_eq(&a, &b));
	CHECK(fmt_commit_encode(&b, &e2, &n2) == 0);
	CHECK(n1 == n2 && memcmp(e1, e2, n1) == 0);
	fmt_commit_free(&b);
out:
	free(e1);
	free(e2);
	fmt_commit_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *body = (const char *)data;
	size_t blen = size;
	const char *ub;
	size_t ulen;
	char err[256];
	uint8_t *framed;
	size_t flen;
	uint32_t version = FMT_VERSION;

	/* 1. the input as a whole file */
	(void)fmt_meta_unwrap(FMT_META_INDEX, data, size, &ub, &ulen, err,
			      sizeof(err));
	(void)fmt_meta_unwrap(FMT_META_COMMIT, data, size, &ub, &ulen, err,
			      sizeof(err));
	index_roundtrip(data, size);
	commit_roundtrip(data, size);

	/* 2. the input (minus a frame header) as a body, framed here */
	if (size >= FMT_META_HDR_SIZE && memcmp(data, "CKPTMETA", 8) == 0) {
		body += FMT_META_HDR_SIZE;
		blen -= FMT_META_HDR_SIZE;
		/* the seed's version (2: SPEC.md section 16) */
		version = fmt_get_u32(data + 8);
		if (version == 0 || version > FMT_VERSION_MAX)
			version = FMT_VERSION;
	}
	if (fmt_meta_wrap_v(FMT_META_INDEX, version, body, blen, &framed,
			    &flen) == 0) {
		index_roundtrip(framed, flen);
		free(framed);
	}
	if (fmt_meta_wrap_v(FMT_META_COMMIT, version, body, blen, &framed,
			    &flen) == 0) {
		commit_roundtrip(framed, flen);
		free(framed);
	}
	return 0;
}
