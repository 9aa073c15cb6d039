/*
 * reader_verify.c - whole-step checks: ckpt_reader_verify (every file's
 * size and XXH3 and every chunk, each shard file read once through the
 * pipeline in file order, from a directory or a gs:// location).
 *
 * Progress goes through the caller's callback, on the calling thread,
 * after each unit of work; a nonzero return cancels. The data path is
 * described in reader_internal.h; ckpt_reader_copy is in reader_copy.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "reader_internal.h"

/* ------------------------------------------------------------------ */
/* Verify                                                             */
/* ------------------------------------------------------------------ */

static int cmp_job_off(const void *a, const void *b)
{
	const struct rd_job *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

static int rd_progress(ckpt_reader *r, ckpt_progress_fn fn, void *arg,
		       uint64_t done, uint64_t total)
{
	if (fn && fn(arg, done, total) != 0)
		return eng_err(r->errmsg, CKPT_E_CANCELED,
			       "canceled by the progress callback");
	return 0;
}

/* A small file (COMMIT, index): size and hash. */
static int rd_verify_small(ckpt_reader *r, const char *name, uint64_t size,
			   uint64_t xxh3)
{
	char err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = rd_get_doc(r, name, size, &buf, &len, err);
	if (rc == -ENOENT)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: missing",
			     r->dname, name);
	else if (rc < 0)
		rc = eng_err(r->errmsg, rc, "%s", err);
	else if (len != size)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %zu bytes, %llu recorded", r->dname, name,
			     len, (ull)size);
	else if (fmt_xxh3(buf, len) != xxh3)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s offset 0: whole-file checksum mismatch",
			     r->dname, name);
	free(buf);
	return rc;
}

static int rd_verify_shard(ckpt_reader *r, size_t fi, uint64_t *done,
			   uint64_t total, ckpt_progress_fn fn, void *arg)
{
	struct rd_file *f = &r->files[fi];
	const struct rd_host *ho = &r->hosts[f->host];
	struct rd_batch b;
	fmt_shard_hdr want;
	char msg[ENG_ERRMSG_MAX];
	size_t n = 1;
	uint64_t expect = FMT_SHARD_HDR_SIZE;
	int rc, fd;

	memset(&b, 0, sizeof(b));
	fd = r->loc ? 0 : rd_file_fd(r, fi, msg, sizeof(msg));
	if (fd < 0)
		return eng_err(r->errmsg, fd, "%s", msg);
	for (size_t c = 0; c < ho->ix.nchunks; c++)
		if (ho->ix.chunks[c].file == f->ixfile)
			n++;
	b.jobs = calloc(n, sizeof(*b.jobs));
	b.hs = XXH3_createState();
	if (!b.jobs || !b.hs) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	XXH3_64bits_reset(b.hs);
	b.jobs[0].kind = JOB_SHARD_HDR;
	b.jobs[0].file = (uint32_t)fi;
	b.jobs[0].host = f->host;
	b.jobs[0].off = 0;
	b.jobs[0].len = FMT_SHARD_HDR_SIZE;
	n = 1;
	for (size_t c = 0; c < ho->ix.nchunks; c++) {
		const fmt_chunk_entry *ce = &ho->ix.chunks[c];
		struct rd_job *j;

		if (ce->file != f->ixfile)
			continue;
		j = &b.jobs[n++];
		j->kind = JOB_CHUNK;
		j->file = (uint32_t)fi;
		j->host = f->host;
		j->chunk = (uint32_t)c;
		j->off = ce->file_offset;
		j->len = fmt_chunk_span(ce->stored_len);
	}
	qsort(b.jobs + 1, n - 1, sizeof(*b.jobs), cmp_job_off);
	if (f->size < FMT_SHARD_HDR_SIZE) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %llu bytes, too small for a shard header",
			     r->dname, f->name, (ull)f->size);
		goto out;
	}
	for (size_t i = 1; i < n; i++) {
		const struct rd_job *j = &b.jobs[i];

		if (j->off != expect) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s offset %llu: chunks do not tile "
				     "the file (next chunk at %llu)", r->dname,
				     f->name, (ull)expect, (ull)j->off);
			goto out;
		}
		expect += j->len;
	}
	if (expect != f->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s offset %llu: %llu bytes after the last "
			     "chunk", r->dname, f->name, (ull)expect,
			     (ull)(f->size - expect));
		goto out;
	}
	want.step = r->step;
	memcpy(want.save_id, ho->ix.save_id, sizeof(want.save_id));
	want.host_index = f->host;
	want.host_count = r->nhosts;
	want.file_index = f->findex;
	b.njobs = n;
	b.ordered = 1;
	b.want_hdr = &want;
	b.pdone = done;
	b.ptotal = total;
	b.fn = fn;
	b.fnarg = arg;
	b.err_key = SIZE_MAX;
	rc = rd_pipeline(r, &b);
	if (b.canceled) {
		rc = eng_err(r->errmsg, CKPT_E_CANCELED,
			     "verify canceled by the progress callback");
		goto out;
	}
	if (b.err_code) {
		rc = eng_err(r->errmsg, b.err_code, "%s", b.err_msg);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (XXH3_64bits_digest(b.hs) != f->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: whole-file checksum mismatch (every "
			     "header and chunk checks out: the damage is in "
			     "padding)", r->dname, f->name);
		goto out;
	}
	rc = 0;
out:
	rd_batch_free(&b);
	return rc;
}

