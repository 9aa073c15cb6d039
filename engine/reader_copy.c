/*
 * reader_copy.c - ckpt_reader_copy: a verified copy of the open step into
 * another root, DIR or gs://BUCKET/PREFIX, whatever the source is;
 * committed there last, like a save.
 *
 * Design note. Files are copied in blocks of CP_BLOCK bytes from a pool
 * (memory is bounded by the pool, never by a file): to a directory one
 * file after the other with CP_NBLK blocks; to gs:// every file at once,
 * up to the parallel streams (CKPT_GCS_STREAMS), each with its own
 * resumable upload and CP_PER_FILE blocks, all driven by one loop over
 * the client (cp_files: a file moves on as far as it can without
 * waiting, the loop polls the client when none could):
 *
 *   source DIR:   pread --------------------\
 *   source gs://: ranged GETs, up to CP_NBLK  > block FIFO (file order)
 *                 in flight on one client  --/      | XXH3 of the file,
 *                                                   | progress
 *   dest DIR:     pwrite to NAME.<pid>-<rand>.tmp (writeback started per
 *                 block with sync_file_range), fsync, rename
 *   dest gs://:   appended to a resumable upload (no copy; the block goes
 *                 back to the pool when the server confirmed it), crc32c
 *                 computed by the client and sent with the last piece;
 *                 an object already there with the same size (a copy
 *                 interrupted before its COMMIT) is kept if its crc32c
 *                 equals the source's, so a repeated push resumes at
 *                 file granularity
 *
 * The whole-file XXH3 is checked against COMMIT before a file is made
 * final (rename; the upload's last piece), so nothing unverified lands
 * under a final name. COMMIT is written last with a create-only
 * operation, so two copies of one step get one winner, and `latest` then
 * advances unless a newer step is committed. A failed copy removes what
 * it wrote under the step (the step was not committed there).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "gcs.h"
#include "reader_internal.h"

#define CP_BLOCK (8u << 20)
#define CP_NBLK 16u   /* blocks for one file at a time */
#define CP_PER_FILE 4 /* blocks per file when several go at once */
#define CP_REDO 1     /* the object there differs: upload after all */

struct cp_file;

struct cp_blk {
	struct cp *cp;
	struct cp_file *f; /* whose it is while out of the pool */
	uint8_t *buf;
	struct gcs_op *op; /* gs:// source: the read in flight */
	uint64_t off;
	size_t len, got;
};

struct cp_dst {
	int fd;               /* DIR */
	char *tmp, *final;    /* DIR: temporary and final path */
	struct gcs_upload *u; /* gs:// */
	int final_done;       /* DIR: renamed into place */
	int present;          /* gs://: the object is there already, same
				 size: only its crc32c is compared */
	uint32_t crc, want_crc;
};

/* One file being copied: its reads in file order, its destination. */
struct cp_file {
	const fmt_file_entry *fe;
	char *src;
	int fd; /* DIR source */
	XXH3_state_t *hs;
	uint64_t issued, written;
	uint64_t done0; /* cp->done when this pass began */
	struct cp_dst d;
	struct cp_blk **fifo; /* [per] */
	size_t head, count;
	unsigned held; /* its blocks not back in the pool */
	int finishing, done;
};

struct cp {
	ckpt_reader *r;
	eng_loc *dst;
	struct gcs_client *gc; /* for every gs:// side (one loop) */
	struct cp_blk *blk;
	size_t nblk, per; /* per: blocks one file may hold */
	struct cp_blk **freel;
	size_t nfree;
	uint64_t done, total;
	ckpt_progress_fn fn;
	void *arg;
};

static void blk_put(struct cp *cp, struct cp_blk *b)
{
	b->f->held--;
	b->f = NULL;
	cp->freel[cp->nfree++] = b;
}

/* the upload confirmed a block: back to the pool, and the loop's
 * gcs_poll ends to reuse it */
static void cp_release(void *arg)
{
	struct cp_blk *b = arg;

	blk_put(b->cp, b);
	gcs_wakeup(b->cp->gc);
}

static const char *cp_obj(const eng_loc *l, const char *path)
{
	return path + 5 + strlen(l->bucket) + 1; /* after gs://BUCKET/ */
}

