/* journal.h - the upload journal (journal.c). Not API. */
#ifndef CKPT_ENGINE_JOURNAL_H
#define CKPT_ENGINE_JOURNAL_H

#include "internal.h"

typedef struct eng_jfile {
	char name[64];      /* local shard file name (object: step-N/name) */
	uint64_t size;      /* UINT64_MAX: not known yet (local index) */
	char *session;      /* resumable session URI, NULL before one */
	uint64_t confirmed; /* bytes the server had at the last write */
	int done;
	uint64_t xxh3; /* not journaled: the local index's (sink_gcs_bg.c) */
} eng_jfile;

typedef struct eng_journal {
	uint64_t step;
	char *remote;
	uint32_t host, hosts;
	int index_done;
	uint32_t nfiles;
	eng_jfile *files;
	char *error; /* why the last attempt failed; NULL: it did not */
} eng_journal;

/* Replaces ROOT/.upload/step-N.journal atomically and durably. */
int eng_journal_write(const char *root, const eng_journal *j, char *errbuf);
int eng_journal_read(const char *root, uint64_t step, eng_journal *j,
		     char *errbuf);
void eng_journal_free(eng_journal *j);
/* Removes the journal of step (0 if there is none). */
int eng_journal_remove(const char *root, uint64_t step);
/* 1 if step has a journal (its upload is unfinished). */
int eng_journal_pending(const char *root, uint64_t step);
/* Steps with a journal, ascending (malloc'd). */
int eng_journal_list(const char *root, uint64_t **steps, size_t *n);
/* A process uploading from ROOT holds ROOT/.upload locked (shared) while
 * its handle is open: eng_journal_hold returns the fd (close releases),
 * eng_journal_held says whether one does (1) or not (0). */
int eng_journal_hold(const char *root);
int eng_journal_held(const char *root);

#endif