/* Bytes of a ref's file from `off`: pread, or a ranged GET on gs://
 * (RD_REF_BLOCK at a time); *got 0 at its end. */
#define RD_REF_BLOCK (8u << 20)
static int rd_ref_read(ckpt_reader *r, size_t fi, int fd, uint64_t off,
		       uint8_t *buf, size_t *got, char *msg, size_t len)
{
	ssize_t n;

	if (r->loc)
		return rd_gcs_pread(r, fi, off, buf, RD_REF_BLOCK, got, msg,
				    len);
	n = pread(fd, buf, RD_REF_BLOCK, (off_t)off);
	if (n < 0) {
		snprintf(msg, len, "read: %s", strerror(errno));
		return -errno;
	}
	*got = (size_t)n;
	return 0;
}

/*
 * Version 2: a file of an older step that an index refers to (in the
 * directory or the bucket prefix of that step). Its size and whole-file
 * XXH3 must be those the ref records, i.e. the bytes the older step
 * committed; the chunks a read returns are checked as always (header vs
 * index, decode, raw hash).
 */
static int rd_verify_ref(ckpt_reader *r, size_t fi, uint64_t *done,
			 uint64_t total, ckpt_progress_fn fn, void *arg)
{
	const struct rd_file *f = &r->files[fi];
	char msg[ENG_ERRMSG_MAX];
	XXH3_state_t *hs;
	uint8_t *buf;
	uint64_t off = 0;
	int fd = -1, rc = 0;

	if (!r->loc) {
		fd = eng_open(f->path, O_RDONLY | O_CLOEXEC, 0);
		if (fd < 0)
			return eng_err(r->errmsg,
				       fd == -ENOENT ? CKPT_E_CORRUPT : fd,
				       "step %llu refers to step %llu/%s: %s",
				       (ull)r->step, (ull)f->ref_step, f->name,
				       fd == -ENOENT ? "missing" :
						       ckpt_strerror(fd));
	}
	hs = XXH3_createState();
	buf = malloc(RD_REF_BLOCK);
	if (!hs || !buf) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	XXH3_64bits_reset(hs);
	for (;;) {
		size_t n = 0;

		msg[0] = 0;
		rc = rd_ref_read(r, fi, fd, off, buf, &n, msg, sizeof(msg));
		if (rc == -ENOENT && r->loc) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "step %llu refers to step %llu/%s: "
				     "missing",
				     (ull)r->step, (ull)f->ref_step, f->name);
			goto out;
		}
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc,
				     "step %llu refers to step %llu/%s: %s",
				     (ull)r->step, (ull)f->ref_step, f->name,
				     msg[0] ? msg : ckpt_strerror(rc));
			goto out;
		}
		if (n == 0)
			break;
		XXH3_64bits_update(hs, buf, (size_t)n);
		off += (uint64_t)n;
		*done += (uint64_t)n;
		rc = rd_progress(r, fn, arg, *done, total);
		if (rc < 0)
			goto out;
		if (off > f->size || n < RD_REF_BLOCK)
			break; /* its end, or longer than the ref says */
	}
	if (off != f->size || XXH3_64bits_digest(hs) != f->xxh3) {
		snprintf(msg, sizeof(msg),
			 off != f->size ?
				 "%llu bytes, the ref says %llu" :
				 "whole-file checksum mismatch with the ref",
			 (ull)off, (ull)f->size);
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "step %llu refers to step %llu/%s: %s",
			     (ull)r->step, (ull)f->ref_step, f->name, msg);
	}
out:
	free(buf);
	XXH3_freeState(hs);
	if (fd >= 0)
		eng_close(fd);
	return rc;
}

static int rd_verify_all(ckpt_reader *r, ckpt_progress_fn fn, void *arg)
{
	uint64_t total, done = 0;
	int rc;

	total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		total += r->cm.files[i].size;
	for (size_t i = r->nlisted; i < r->nfiles; i++)
		total += r->files[i].size;
	rc = rd_verify_small(r, FMT_COMMIT_NAME, r->commit_size,
			     r->commit_xxh3);
	if (rc < 0)
		return rc;
	done += r->commit_size;
	rc = rd_progress(r, fn, arg, done, total);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];

		if (fe->kind == CKPT_FILE_INDEX) {
			rc = rd_verify_small(r, fe->name, fe->size, fe->xxh3);
			if (rc < 0)
				return rc;
			done += fe->size;
			rc = rd_progress(r, fn, arg, done, total);
		} else {
			size_t k = rd_file_lookup(r, fe->name);

			if (k == SIZE_MAX)
				return eng_err(r->errmsg, CKPT_E_CORRUPT,
					       "%s: unknown file", fe->name);
			rc = rd_verify_shard(r, k, &done, total, fn, arg);
		}
		if (rc < 0)
			return rc;
	}
	for (size_t i = r->nlisted; i < r->nfiles; i++) {
		rc = rd_verify_ref(r, i, &done, total, fn, arg);
		if (rc < 0)
			return rc;
	}
	r->errmsg[0] = 0;
	return 0;
}

CKPT_API int ckpt_reader_verify(ckpt_reader *r, ckpt_progress_fn fn,
				void *arg)
{
	int rc;

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_reader_verify: reader is NULL");
	rc = rd_check_process(r, "ckpt_reader_verify");
	if (rc < 0)
		return rc;
	rc = rd_verify_all(r, fn, arg);
	if (rc < 0)
		rd_locate(r); /* a gs:// object named whole */
	return rc;
}
