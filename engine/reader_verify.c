/*
 * reader_verify.c - whole-step checks: ckpt_reader_verify (every file's
 * size and XXH3 and every chunk, each shard file read once through the
 * pipeline in file order) and ckpt_reader_copy (a verified copy into
 * another root, committed there last, like a save).
 *
 * Both report progress through the caller's callback, on the calling
 * thread, after each unit of work; a nonzero return cancels. The data path
 * is described in reader_internal.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "reader_internal.h"

#define RD_COPY_BLOCK (8u << 20)

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
	char *path = eng_path("%s/%s", r->stepdir, name);
	char err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	if (!path)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	rc = eng_read_file(path, size, &buf, &len, err);
	if (rc == -ENOENT)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: missing",
			     r->dname, name);
	else if (rc == CKPT_E_CORRUPT)
		rc = eng_err(r->errmsg, rc, "%s/%s: larger than the %llu "
			     "bytes recorded", r->dname, name, (ull)size);
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
	free(path);
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
	fd = rd_file_fd(r, fi, msg, sizeof(msg));
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

CKPT_API int ckpt_reader_verify(ckpt_reader *r, ckpt_progress_fn fn,
				void *arg)
{
	uint64_t total, done = 0;
	int rc;

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_reader_verify: reader is NULL");
	rc = rd_check_process(r, "ckpt_reader_verify");
	if (rc < 0)
		return rc;
	total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		total += r->cm.files[i].size;
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
	r->errmsg[0] = 0;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Copy                                                               */
/* ------------------------------------------------------------------ */

static int rd_copy_file(ckpt_reader *r, const char *dstdir,
			const fmt_file_entry *fe, uint8_t *buf,
			uint64_t *done, uint64_t total, ckpt_progress_fn fn,
			void *arg)
{
	char *src = eng_path("%s/%s", r->stepdir, fe->name);
	char *tmp = eng_tmp_name(dstdir, fe->name);
	char *dst = eng_path("%s/%s", dstdir, fe->name);
	XXH3_state_t *hs = XXH3_createState();
	int in = -1, outfd = -1, rc;
	struct stat st;
	uint64_t off = 0;

	if (!src || !tmp || !dst || !hs) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	in = eng_open(src, O_RDONLY, 0);
	if (in < 0) {
		rc = in == -ENOENT
			     ? eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: missing", r->dname, fe->name)
			     : eng_err(r->errmsg, in, "%s: open: %s", src,
				       ckpt_strerror(in));
		goto out;
	}
	if (fstat(in, &st) < 0) {
		rc = eng_err(r->errmsg, -errno, "%s: stat: %s", src,
			     strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size != fe->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %llu bytes, the commit record says %llu",
			     r->dname, fe->name, (ull)st.st_size,
			     (ull)fe->size);
		goto out;
	}
	outfd = eng_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (outfd < 0) {
		rc = eng_err(r->errmsg, outfd, "%s: create: %s", tmp,
			     ckpt_strerror(outfd));
		goto out;
	}
	XXH3_64bits_reset(hs);
	while (off < fe->size) {
		size_t n = (size_t)min_u64(RD_COPY_BLOCK, fe->size - off);

		rc = eng_pread_all(in, buf, n, off);
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc, "%s/%s offset %llu: read: "
				     "%s", r->dname, fe->name, (ull)off,
				     ckpt_strerror(rc));
			goto out;
		}
		XXH3_64bits_update(hs, buf, n);
		rc = eng_pwrite_all(outfd, buf, n, off);
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc, "%s: write: %s", tmp,
				     ckpt_strerror(rc));
			goto out;
		}
		off += n;
		*done += n;
		rc = rd_progress(r, fn, arg, *done, total);
		if (rc < 0)
			goto out;
	}
	if (XXH3_64bits_digest(hs) != fe->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: whole-file checksum mismatch while "
			     "copying", r->dname, fe->name);
		goto out;
	}
	rc = eng_fsync(outfd);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", tmp,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_close(outfd);
	outfd = -1;
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: close: %s", tmp,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_rename(tmp, dst);
	if (rc < 0)
		rc = eng_err(r->errmsg, rc, "%s: rename: %s", tmp,
			     ckpt_strerror(rc));
