/*
 * fmt_commit.c - the commit record (SPEC.md section 8): the file whose
 * presence makes a step complete. It lists every index and shard file of
 * every host with its size and hash, so that a reader can check a whole
 * step against it and a garbage collector knows what belongs to it.
 *
 * Decoding checks that every name is the canonical name of an index or
 * shard file of a host below "hosts", that no name repeats, that each host
 * has exactly one index, and that the sizes add up to "stored_bytes".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_json.h"

/* ---- encoding ---- */

static const char *file_kind_name(int kind)
{
	return kind == CKPT_FILE_INDEX ? "index" : "shard";
}

int fmt_commit_encode(const fmt_commit *cm, uint8_t **out, size_t *out_len)
{
	fmt_sbuf b = { 0 };
	uint32_t version = cm && cm->version ? cm->version : FMT_VERSION;

	if (!cm || !out || !out_len || cm->step > FMT_JSON_MAX_INT ||
	    cm->commit_unix_ns < 0 || cm->tensor_count > FMT_JSON_MAX_INT ||
	    cm->raw_bytes > FMT_JSON_MAX_INT ||
	    cm->stored_bytes > FMT_JSON_MAX_INT || (cm->nfiles && !cm->files) ||
	    !ckpt_reason_name(cm->reason))
		return -EINVAL;
	if (version > FMT_VERSION_MAX || (version == 1 && cm->nrefs) ||
	    (cm->nrefs && !cm->refs))
		return -EINVAL;
	for (size_t i = 0; i < cm->nrefs; i++)
		if (cm->refs[i] >= cm->step ||
		    (i && cm->refs[i] >= cm->refs[i - 1]))
			return -EINVAL;
	for (size_t i = 0; i < cm->nfiles; i++)
		if (cm->files[i].size > FMT_JSON_MAX_INT ||
		    !memchr(cm->files[i].name, 0, sizeof(cm->files[i].name)) ||
		    (cm->files[i].kind != CKPT_FILE_INDEX &&
		     cm->files[i].kind != CKPT_FILE_SHARD))
			return -EINVAL;
	fmt_sb_printf(&b,
		      "{\"format\":%d,\"kind\":\"commit\",\"step\":%llu,"
		      "\"hosts\":%u,\"commit_unix_ns\":%lld,",
		      version, (unsigned long long)cm->step, cm->host_count,
		      (long long)cm->commit_unix_ns);
	fmt_sb_reason(&b, cm->reason);
	fmt_sb_printf(&b,
		      "\"tensors\":%llu,\"raw_bytes\":%llu,"
		      "\"stored_bytes\":%llu,\n\"files\":[",
		      (unsigned long long)cm->tensor_count,
		      (unsigned long long)cm->raw_bytes,
		      (unsigned long long)cm->stored_bytes);
	for (size_t i = 0; i < cm->nfiles; i++) {
		const fmt_file_entry *f = &cm->files[i];

		fmt_sb_file(&b, f, i == 0);
		fmt_sb_printf(&b, ",\"host\":%u,\"kind\":\"%s\"}", f->host,
			      file_kind_name(f->kind));
	}
	if (version >= FMT_VERSION_DEDUP) {
		fmt_sb_str(&b, "],\n\"refs\":[");
		for (size_t i = 0; i < cm->nrefs; i++)
			fmt_sb_printf(&b, "%s%llu", i ? "," : "",
				      (unsigned long long)cm->refs[i]);
	}
	fmt_sb_str(&b, "]}\n");
	return fmt_sb_finish(&b, FMT_META_COMMIT, version, out, out_len);
}

/* Parses "h%05u-f%03u.shard" / "h%05u.index" exactly as the writers
 * produce them (canonical form only). Returns 0 and sets kind/host/file. */
static int parse_file_name(const char *s, int *kind, uint32_t *host,
			   uint32_t *file)
{
	char canon[32];
	uint64_t h = 0, f = 0;
	size_t i = 1, d;

	if (s[0] != 'h')
		return -1;
	for (d = 0; s[i] >= '0' && s[i] <= '9' && d < 10; i++, d++)
		h = h * 10 + (uint64_t)(s[i] - '0');
	if (d == 0 || h >= FMT_MAX_HOSTS)
		return -1;
	if (strcmp(s + i, ".index") == 0) {
		fmt_index_name((uint32_t)h, canon);
		*kind = CKPT_FILE_INDEX;
		f = 0;
	} else {
		if (s[i] != '-' || s[i + 1] != 'f')
			return -1;
		i += 2;
		for (d = 0; s[i] >= '0' && s[i] <= '9' && d < 10; i++, d++)
			f = f * 10 + (uint64_t)(s[i] - '0');
		if (d == 0 || f >= FMT_MAX_FILES_PER_HOST ||
		    strcmp(s + i, ".shard") != 0)
			return -1;
		fmt_shard_name((uint32_t)h, (uint32_t)f, canon);
		*kind = CKPT_FILE_SHARD;
	}
	if (strcmp(canon, s) != 0)
		return -1;
	*host = (uint32_t)h;
	*file = (uint32_t)f;
	return 0;
}