/* Source side of one file: size check and an fd (DIR). */
static int cp_src_open(struct cp *cp, const fmt_file_entry *fe, const char *src,
		       int *fd)
{
	ckpt_reader *r = cp->r;
	uint64_t size = 0;
	int rc;

	*fd = -1;
	if (r->loc) {
		struct gcs_object o = { 0 };

		rc = gcs_stat(cp->gc, r->loc->bucket, cp_obj(r->loc, src), &o);
		size = o.size;
		gcs_object_clear(&o);
		if (rc < 0 && rc != -ENOENT)
			return eng_err(r->errmsg, eng_gcs_code(rc), "%s",
				       gcs_errmsg(cp->gc));
	} else {
		struct stat st;

		rc = eng_open(src, O_RDONLY, 0);
		if (rc >= 0) {
			*fd = rc;
			rc = fstat(*fd, &st) < 0 ? -errno : 0;
			size = (uint64_t)st.st_size;
		}
		if (rc < 0 && rc != -ENOENT)
			return eng_err(r->errmsg, rc, "%s: open: %s", src,
				       ckpt_strerror(rc));
	}
	if (rc == -ENOENT)
		return eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: missing",
			       r->dname, fe->name);
	if (size != fe->size)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: %llu bytes, the commit record says %llu",
			       r->dname, fe->name, (ull)size, (ull)fe->size);
	return 0;
}

/* Issues reads of f while it may hold more blocks; a DIR source reads at
 * once. */
static int cp_issue(struct cp *cp, struct cp_file *f)
{
	ckpt_reader *r = cp->r;
	uint64_t size = f->fe->size;
	int rc;

	while (f->issued < size && cp->nfree > 0 && f->held < cp->per) {
		struct cp_blk *b = cp->freel[--cp->nfree];

		b->f = f;
		f->held++;
		b->off = f->issued;
		b->len = (size_t)min_u64(CP_BLOCK, size - f->issued);
		b->got = 0;
		b->op = NULL;
		if (r->loc) {
			rc = gcs_start_read(cp->gc, r->loc->bucket,
					    cp_obj(r->loc, f->src), b->off,
					    b->len, b->buf, &b->got, &b->op);
		} else {
			rc = eng_pread_all(f->fd, b->buf, b->len, b->off);
			b->got = b->len;
		}
		if (rc < 0) {
			blk_put(cp, b);
			return eng_err(r->errmsg, eng_gcs_code(rc),
				       "%s offset %llu: read: %s", f->src,
				       (ull)b->off,
				       r->loc ? gcs_errmsg(cp->gc) :
						ckpt_strerror(rc));
		}
		f->fifo[(f->head + f->count++) % cp->per] = b;
		f->issued += b->len;
	}
	return 0;
}

static int cp_dst_open(struct cp *cp, const fmt_file_entry *fe,
		       struct cp_dst *d, int reuse)
{
	ckpt_reader *r = cp->r;
	eng_loc *l = cp->dst;
	char *dir;
	int rc;

