/*
 * backend.h - where a checkpoint root lives: a storage backend and a
 * location on it. Not installed, not API.
 *
 * Design note. Commit, list, latest, retention, gc and the reader's open
 * path need a handful of operations that a POSIX directory and an object
 * store (Cloud Storage) can both provide; they are written once against
 * this table. Names are keys relative to the location, with '/' between
 * levels ("step-00000000000000000042/COMMIT", "latest"); a "prefix" is a
 * key ending in '/' or "" for the location itself.
 *
 *   caller (commit.c, root.c, gc.c, reader)
 *       |  eng_loc_open("DIR" | "gs://BUCKET/PREFIX")
 *       v
 *   eng_backend vtable --> backend_posix.c --> eng_io table (faults) --> OS
 *                      \-> backend_gcs.c --> gcs/ client --> JSON API
 *
 * Operations and their object-store meaning:
 *   list        names directly under a prefix (objects and sub-prefixes,
 *               i.e. delimiter '/'); one callback per entry, in no promised
 *               order, so a store can page (maxResults, pageToken) without
 *               the caller holding a page; the callback may stop the walk.
 *   get         a small object whole (documents; bounded by max_len).
 *   read_range  bytes [off, off+n) of a large object (Range: GET).
 *   create      a new object only if none exists under that name, atomic
 *               (ifGenerationMatch=0); CKPT_E_EXISTS otherwise. Used for
 *               COMMIT: two committers of one step get exactly one winner.
 *   replace     a small pointer object (`latest`), atomically.
 *   append      bytes at the end of a small object (a journal), creating
 *               it, atomically against other appenders: objects read the
 *               object, write it back under the generation read
 *               (ifGenerationMatch, 0 if absent), and again from the read
 *               when another writer got there first. NULL for POSIX,
 *               whose files take O_APPEND (events.c).
 *   remove      one object; -ENOENT if absent.
 *   sync        make earlier removals and creations under a prefix durable
 *               before what follows (POSIX: fsync the directory; objects: a
 *               no-op, every call is durable when it returns).
 *   remove_all  everything under a prefix (a step's debris).
 *   lock        serialize writers of `latest` with gc of temporaries in
 *               one root (POSIX: flock; objects: none, `latest` is
 *               replaced under a generation precondition).
 *   sink_new    the save pipeline's destination of shard data for this
 *               backend (POSIX: io_uring/O_DIRECT shard files, writer.c;
 *               objects: resumable uploads fed by the same chunk buffers).
 *
 * Durability per location:
 *   POSIX: data is written to a temporary file named NAME.<pid>-<rand>.tmp
 *          in the same directory, fsynced, renamed into place (create:
 *          renameat2 RENAME_NOREPLACE, else link + unlink), then the
 *          directory is fsynced; an operation returns when that is done.
 *   objects: a create/replace/delete is durable when the call returns; no
 *          temporaries, no directory sync.
 * All functions return 0, -errno or CKPT_E_*; messages go to errbuf (may be
 * NULL), naming the key.
 */
#ifndef CKPT_ENGINE_BACKEND_H
#define CKPT_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct ckpt;
struct eng_sink;
typedef struct eng_loc eng_loc;

typedef struct eng_list_ent {
	const char *name; /* relative to the listed prefix, no '/' */
	int is_prefix;    /* a sub-prefix (POSIX: a directory) */
	uint64_t size;    /* objects only, if ENG_LIST_SIZES was asked */
} eng_list_ent;

/* Returns 0 to go on, anything else stops the walk (list returns it). */
typedef int (*eng_list_fn)(void *arg, const eng_list_ent *e);

#define ENG_LIST_SIZES 1u /* fill eng_list_ent.size (POSIX: one stat) */