/* ---- decoding ---- */

static int cmp_file_name(const void *a, const void *b)
{
	const fmt_file_entry *x = *(const fmt_file_entry *const *)a;
	const fmt_file_entry *y = *(const fmt_file_entry *const *)b;

	return strcmp(x->name, y->name);
}

static int check_commit_files(fmt_jrd *r, fmt_commit *cm)
{
	fmt_file_entry **sorted;
	uint8_t *has_index = NULL;
	uint64_t total = 0;
	size_t nindex = 0;
	int rc = 0;

	/* Exactly one index per host: at least host_count entries, which
	 * also bounds the allocation below by the document size. */
	if (cm->nfiles < cm->host_count)
		return fmt_jr_bad(
			r,
			"\"files\": %zu entries cannot hold an index for "
			"each of %u hosts",
			cm->nfiles, cm->host_count);
	sorted = malloc(cm->nfiles * sizeof(*sorted));
	has_index = calloc(cm->host_count, 1);
	if (!sorted || !has_index) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < cm->nfiles; i++) {
		sorted[i] = &cm->files[i];
		if (cm->files[i].kind == CKPT_FILE_INDEX) {
			if (has_index[cm->files[i].host]++ == 0)
				nindex++;
		}
		if (cm->files[i].size > FMT_JSON_MAX_INT - total) {
			rc = fmt_jr_bad(r, "\"files\": total size overflows");
			goto out;
		}
		total += cm->files[i].size;
	}
	qsort(sorted, cm->nfiles, sizeof(*sorted), cmp_file_name);
	for (size_t i = 1; i < cm->nfiles; i++) {
		if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
			rc = fmt_jr_bad(r, "\"files\": duplicate \"%s\"",
					sorted[i]->name);
			goto out;
		}
	}
	if (nindex != cm->host_count) {
		for (uint32_t h = 0; h < cm->host_count; h++) {
			if (!has_index[h]) {
				rc = fmt_jr_bad(
					r, "\"files\": no index of host %u", h);
				goto out;
			}
		}
	}
	if (total != cm->stored_bytes)
		rc = fmt_jr_bad(r, "\"stored_bytes\" %llu, files sum to %llu",
				(unsigned long long)cm->stored_bytes,
				(unsigned long long)total);
out:
	free(sorted);
	free(has_index);
	return rc;
}

/* Version 2 "refs": steps referred to, descending, each older than this
 * one (so no duplicates). Bounded by the document's element count. */
static int decode_refs(fmt_jrd *r, json_t *refs, fmt_commit *cm)
{
	int rc;

	if (!json_is_array(refs))
		return fmt_jr_bad(r, "\"refs\": not an array");
	cm->nrefs = json_array_size(refs);
	if (cm->nrefs) {
		cm->refs = calloc(cm->nrefs, sizeof(*cm->refs));
		if (!cm->refs)
			return -ENOMEM;
	}
	for (size_t i = 0; i < cm->nrefs; i++) {
		rc = fmt_jr_uint(r, json_array_get(refs, i), FMT_JSON_MAX_INT,
				 &cm->refs[i], "refs", "");
		if (rc)
			return rc;
		if (cm->refs[i] >= cm->step ||
		    (i && cm->refs[i] >= cm->refs[i - 1]))
			return fmt_jr_bad(r,
					  "refs[%zu]: %llu not older than "
					  "the step and the entry before",
					  i, (unsigned long long)cm->refs[i]);
	}
	return 0;
}