	memset(d, 0, sizeof(*d));
	d->fd = -1;
	if (l->priv) {
		struct gcs_upload_opts o = { GCS_NO_COND, fe->size, 0, 0 };

		d->final = eng_path("%s%s/%s", l->prefix, r->dname, fe->name);
		if (!d->final)
			return eng_err(r->errmsg, -ENOMEM, "out of memory");
		if (reuse) {
			/* an earlier, interrupted copy may have sent it */
			struct gcs_object ob = { 0 };

			rc = gcs_stat(cp->gc, l->bucket, d->final, &ob);
			d->present = rc == 0 && ob.size == fe->size &&
				     ob.has_crc32c;
			d->want_crc = ob.crc32c;
			gcs_object_clear(&ob);
			if (d->present)
				return 0;
		}
		rc = gcs_upload_start(cp->gc, l->bucket, d->final, &o, &d->u);
		if (rc < 0)
			return eng_err(r->errmsg, eng_gcs_code(rc),
				       "gs://%s/%s: upload: %s", l->bucket,
				       d->final, gcs_errmsg(cp->gc));
		return 0;
	}
	dir = eng_path("%s/%s", l->dir, r->dname);
	d->tmp = dir ? eng_tmp_name(dir, fe->name) : NULL;
	d->final = dir ? eng_path("%s/%s", dir, fe->name) : NULL;
	free(dir);
	if (!d->tmp || !d->final)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	d->fd = eng_open(d->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (d->fd < 0)
		return eng_err(r->errmsg, d->fd, "%s: create: %s", d->tmp,
			       ckpt_strerror(d->fd));
	return 0;
}

/* A block of the file, in order: to the file or to the upload. */
static int cp_dst_put(struct cp *cp, struct cp_dst *d, struct cp_blk *b)
{
	int rc;

	if (d->present) {
		d->crc = gcs_crc32c(d->crc, b->buf, b->got);
		blk_put(cp, b);
		return 0;
	}
	if (d->u) {
		rc = gcs_upload_append(d->u, b->buf, b->got, cp_release, b);
		if (rc < 0)
			return eng_err(cp->r->errmsg, eng_gcs_code(rc),
				       "gs://%s/%s: upload: %s",
				       cp->dst->bucket, d->final,
				       gcs_errmsg(cp->gc));
		gcs_poll(cp->gc, 0);
		return 0;
	}
	rc = eng_pwrite_all(d->fd, b->buf, b->got, b->off);
	blk_put(cp, b);
	if (rc < 0)
		return eng_err(cp->r->errmsg, rc, "%s: write: %s", d->tmp,
			       ckpt_strerror(rc));
	/* start writeback now, so the fsync at the end has little left;
	 * a hint only (fsync decides), hence no error check */
	(void)sync_file_range(d->fd, (off_t)b->off, (off_t)b->got,
			      SYNC_FILE_RANGE_WRITE);
	return 0;
}

static int cp_upload_err(struct cp *cp, struct cp_dst *d, int rc)
{
	return eng_err(cp->r->errmsg, rc < 0 ? eng_gcs_code(rc) : -EIO,
		       "gs://%s/%s: upload: %s", cp->dst->bucket, d->final,
		       gcs_op_errmsg(gcs_upload_op(d->u)));
}

/* Makes the file final once its bytes were checked: rename, or the
 * upload's last piece (answered later: cp_dst_done). */
static int cp_dst_finish(struct cp *cp, struct cp_dst *d)
{
	ckpt_reader *r = cp->r;
	int rc;

	if (d->present)
		return d->crc == d->want_crc ? 0 : CP_REDO;
	if (d->u) {
		rc = gcs_upload_finish(d->u, NULL);
		return rc < 0 ? cp_upload_err(cp, d, rc) : 0;
	}
	rc = eng_fsync(d->fd);
	if (rc == 0) {
		rc = eng_close(d->fd);
		d->fd = -1;
	}
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s: %s", d->tmp,
			       ckpt_strerror(rc));
	rc = eng_rename(d->tmp, d->final);
	d->final_done = rc == 0;
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s: rename: %s", d->tmp,
			       ckpt_strerror(rc));
	return 0;
}

/* After cp_dst_finish: 1 when the destination has the file, 0 not yet. */
static int cp_dst_done(struct cp *cp, struct cp_dst *d)
{
	int rc;

	if (!d->u)
		return 1;
	if (!gcs_op_done(gcs_upload_op(d->u)))
		return 0;
	rc = gcs_op_wait(gcs_upload_op(d->u));
	return rc < 0 ? cp_upload_err(cp, d, rc) : 1;
}

static void cp_dst_close(struct cp *cp, struct cp_dst *d)
{
	(void)cp;
	if (d->fd >= 0)
		eng_close(d->fd);
	if (d->tmp && !d->final_done)
		eng_unlink(d->tmp);
	gcs_upload_free(d->u); /* unfinished: abandoned, blocks released */
	free(d->tmp);
	free(d->final);
}

/* Ends a pass over f: reads in flight dropped, blocks back. */
static void cp_file_close(struct cp *cp, struct cp_file *f)
{
	while (f->count > 0) {
		struct cp_blk *b = f->fifo[f->head];

		f->head = (f->head + 1) % cp->per;
		f->count--;
		gcs_op_free(b->op);
		b->op = NULL;
		blk_put(cp, b);
	}
	cp_dst_close(cp, &f->d);
	if (f->fd >= 0)
		eng_close(f->fd);
	XXH3_freeState(f->hs);
	free(f->src);
	free(f->fifo);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}

