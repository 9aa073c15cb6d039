/*
 * sink_gcs.h - what the upload sink's files share (sink_gcs.c: the
 * writer's and the handle's side; sink_gcs_up.c: the upload thread and
 * the live step; sink_gcs_bg.c: steps in the background, journal, commit).
 * Not API.
 *
 * Locking: `mu` guards what the writer and the upload thread exchange
 * (queue, fifo, flags, status); up_step and up_file belong to the upload
 * thread once the writer has queued the step (begin) and are touched by
 * nothing else. Lock order: mu before the handle's c->mu.
 */
#ifndef CKPT_ENGINE_SINK_GCS_H
#define CKPT_ENGINE_SINK_GCS_H

#include "save_internal.h"

#include <xxhash.h>

enum { ST_LIVE, ST_BACKGROUND, ST_DONE, ST_FAILED };
enum { FM_LIVE, FM_FILE }; /* where a file's next bytes come from */
enum { CMD_NONE, CMD_CHECK, CMD_FINISH, CMD_PUBLISH };

typedef struct up_file {
	char name[64];
	char *object;
	uint64_t size;
	uint64_t appended; /* bytes given to u */
	struct gcs_upload *u;
	char *session;
	uint64_t confirmed;
	uint32_t crc;  /* of [0, appended), kept when resumed */
	int resumed;   /* reattached: the client lacks the crc of the prefix */
	uint64_t xxh3; /* the local index's hash of the whole file */
	XXH3_state_t *xs; /* of [0, appended) when reading the file */
	uint8_t *bounce;  /* live: small chunks copied (live_append) */
	size_t blen;
	int mode;            /* FM_*: staged buffers, or the local file */
	uint64_t mark;       /* FM_FILE: the local file has [0, mark) */
	uint64_t staged_end; /* end of the last staged buffer appended */
	int finishing;       /* gcs_upload_finish was called */
	int resuming;        /* file_start done, file_resumed not yet */
	int fd;
	int direct; /* fd has O_DIRECT (up_file_open); dropped for a tail */
	int done;
} up_file;

typedef struct up_step {
	uint64_t step;
	uint32_t nfiles;
	up_file *f;
	int state;
	int index_done;
	char *error; /* journaled once the step failed */
	int dropped; /* live: uploads given up, resumed from the files */
	int stopped; /* live: no more chunks (lag): the rest from the files */
	struct up_step *next;
} up_step;

typedef struct up_item {
	const uint8_t *p;
	size_t len;
	uint32_t file;
	eng_buf *b; /* NULL: a shard header (job memory) */
} up_item;

typedef struct up_rel {
	struct gcs_sink *s;
	eng_buf *b;
	int inuse; /* b is in an upload's segments */
	int post;  /* the save ended: b goes back to the pool, not the sink */
} up_rel;

typedef struct gcs_sink {
	eng_sink base;
	char *remote, *bucket, *prefix;
	struct gcs_client *gc; /* the upload thread's */
	pthread_t thr;
	int thr_started;
	int hold_fd; /* DIR/.upload locked while open (journal.c) */
	uint32_t host, hosts;
	size_t piece;    /* resumable piece (gcs client chunk_bytes) */
	size_t min_span; /* smaller chunks are copied (live_append) */

	pthread_mutex_t mu;
	pthread_cond_t cv; /* writer: handover done; ckpt_upload_wait */
	/* writer -> upload thread (under mu) */
	up_item *q;
	unsigned qcap, qhead, qn;
	up_rel *rel; /* one per pool buffer */
	/* live, FM_FILE: chunks held until the local file has them (put()
	 * adds, the upload thread drains; under mu), and per file the
	 * offset from which its chunks come that way (UINT64_MAX: none) */
	eng_buf **fifo;
	unsigned fhead, fn;
	uint64_t *from_file;
	unsigned switch_at; /* held buffers at which a file goes FM_FILE */
	unsigned fcap;
	atomic_uint npost; /* staged buffers held past their save (post) */
	int handover, detach, stop, reclaim;
	eng_job *ho_job; /* handover: valid until acknowledged */
	int ho_keep;
	/* gs:// alone (sink 0): the writer's finish and publish, run by the
	 * upload thread while the writer waits (under mu) */
	int direct;
	int cmd; /* CMD_* pending, 0 when done */
	const uint8_t *cmd_buf;
	size_t cmd_len;
	int cmd_rc;
	char cmd_msg[ENG_ERRMSG_MAX];
	/* sink_gcs_bg.c: pieces read from local files, kept for the next
	 * (rp_mu; emptied when no step is left in the background) */
	pthread_mutex_t rp_mu;
	struct read_piece *rp_free;
	unsigned rp_nfree;
	up_step *live; /* step being saved */
	eng_job *live_job;
	up_step *steps; /* background, oldest first */
	/* status (under mu) */
	ckpt_upload_status st;
	unsigned pending;
	int probing; /* up_probe_remote not done yet (ckpt_upload_wait) */
	/* the client of up_side_open's location while it is open: destroy
	 * cancels it, as it cancels gc */
	struct gcs_client *side_gc;
	char err[ENG_ERRMSG_MAX];
	int unreported; /* a step failed and no save has said so yet */
	int told;       /* writer: this save named one already */
} gcs_sink;

/* sink_gcs_bg.c */
void up_step_free(up_step *u);
/* PREFIX/step-N/name (malloc'd) */
char *up_object_name(gcs_sink *s, uint64_t step, const char *name);
up_step *up_step_new(gcs_sink *s, uint64_t step, uint32_t nfiles);
int up_step_name_file(gcs_sink *s, up_step *u, uint32_t i, const char *name,
		      uint64_t size);
/* The step's state to DIR/.upload (a failure fails the step). */
int up_journal_save(gcs_sink *s, up_step *u);
void up_set_status(gcs_sink *s, up_step *u, int state);
void up_step_failed(gcs_sink *s, up_step *u, int r, const char *msg);
/* Appends f's local file up to lim; finishes once it is all in. */
int up_file_feed(gcs_sink *s, up_file *f, uint64_t lim, char *err);
/* Opens a local shard file for reading, with O_DIRECT where the file
 * system takes it (f->fd, f->direct). */
int up_file_open(up_file *f, const char *path);
/* Frees the pieces kept for reuse (the upload thread once idle, destroy). */
void up_pieces_trim(gcs_sink *s);
/* The host index object: doc, or the local file when doc is NULL. */
int up_put_index(gcs_sink *s, up_step *u, const uint8_t *doc, size_t doc_len,
		 char *err);
/* One turn over a background step. */
void up_step_run(gcs_sink *s, up_step *u);
/* Steps journaled by an earlier process for this remote. */
void up_load_journals(gcs_sink *s);
/*
 * The remote as a gs:// backend location for the upload thread's own
 * requests (the restart probe, the bucket commit), on a client of its own
 * that ckpt_close cancels (gs_destroy) rather than wait out a silent
 * bucket's deadline. -ECANCELED once the handle is closing. Closed with
 * up_side_close.
 */
int up_side_open(gcs_sink *s, eng_loc **l, char *err);
void up_side_close(gcs_sink *s, eng_loc *l);
/* After a restart: is the directory's newest step committed in the bucket
 * (for deduplicating saves, dedup.c)? Upload thread, once, first. */
void up_probe_remote(gcs_sink *s);

/* sink_gcs_up.c: the upload thread (arg: the sink) */
void *up_main(void *arg);

#endif /* CKPT_ENGINE_SINK_GCS_H */