static int decode_commit(fmt_jrd *r, json_t *root, fmt_commit *cm)
{
	static const char *const keys[] = { "format",         "kind",
					    "step",           "hosts",
					    "commit_unix_ns", "tensors",
					    "raw_bytes",      "stored_bytes",
					    "files",          NULL };
	static const char *const keys2[] = {
		"format",         "kind",    "step",      "hosts",
		"commit_unix_ns", "tensors", "raw_bytes", "stored_bytes",
		"files",          "refs",    NULL
	};
	static const char *const fkeys[] = { "name", "size", "xxh3",
					     "host", "kind", NULL };
	static const char *const opt[] = { "reason", NULL };
	json_t *files;
	uint64_t x;
	int rc;

	if ((rc = fmt_jr_header(r, root, "commit")) ||
	    (rc = fmt_jr_keys_opt(
		     r, root, r->version >= FMT_VERSION_DEDUP ? keys2 : keys,
		     opt, "document")) ||
	    (rc = fmt_jr_reason(r, root, &cm->reason)) ||
	    (rc = fmt_jr_key_uint(r, root, "step", FMT_JSON_MAX_INT, &cm->step,
				  "")) ||
	    (rc = fmt_jr_key_uint(r, root, "hosts", FMT_MAX_HOSTS, &x, "")))
		return rc;
	if (x == 0)
		return fmt_jr_bad(r, "\"hosts\": must be at least 1");
	cm->host_count = (uint32_t)x;
	if ((rc = fmt_jr_key_uint(r, root, "commit_unix_ns", FMT_JSON_MAX_INT,
				  &x, "")))
		return rc;
	cm->commit_unix_ns = (int64_t)x;
	if ((rc = fmt_jr_key_uint(r, root, "tensors", FMT_JSON_MAX_INT,
				  &cm->tensor_count, "")) ||
	    (rc = fmt_jr_key_uint(r, root, "raw_bytes", FMT_JSON_MAX_INT,
				  &cm->raw_bytes, "")) ||
	    (rc = fmt_jr_key_uint(r, root, "stored_bytes", FMT_JSON_MAX_INT,
				  &cm->stored_bytes, "")))
		return rc;
	files = json_object_get(root, "files");
	if (!json_is_array(files))
		return fmt_jr_bad(r, "\"files\": not an array");
	cm->nfiles = json_array_size(files);
	if (cm->nfiles) {
		cm->files = calloc(cm->nfiles, sizeof(*cm->files));
		if (!cm->files)
			return -ENOMEM;
	}
	for (size_t i = 0; i < cm->nfiles; i++) {
		json_t *o = json_array_get(files, i), *k;
		fmt_file_entry *fe = &cm->files[i];
		uint32_t host, fno;
		char where[32];
		int kind;

		snprintf(where, sizeof(where), "files[%zu]", i);
		if ((rc = fmt_jr_keys(r, o, fkeys, where)) ||
		    (rc = fmt_jr_file(r, o, fe, where)) ||
		    (rc = fmt_jr_key_uint(r, o, "host", cm->host_count - 1, &x,
					  where)))
			return rc;
		fe->host = (uint32_t)x;
		k = json_object_get(o, "kind");
		if (!json_is_string(k))
			return fmt_jr_bad(r, "%s: \"kind\": not a string",
					  where);
		if (strcmp(json_string_value(k), "index") == 0)
			fe->kind = CKPT_FILE_INDEX;
		else if (strcmp(json_string_value(k), "shard") == 0)
			fe->kind = CKPT_FILE_SHARD;
		else
			return fmt_jr_bad(r,
					  "%s: \"kind\": not \"index\" or "
					  "\"shard\"",
					  where);
		if (parse_file_name(fe->name, &kind, &host, &fno) != 0 ||
		    kind != fe->kind || host != fe->host)
			return fmt_jr_bad(r,
					  "%s: name \"%s\" is not the name of "
					  "a %s file of host %u",
					  where, fe->name, json_string_value(k),
					  fe->host);
		if (fe->size < (kind == CKPT_FILE_INDEX ? FMT_META_HDR_SIZE :
							  FMT_SHARD_HDR_SIZE))
			return fmt_jr_bad(
				r, "%s: size %llu too small for a %s file",
				where, (unsigned long long)fe->size,
				json_string_value(k));
	}
	cm->version = r->version;
	if (r->version >= FMT_VERSION_DEDUP &&
	    (rc = decode_refs(r, json_object_get(root, "refs"), cm)))
		return rc;
	return check_commit_files(r, cm);
}

int fmt_commit_decode(const uint8_t *file, size_t file_len, fmt_commit *cm,
		      char *err, size_t errlen)
{
	fmt_jrd r = { err, errlen, "commit", 0 };
	json_t *root;
	int rc;

	if (!cm)
		return -EINVAL;
	memset(cm, 0, sizeof(*cm));
	rc = fmt_jr_load(&r, FMT_META_COMMIT, file, file_len, &root);
	if (rc)
		return rc;
	rc = decode_commit(&r, root, cm);
	json_decref(root);
	if (rc)
		fmt_commit_free(cm);
	return rc;
}

void fmt_commit_free(fmt_commit *cm)
{
	if (!cm)
		return;
	free(cm->files);
	free(cm->refs);
	memset(cm, 0, sizeof(*cm));
}

const fmt_file_entry *fmt_commit_find(const fmt_commit *cm, const char *name)
{
	for (size_t i = 0; i < cm->nfiles; i++)
		if (strcmp(cm->files[i].name, name) == 0)
			return &cm->files[i];
	return NULL;
}