/* A pass over a file; reuse: an object already at the destination with
 * the same size and crc32c is kept (CP_REDO if it differs). */
static int cp_file_open(struct cp *cp, struct cp_file *f,
			const fmt_file_entry *fe, int reuse)
{
	ckpt_reader *r = cp->r;
	int rc;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->d.fd = -1;
	f->fe = fe;
	f->done0 = cp->done;
	f->src = eng_path("%s/%s", r->stepdir, fe->name);
	f->hs = XXH3_createState();
	f->fifo = calloc(cp->per, sizeof(*f->fifo));
	if (!f->src || !f->hs || !f->fifo)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	XXH3_64bits_reset(f->hs);
	rc = cp_src_open(cp, fe, f->src, &f->fd);
	return rc ? rc : cp_dst_open(cp, fe, &f->d, reuse);
}

/* Moves f on as far as it can without waiting: reads issued, blocks
 * that arrived (in file order) hashed and handed to the destination,
 * then the whole-file check and the finish. Sets *moved if anything
 * happened; f->done once the destination has the file. */
static int cp_file_step(struct cp *cp, struct cp_file *f, int *moved)
{
	ckpt_reader *r = cp->r;
	const fmt_file_entry *fe = f->fe;
	int rc = 0;

	if (!f->finishing && f->d.u && gcs_op_done(gcs_upload_op(f->d.u)))
		return cp_upload_err(cp, &f->d,
				     gcs_op_wait(gcs_upload_op(f->d.u)));
	while (!f->finishing && f->written < fe->size) {
		struct cp_blk *b;

		rc = cp_issue(cp, f);
		if (rc < 0 || f->count == 0)
			break;
		b = f->fifo[f->head];
		if (b->op) {
			if (!gcs_op_done(b->op))
				break;
			rc = gcs_op_wait(b->op);
			if (rc < 0)
				return eng_err(r->errmsg, eng_gcs_code(rc),
					       "%s/%s offset %llu: read: %s",
					       r->dname, fe->name, (ull)b->off,
					       gcs_op_errmsg(b->op));
			if (b->got < b->len)
				return eng_err(r->errmsg, CKPT_E_CORRUPT,
					       "%s/%s offset %llu: object ends "
					       "there (%llu bytes recorded)",
					       r->dname, fe->name,
					       (ull)(b->off + b->got),
					       (ull)fe->size);
			gcs_op_free(b->op);
			b->op = NULL;
		}
		f->head = (f->head + 1) % cp->per;
		f->count--;
		*moved = 1;
		XXH3_64bits_update(f->hs, b->buf, b->got);
		f->written += b->got;
		if (f->written == fe->size &&
		    XXH3_64bits_digest(f->hs) != fe->xxh3) {
			blk_put(cp, b);
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: whole-file checksum mismatch "
				       "while copying",
				       r->dname, fe->name);
		}
		rc = cp_dst_put(cp, &f->d, b);
		cp->done += b->got;
		if (rc == 0 && cp->fn && cp->fn(cp->arg, cp->done, cp->total))
			rc = eng_err(r->errmsg, CKPT_E_CANCELED,
				     "canceled by the progress callback");
		if (rc < 0)
			return rc;
	}
	if (rc < 0 || f->written < fe->size)
		return rc;
	if (!f->finishing) {
		if (fe->size == 0 && XXH3_64bits_digest(f->hs) != fe->xxh3)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: whole-file checksum mismatch "
				       "while copying",
				       r->dname, fe->name);
		rc = cp_dst_finish(cp, &f->d);
		if (rc)
			return rc;
		f->finishing = 1;
		*moved = 1;
	}
	rc = cp_dst_done(cp, &f->d);
	if (rc == 1) {
		f->done = 1;
		*moved = 1;
		rc = 0;
	}
	return rc;
}

/* Every file of the step, k at once (each with cp->per blocks), over the
 * one client loop; the first error ends the copy. */
