/*
 * upload_list.c - ckpt_upload_list(): which steps of a directory are not
 * yet in its remote location, for `ckptctl ls`.
 *
 * Design note. Read-only and handle-free: the upload journals under
 * DIR/.upload (journal.c) say what is unfinished, how many bytes the
 * server had confirmed when last written, and why the last attempt
 * failed; whether a process is uploading now is the lock an open handle
 * with a remote holds on DIR/.upload (eng_journal_held). Nothing here
 * talks to the bucket: the answer is as fresh as the journals.
 *
 *   DIR/.upload/step-N.journal --eng_journal_read--> ckpt_upload_step
 *   DIR/.upload (flock held?) ----------------------> RUNNING / PENDING
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "journal.h"

static void fill(ckpt_upload_step *e, const eng_journal *j, int held)
{
	uint32_t i;

	e->step = j->step;
	e->host = j->host;
	e->files = j->nfiles;
	e->sizes_known = 1;
	for (i = 0; i < j->nfiles; i++) {
		const eng_jfile *f = &j->files[i];

		if (f->size == UINT64_MAX) {
			e->sizes_known = 0;
			e->bytes_confirmed += f->confirmed;
			continue;
		}
		e->bytes_total += f->size;
		e->bytes_confirmed += f->done ? f->size : f->confirmed;
	}
	snprintf(e->remote, sizeof(e->remote), "%s", j->remote);
	if (j->error) {
		e->state = CKPT_UPLOAD_FAILED;
		snprintf(e->msg, sizeof(e->msg), "%s", j->error);
	} else {
		e->state = held ? CKPT_UPLOAD_RUNNING : CKPT_UPLOAD_PENDING;
	}
}

CKPT_API int ckpt_upload_list(const char *dir, ckpt_upload_step **out,
			      size_t *count)
{
	ckpt_upload_step *v = NULL;
	uint64_t *steps = NULL;
	size_t n = 0, k, m = 0;
	struct stat st;
	int held, r;

	if (out)
		*out = NULL;
	if (count)
		*count = 0;
	if (!dir || !out || !count)
		return eng_err(NULL, -EINVAL,
			       "ckpt_upload_list: dir, out and count are "
			       "required");
	if (!strncmp(dir, "gs://", 5))
		return eng_err(NULL, -EINVAL,
			       "%s: upload journals are kept in a local "
			       "directory, not in a bucket",
			       dir);
	r = stat(dir, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
	if (r < 0)
		return eng_err(NULL, r, "%s: %s", dir, ckpt_strerror(r));
	r = eng_journal_list(dir, &steps, &n);
	if (r < 0)
		return eng_err(NULL, r, "%s/.upload: %s", dir,
			       ckpt_strerror(r));
	if (n == 0)
		return 0;
	held = eng_journal_held(dir);
	v = calloc(n, sizeof(*v));
	if (!v) {
		free(steps);
		return eng_err(NULL, -ENOMEM, "out of memory");
	}
	for (k = 0; k < n; k++) {
		char err[ENG_ERRMSG_MAX];
		eng_journal j;

		/* one gone in between (committed): not listed */
		r = eng_journal_read(dir, steps[k], &j, err);
		if (r == -ENOENT)
			continue;
		if (r < 0) { /* unreadable: say so, do not hide the step */
			v[m].step = steps[k];
			v[m].state = CKPT_UPLOAD_FAILED;
			snprintf(v[m].msg, sizeof(v[m].msg), "%.255s", err);
			m++;
			continue;
		}
		fill(&v[m++], &j, held);
		eng_journal_free(&j);
	}
	free(steps);
	if (m == 0) {
		free(v);
		v = NULL;
	}
	*out = v;
	*count = m;
	return 0;
}