typedef struct eng_backend {
	const char *name;
	int (*list)(eng_loc *l, const char *prefix, unsigned flags,
		    eng_list_fn fn, void *arg, char *errbuf);
	/* Size of an object; -ENOENT if absent. */
	int (*size)(eng_loc *l, const char *key, uint64_t *size);
	/* Optional: what the last failed size() met (the server's reply),
	 * for messages; NULL: the error code says it all. */
	const char *(*why)(eng_loc *l);
	int (*get)(eng_loc *l, const char *key, uint64_t max_len, uint8_t **out,
		   size_t *out_len, char *errbuf);
	int (*read_range)(eng_loc *l, const char *key, uint64_t off, void *buf,
			  size_t n, char *errbuf);
	int (*create)(eng_loc *l, const char *key, const void *buf, size_t len,
		      char *errbuf);
	int (*replace)(eng_loc *l, const char *key, const void *buf, size_t len,
		       char *errbuf);
	int (*append)(eng_loc *l, const char *key, const void *buf,
		      size_t len, uint64_t max_len, char *errbuf);
	int (*remove)(eng_loc *l, const char *key, char *errbuf);
	int (*sync)(eng_loc *l, const char *prefix, char *errbuf);
	int (*remove_all)(eng_loc *l, const char *prefix, uint64_t *bytes,
			  char *errbuf);
	int (*lock)(eng_loc *l); /* token for unlock */
	void (*unlock)(eng_loc *l, int token);
	int (*sink_new)(struct ckpt *c, struct eng_sink **out);
} eng_backend;

struct eng_loc {
	const eng_backend *be;
	char *where;  /* as given, for messages */
	char *dir;    /* POSIX: the root directory */
	char *bucket; /* objects: bucket and prefix ("" or ending in '/') */
	char *prefix;
	void *priv; /* the backend's own state (gcs: its client) */
};

/* Kinds of location eng_loc_parse() recognizes. */
enum { ENG_LOC_POSIX = 1, ENG_LOC_GCS = 2 };

/*
 * Splits "gs://BUCKET[/PREFIX]" into malloc'd bucket and prefix (prefix ""
 * or ending in '/'); anything without a scheme is a POSIX directory. Other
 * schemes: -EPROTONOSUPPORT. Returns the kind or a negative code.
 */
int eng_loc_parse(const char *where, char **bucket, char **prefix,
		  char *errbuf);
/* A location handle: POSIX for a directory, Cloud Storage (one gcs
 * client per handle, backend_gcs.c) for gs://BUCKET/PREFIX. */
int eng_loc_open(const char *where, eng_loc **out, char *errbuf);
void eng_loc_close(eng_loc *l);
/* 0 if a backend serves `where`, else eng_loc_open's code and message
 * (in the calling thread's last message). */
int eng_loc_check(const char *where);

extern const eng_backend eng_backend_posix;
extern const eng_backend eng_backend_gcs;

/* backend_gcs.c: attach a client to a parsed gs:// location (sets be and
 * priv) and release it; the client's codes as engine codes (412
 * CKPT_E_EXISTS, bad crc32c CKPT_E_CORRUPT, other library codes -EIO);
 * parallel streams (CKPT_GCS_STREAMS, default 8). */
struct gcs_client;
int eng_gcs_loc_init(eng_loc *l, char *errbuf);
void eng_gcs_loc_fini(eng_loc *l);
int eng_gcs_code(int r);
unsigned eng_gcs_streams(void);
int eng_gcs_client_new(struct gcs_client **out, const char *where,
		       char *errbuf);

/* A unique temporary name for `name` in its directory (POSIX backend and
 * reader copies): NAME.<pid>-<random>.tmp. malloc'd, NULL on ENOMEM. */
char *eng_tmp_name(const char *dir, const char *name);

/*
 * Moves root's `latest` pointer to `step` unless a newer committed step
 * exists (committing or copying an old step late must not hide a newer
 * one), under the location's lock. Shared by commit and ckpt_reader_copy.
 */
int eng_advance_latest(eng_loc *l, uint64_t step, char *errbuf);

#endif /* CKPT_ENGINE_BACKEND_H */