static int cp_files(struct cp *cp, size_t k)
{
	ckpt_reader *r = cp->r;
	struct cp_file *fs = calloc(k, sizeof(*fs));
	size_t next = 0, nact = 0, i;
	int rc = 0;

	if (!fs)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	for (i = 0; i < k; i++)
		fs[i].fd = fs[i].d.fd = -1;
	while (rc == 0 && (nact > 0 || next < r->cm.nfiles)) {
		int moved = 0;

		for (i = 0; i < k && rc == 0; i++) {
			struct cp_file *f = &fs[i];

			if (!f->fe && next < r->cm.nfiles) {
				nact++;
				moved = 1;
				rc = cp_file_open(cp, f, &r->cm.files[next++],
						  1);
			}
			if (!f->fe || rc < 0)
				continue;
			rc = cp_file_step(cp, f, &moved);
			if (rc == CP_REDO) {
				const fmt_file_entry *fe = f->fe;

				cp->done = f->done0;
				cp_file_close(cp, f);
				rc = cp_file_open(cp, f, fe, 0);
				moved = 1;
			} else if (rc == 0 && f->done) {
				cp_file_close(cp, f);
				nact--;
			}
		}
		if (rc == 0 && !moved && cp->gc)
			gcs_poll(cp->gc, 50);
	}
	for (i = 0; i < k; i++)
		if (fs[i].fe || fs[i].src || fs[i].hs)
			cp_file_close(cp, &fs[i]);
	free(fs);
	return rc;
}

/* COMMIT as the reader saw it, then create-only at the destination. */
static int cp_commit(struct cp *cp)
{
	ckpt_reader *r = cp->r;
	char err[ENG_ERRMSG_MAX], *key;
	uint8_t *cbuf = NULL;
	size_t clen = 0;
	int rc;

	rc = rd_get_doc(r, FMT_COMMIT_NAME, r->commit_size, &cbuf, &clen, err);
	if (rc < 0 || clen != r->commit_size ||
	    fmt_xxh3(cbuf, clen) != r->commit_xxh3) {
		free(cbuf);
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: changed since the reader opened it",
			       r->dname, FMT_COMMIT_NAME);
	}
	key = eng_path("%s/" FMT_COMMIT_NAME, r->dname);
	rc = key ? cp->dst->be->create(cp->dst, key, cbuf, clen, err) :
		   eng_err(err, -ENOMEM, "out of memory");
	free(key);
	free(cbuf);
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s", err);
	cp->done += clen;
	rc = eng_advance_latest(cp->dst, r->step, err);
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s", err);
	return 0;
}

/* DIR destination: the step directory exists, durably. */
static int cp_mkdirs(struct cp *cp, const char *dst_root)
{
	ckpt_reader *r = cp->r;
	char *dstdir;
	int rc;

	if (cp->dst->priv)
		return 0; /* objects need no directories */
	dstdir = eng_path("%s/%s", dst_root, r->dname);
	if (!dstdir)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	rc = eng_mkdir(dstdir, 0755);
	if (rc < 0)
		eng_err(r->errmsg, rc, "%s: mkdir: %s", dstdir,
			ckpt_strerror(rc));
	else if ((rc = eng_fsync_dir(dst_root)) < 0)
		eng_err(r->errmsg, rc, "%s: fsync: %s", dst_root,
			ckpt_strerror(rc));
	free(dstdir);
	return rc;
}

/*
 * Version 2 (SPEC.md section 16): the copy of a step that refers to older
 * steps is copied as is, so it refers correctly only where every file it
 * refers to is committed with the same size and hash: a directory or a
 * bucket prefix that already holds those steps (copy them first, oldest
 * first; their retention and gc there keep them while the copy refers to
 * them). Elsewhere the copy is refused before anything is written.
 */
static int cp_check_refs(ckpt_reader *r, const char *dst_root)
{
	for (size_t i = r->nlisted; i < r->nfiles; i++) {
		const struct rd_file *f = &r->files[i];
		char err[ENG_ERRMSG_MAX];
		const fmt_file_entry *fe;
		fmt_commit cm;
		int found = 0,
		    rc = eng_load_commit(dst_root, f->ref_step, &cm, err);

		if (rc == 0) {
			fe = fmt_commit_find(&cm, f->name);
			found = fe && fe->size == f->size && fe->xxh3 == f->xxh3;
			fmt_commit_free(&cm);
		} else if (rc != CKPT_E_NOTFOUND) {
			/* not "absent": unreachable, corrupt, denied */
			return eng_err(r->errmsg, rc,
				       "step %llu refers to step %llu/%s: %s",
				       (ull)r->step, (ull)f->ref_step, f->name,
				       err);
		}
		if (!found)
			return eng_err(r->errmsg, CKPT_E_NOTFOUND,
				       "step %llu refers to step %llu/%s, "
				       "which %s does not hold: copy step %llu "
				       "there first",
				       (ull)r->step, (ull)f->ref_step, f->name,
				       dst_root, (ull)f->ref_step);
	}
	return 0;
}

