/*
 * dedup.c - unchanged chunks are neither rewritten nor re-uploaded
 * (SPEC.md section 16, format version 2).
 *
 * Design note. Granularity is the chunk. When the layout of a host's
 * stream does not change between saves (same tensors in the same order:
 * fine-tuning), a frozen tensor's chunks have the same stream offset,
 * raw_len and raw bytes as in the previous step. A deduplicating save
 * compares each new chunk with the chunk of the same index in its *base*,
 * the newest committed step of the root older than the one being saved
 * (read from disk when the save starts, so a restart dedups against what
 * the previous process committed):
 *
 *   caller (save.c)  eng_dedup_begin: base = newest committed step's
 *                    index of this host, if it is version 2
 *   worker (encode)  eng_dedup_match: XXH3-64 (already computed) and the
 *                    seeded XXH3-128 of the raw bytes against the base's
 *                    chunk k; both equal (and offset, raw_len): the chunk
 *                    is marked `reuse` and skips the codec
 *   writer           eng_dedup_ref: the index entry of a reused chunk is
 *                    the base's (its file turned into a ref; a base
 *                    chunk that is itself a ref stays a ref to the same
 *                    file: no chains); the buffer goes to no sink, so it
 *                    is neither written nor uploaded
 *
 * Safety. Only a save whose every destination holds the base may refer to
 * it. A plain directory holds it. A directory with a remote (settings.
 * remote: the upload sink, sinks[1]) refers to it only if the upload sink
 * of this handle committed that very step in the bucket (it records the
 * newest it committed, sink_gcs_bg.c): the bucket's copy of the new step
 * then refers to bytes that are committed there too, and its commit
 * checks them again (commit.c). After a restart, the upload thread asks
 * the bucket once whether it committed the directory's newest step, the
 * same (up_probe_remote), and records it likewise. Otherwise (the base's
 * upload failed or is still running, or the answer has not come) the save
 * is written in full, in both places. A save the planner sends straight
 * to the bucket, and a handle with any other secondary sink, write in
 * full; a gs:// root: below. Retention and gc keep every step a kept step refers
 * to (gc.c), in the directory and in the bucket. A base that cannot be
 * read, is version 1 or has another chunk size or host layout simply
 * means no dedup for this save.
 *
 * A gs:// root. Reading the base from the bucket would put round trips
 * into ckpt_save()'s stall, so the handle keeps the index of the step it
 * committed last (eng_dedup_committed, one host, automatic commit) and a
 * save refers to that step; the first save after ckpt_open, and any save
 * after a failed one, is written in full. The bucket holds that step
 * (this handle committed it there); if someone removed it since, the
 * commit's check of the refs fails the save, naming the step (commit.c).
 *
 * Uses root.c and io.c (reading the base) and format/; called by save.c,
 * encode.c and writer.c, which never call each other.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "save_internal.h"

int eng_dedup_enabled(const struct ckpt *c)
{
	return c->dedup &&
	       (c->nsinks == 1 ||
		(c->nsinks == 2 && c->upsink && c->sinks[1] == c->upsink));
}

void eng_dedup_committed(struct ckpt *c, const uint8_t *buf, size_t len)
{
	fmt_index *ix = calloc(1, sizeof(*ix)), *old;

	if (ix && fmt_index_decode(buf, len, ix, NULL, 0) < 0) {
		free(ix);
		ix = NULL;
	}
	pthread_mutex_lock(&c->mu);
	old = c->last_ix;
	c->last_ix = ix;
	pthread_mutex_unlock(&c->mu);
	if (old)
		fmt_index_free(old);
	free(old);
}

void eng_dedup_forget(struct ckpt *c)
{
	if (c->last_ix)
		fmt_index_free(c->last_ix);
	free(c->last_ix);
	c->last_ix = NULL;
}

/* A gs:// root: the kept index of the last committed step, taken (a
 * failed save leaves none; the writer keeps the next one). */
static fmt_index *take_last(struct ckpt *c, uint64_t step)
{
	fmt_index *ix;

	pthread_mutex_lock(&c->mu);
	ix = c->last_ix;
	if (ix && ix->step < step)
		c->last_ix = NULL;
	else
		ix = NULL;
	pthread_mutex_unlock(&c->mu);
	return ix;
}

/* A directory with a remote: the base is committed in the bucket by this
 * handle's upload sink. (If this save's upload is dropped, the background
 * upload sends the same files from the directory later: they refer to the
 * same committed base.) */
static int remote_holds(struct ckpt *c, uint64_t base)
{
	return c->nsinks == 1 || atomic_load(&c->remote_committed) == base + 1;
}

/* The index of this host in the newest committed step below `step`. */
static int load_base(struct ckpt *c, uint64_t step, fmt_index *ix)
{
	char err[ENG_ERRMSG_MAX], iname[32], dname[32];
	const fmt_file_entry *ie;
	fmt_commit cm;
	uint8_t *buf = NULL;
	size_t len = 0;
	uint64_t p;
	int r;

	r = eng_resolve_latest(c->root, &p, err);
	if (r < 0 || p >= step)
		return -ENOENT;
	r = eng_load_commit(c->root, p, &cm, err);
	if (r < 0)
		return r;
	fmt_index_name(c->s.host_index, iname);
	ie = fmt_commit_find(&cm, iname);
	r = -ENOENT;
	fmt_step_dirname(p, dname);
	if (ie && cm.host_count == c->s.host_count)
		r = eng_get_doc(c->root, dname, iname, ie->size, &buf, &len,
				err);
	if (r == 0 && (len != ie->size || fmt_xxh3(buf, len) != ie->xxh3))
		r = CKPT_E_CORRUPT;
	if (r == 0)
		r = fmt_index_decode(buf, len, ix, err, sizeof(err));
	free(buf);
	fmt_commit_free(&cm);
	if (r == 0 && (ix->version < FMT_VERSION_DEDUP || ix->step != p ||
		       ix->host_index != c->s.host_index)) {
		fmt_index_free(ix);
		r = -ENOENT;
	}
	return r;
}