out:
	if (outfd >= 0)
		eng_close(outfd);
	if (in >= 0)
		eng_close(in);
	XXH3_freeState(hs);
	free(src);
	free(tmp);
	free(dst);
	return rc;
}

CKPT_API int ckpt_reader_copy(ckpt_reader *r, const char *dst_root,
			      ckpt_progress_fn fn, void *arg)
{
	char *dstdir = NULL, *cpath = NULL;
	uint8_t *buf = NULL, *cbuf = NULL;
	size_t clen = 0;
	uint64_t total, done = 0;
	int rc, created = 0;
	fmt_commit tmpcm;
	char err[ENG_ERRMSG_MAX];

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_reader_copy: reader is NULL");
	rc = rd_check_process(r, "ckpt_reader_copy");
	if (rc < 0)
		return rc;
	if (!dst_root)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_reader_copy: dst_root is NULL");
	rc = eng_mkdir(dst_root, 0755);
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s: mkdir: %s", dst_root,
			       ckpt_strerror(rc));
	rc = eng_load_commit(dst_root, r->step, &tmpcm, NULL);
	if (rc == 0) {
		fmt_commit_free(&tmpcm);
		return eng_err(r->errmsg, CKPT_E_EXISTS,
			       "%s: step %llu is already committed there",
			       dst_root, (ull)r->step);
	}
	dstdir = eng_path("%s/%s", dst_root, r->dname);
	cpath = eng_path("%s/" FMT_COMMIT_NAME, r->stepdir);
	buf = malloc(RD_COPY_BLOCK);
	if (!dstdir || !cpath || !buf) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	rc = eng_mkdir(dstdir, 0755);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: mkdir: %s", dstdir,
			     ckpt_strerror(rc));
		goto out;
	}
	created = 1;
	rc = eng_fsync_dir(dst_root);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", dst_root,
			     ckpt_strerror(rc));
		goto out;
	}
	total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		total += r->cm.files[i].size;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		rc = rd_copy_file(r, dstdir, &r->cm.files[i], buf, &done,
				  total, fn, arg);
		if (rc < 0)
			goto out;
	}
	rc = eng_fsync_dir(dstdir);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", dstdir,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_read_file(cpath, r->commit_size, &cbuf, &clen, err);
	if (rc < 0 || clen != r->commit_size ||
	    fmt_xxh3(cbuf, clen) != r->commit_xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: changed since the reader opened it",
			     r->dname, FMT_COMMIT_NAME);
		goto out;
	}
	/* create-if-absent: a concurrent copy of the same step that won
	 * keeps its files (CKPT_E_EXISTS, nothing removed) */
	rc = eng_create_file(dstdir, FMT_COMMIT_NAME, cbuf, clen, err);
	if (rc == CKPT_E_EXISTS)
		created = 0;
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	created = 0; /* committed: never remove it now */
	done += clen;
	rc = eng_move_latest(dst_root, r->step, err);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	rc = rd_progress(r, fn, arg, done, total);
	if (rc == CKPT_E_CANCELED)
		rc = 0; /* too late to cancel: the copy is committed */
	if (rc == 0)
		r->errmsg[0] = 0;
out:
	if (rc < 0 && created) {
		char saved[ENG_ERRMSG_MAX];

		memcpy(saved, r->errmsg, sizeof(saved));
		eng_remove_tree(dstdir, NULL);
		eng_err(r->errmsg, rc, "%s", saved);
	}
	free(cbuf);
	free(buf);
	free(cpath);
	free(dstdir);
	return rc;
}