CKPT_API int ckpt_reader_copy(ckpt_reader *r, const char *dst_root,
			      ckpt_progress_fn fn, void *arg)
{
	struct cp *cp = NULL;
	char err[ENG_ERRMSG_MAX];
	int rc, created = 0;
	size_t k = 1;
	fmt_commit tmpcm;

	if (!r)
		return eng_err(NULL, -EINVAL,
			       "ckpt_reader_copy: reader is NULL");
	rc = rd_check_process(r, "ckpt_reader_copy");
	if (rc < 0)
		return rc;
	if (!dst_root)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_reader_copy: dst_root is NULL");
	rc = cp_check_refs(r, dst_root);
	if (rc < 0)
		return rc;
	if (strncmp(dst_root, "gs://", 5)) {
		rc = eng_mkdir(dst_root, 0755);
		if (rc < 0)
			return eng_err(r->errmsg, rc, "%s: mkdir: %s", dst_root,
				       ckpt_strerror(rc));
	}
	rc = eng_load_commit(dst_root, r->step, &tmpcm, NULL);
	if (rc == 0) {
		fmt_commit_free(&tmpcm);
		return eng_err(r->errmsg, CKPT_E_EXISTS,
			       "%s: step %llu is already committed there",
			       dst_root, (ull)r->step);
	}

	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	cp->r = r;
	cp->fn = fn;
	cp->arg = arg;
	rc = eng_loc_open(dst_root, &cp->dst, err);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	cp->gc = r->loc ? r->loc->priv : cp->dst->priv;
	/* to gs://: every file at once, up to the parallel streams */
	if (cp->dst->priv)
		k = min_u64(eng_gcs_streams(), r->cm.nfiles);
	if (k < 1)
		k = 1;
	cp->nblk = k > 1 ? k * CP_PER_FILE : CP_NBLK;
	cp->per = cp->nblk / k;
	cp->blk = calloc(cp->nblk, sizeof(*cp->blk));
	cp->freel = calloc(cp->nblk, sizeof(*cp->freel));
	if (!cp->blk || !cp->freel) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < cp->nblk; i++) {
		cp->blk[i].cp = cp;
		cp->blk[i].buf = malloc(CP_BLOCK);
		if (!cp->blk[i].buf) {
			rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
			goto out;
		}
		cp->freel[cp->nfree++] = &cp->blk[i];
	}
	rc = cp_mkdirs(cp, dst_root);
	if (rc < 0)
		goto out;
	created = 1;
	cp->total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		cp->total += r->cm.files[i].size;
	rc = cp_files(cp, k);
	if (rc == 0) {
		rc = cp->dst->be->sync(cp->dst, r->dname, err);
		if (rc < 0)
			rc = eng_err(r->errmsg, rc, "%s", err);
	}
	if (rc == 0) {
		rc = cp_commit(cp);
		/* committed (or another copy won): never remove it now */
		if (rc == 0 || rc == CKPT_E_EXISTS)
			created = 0;
	}
	if (rc == 0 && fn && fn(arg, cp->done, cp->total) != 0)
		rc = 0; /* too late to cancel: the copy is committed */
	if (rc == 0)
		r->errmsg[0] = 0;
out:
	if (rc < 0)
		rd_locate(r); /* a gs:// source's object named whole */
	if (rc < 0 && created) {
		char saved[ENG_ERRMSG_MAX], *pre = eng_path("%s/", r->dname);

		memcpy(saved, r->errmsg, sizeof(saved));
		if (pre)
			cp->dst->be->remove_all(cp->dst, pre, NULL, NULL);
		free(pre);
		eng_err(r->errmsg, rc, "%s", saved);
	}
	if (cp) {
		for (size_t i = 0; cp->blk && i < cp->nblk; i++)
			free(cp->blk[i].buf);
		free(cp->blk);
		free(cp->freel);
		eng_loc_close(cp->dst);
		free(cp);
	}
	return rc;
}