/* Every file the base holds or refers to is there with its size: a base
 * whose bytes are (partly) gone would make this save uncommittable. */
static int base_intact(const struct ckpt *c, const fmt_index *ix)
{
	for (size_t i = 0; i < ix->nfiles + ix->nrefs; i++) {
		int own = i < ix->nfiles;
		const char *name = own ? ix->files[i].name :
					 ix->refs[i - ix->nfiles].name;
		uint64_t size = own ? ix->files[i].size :
				      ix->refs[i - ix->nfiles].size;
		char dname[32], *p;
		struct stat st;
		int ok;

		fmt_step_dirname(own ? ix->step : ix->refs[i - ix->nfiles].step,
				 dname);
		p = eng_path("%s/%s/%s", c->root, dname, name);
		ok = p && stat(p, &st) == 0 && (uint64_t)st.st_size == size;
		free(p);
		if (!ok)
			return 0;
	}
	return 1;
}

void eng_dedup_begin(struct ckpt *c, eng_job *job)
{
	fmt_index *ix;

	if (!eng_dedup_enabled(c) || job->to_remote)
		return;
	job->version = FMT_VERSION_DEDUP;
	if (c->remote_only) {
		ix = take_last(c, job->step);
		if (ix && (ix->chunk_bytes != job->chunk_bytes ||
			   ix->host_index != c->s.host_index ||
			   ix->nfiles + ix->nrefs > FMT_MAX_REFS)) {
			fmt_index_free(ix);
			free(ix);
			ix = NULL;
		}
		job->base = ix;
		return;
	}
	ix = calloc(1, sizeof(*ix));
	if (!ix)
		return;
	/* a base with too many files could give this step more refs than
	 * an index may hold: then this save is written in full (and the
	 * next one starts a fresh chain) */
	if (load_base(c, job->step, ix) < 0 ||
	    ix->chunk_bytes != job->chunk_bytes ||
	    ix->nfiles + ix->nrefs > FMT_MAX_REFS ||
	    !remote_holds(c, ix->step) || !base_intact(c, ix)) {
		fmt_index_free(ix);
		free(ix);
		return;
	}
	job->base = ix;
}

void eng_dedup_end(eng_job *job)
{
	if (job->base)
		fmt_index_free(job->base);
	free(job->base);
	job->base = NULL;
	free(job->refs);
	job->refs = NULL;
	free(job->ref_of);
	job->ref_of = NULL;
}

int eng_dedup_match(const eng_job *job, eng_buf *b, const uint8_t *raw)
{
	const fmt_chunk_entry *bc;

	b->reuse = 0;
	if (job->version < FMT_VERSION_DEDUP) {
		b->raw_xxh3 = fmt_xxh3(raw, b->raw_len);
		return 0;
	}
	b->raw_xxh3 = fmt_xxh3_pair(raw, b->raw_len, b->h128);
	if (!job->base || b->k >= job->base->nchunks)
		return 0;
	bc = &job->base->chunks[b->k];
	b->reuse = bc->stream_offset == b->k * job->chunk_bytes &&
		   bc->raw_len == b->raw_len && bc->raw_xxh3 == b->raw_xxh3 &&
		   bc->h128[0] == b->h128[0] && bc->h128[1] == b->h128[1];
	return b->reuse;
}

int eng_dedup_ref(eng_job *job, uint64_t k, fmt_chunk_entry *ce)
{
	const fmt_index *bx = job->base;
	const fmt_chunk_entry *bc = &bx->chunks[k];
	size_t nb = bx->nfiles + bx->nrefs;
	uint32_t j;

	if (!job->ref_of) {
		job->ref_of = malloc(nb * sizeof(*job->ref_of));
		job->refs = calloc(nb, sizeof(*job->refs));
		if (!job->ref_of || !job->refs) {
			/* the next reused chunk tries again: leave nothing
			 * half-allocated for it to overwrite */
			free(job->ref_of);
			free(job->refs);
			job->ref_of = NULL;
			job->refs = NULL;
			return -ENOMEM;
		}
		memset(job->ref_of, 0xff, nb * sizeof(*job->ref_of));
	}
	if (bc->file >= nb)
		return CKPT_E_CORRUPT; /* fmt_index_decode rules it out */
	j = job->ref_of[bc->file];
	if (j == UINT32_MAX) {
		fmt_ref_entry *re = &job->refs[job->nrefs];

		if (bc->file < bx->nfiles) {
			const fmt_file_entry *fe = &bx->files[bc->file];

			re->step = bx->step;
			memcpy(re->name, fe->name, sizeof(re->name));
			re->size = fe->size;
			re->xxh3 = fe->xxh3;
			re->file = bc->file;
		} else { /* copying a ref copies its target */
			*re = bx->refs[bc->file - bx->nfiles];
		}
		j = job->ref_of[bc->file] = (uint32_t)job->nrefs++;
	}
	*ce = *bc;
	ce->file = job->nfiles + j;
	return 0;
}
