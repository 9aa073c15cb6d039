/*
 * test_gcs_ckpt.c - see test_gcs_ckpt.h. Reads objects with the gcs
 * client (whole-object gets are checked against x-goog-hash by it) and
 * decodes indexes with format/.
 */
#include "test_gcs_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt.h"
#include "gcs.h"
#include "testutil.h"

tu_server gk_srv;

int gk_main(const char *bucket, const char *name, int timeout_s,
	    const TTest *const *tests, size_t n)
{
	Suite *s = suite_create(name);
	TCase *t = tcase_create(name);
	size_t i;
	int rc;

	tcase_set_timeout(t, timeout_s);
	for (i = 0; i < n; i++)
		tcase_add_test(t, tests[i]);
	suite_add_tcase(s, t);
	gt_server_start(&gk_srv, bucket);
	setenv("STORAGE_EMULATOR_HOST", gk_srv.url, 1);
	rc = tu_main(s);
	tu_server_stop(&gk_srv);
	return rc;
}

struct gcs_client *gk_client(const char *url)
{
	struct gcs_config cfg = { 0 };
	struct gcs_client *gc = NULL;

	cfg.initial_backoff_s = 0.001;
	cfg.max_backoff_s = 0.01;
	cfg.deadline_s = 120;
	cfg.endpoint = url;
	if (gcs_client_new(&gc, &cfg) < 0) {
		fprintf(stderr, "gcs_client_new failed\n");
		abort();
	}
	return gc;
}

long gk_count(struct gcs_client *gc, const char *bucket, const char *prefix)
{
	struct gcs_list l;
	long n;

	if (gcs_list(gc, bucket, prefix, NULL, &l) < 0)
		return -1;
	n = (long)l.n_items;
	gcs_list_free(&l);
	return n;
}

int gk_exists(struct gcs_client *gc, const char *bucket, const char *name)
{
	struct gcs_object o;
	int r;

	memset(&o, 0, sizeof(o));
	r = gcs_stat(gc, bucket, name, &o);
	gcs_object_clear(&o);
	return r == 0 ? 1 : r == -ENOENT ? 0 : -1;
}

char *gk_object(const char *prefix, uint64_t step, const char *name)
{
	char d[32];

	fmt_step_dirname(step, d);
	return tu_path("%s%s%s/%s", prefix, *prefix ? "/" : "", d, name);
}

static int read_local(const char *path, uint8_t **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;

	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	*buf = malloc(n > 0 ? (size_t)n : 1);
	*len = (size_t)n;
	if (!*buf || fread(*buf, 1, *len, f) != *len) {
		fclose(f);
		free(*buf);
		return -1;
	}
	fclose(f);
	return 0;
}

int gk_same_as_local(struct gcs_client *gc, const char *bucket,
		     const char *prefix, const char *dir, uint64_t step,
		     uint32_t host, char *why, size_t whylen)
{
	char dn[32], *sdir, pre[32];
	DIR *d;
	struct dirent *e;
	int r = 0, seen = 0;

	fmt_step_dirname(step, dn);
	sdir = tu_path("%s/%s", dir, dn);
	d = opendir(sdir);
	fmt_index_name(host, pre);
	*strchr(pre, '.') = 0;
	if (!d) {
		snprintf(why, whylen, "%s: cannot open", sdir);
		free(sdir);
		return -1;
	}
	while (r == 0 && (e = readdir(d))) {
		size_t pl = strlen(pre);
		char *path, *obj;
		uint8_t *a = NULL;
		void *b = NULL;
		size_t al = 0, bl = 0;

		if (strncmp(e->d_name, pre, pl) ||
		    (e->d_name[pl] != '-' && e->d_name[pl] != '.') ||
		    strstr(e->d_name, ".tmp"))
			continue;
		seen++;
		path = tu_path("%s/%s", sdir, e->d_name);
		obj = gk_object(prefix, step, e->d_name);
		if (read_local(path, &a, &al) < 0) {
			snprintf(why, whylen, "%s: cannot read", path);
			r = -1;
		} else if (gcs_get(gc, bucket, obj, 0, &b, &bl, NULL) < 0) {
			snprintf(why, whylen, "gs://%s/%s: %s", bucket, obj,
				 gcs_errmsg(gc));
			r = -1;
		} else if (al != bl || memcmp(a, b, al)) {
			snprintf(why, whylen,
				 "gs://%s/%s: %zu bytes differ "
				 "from %s (%zu bytes)",
				 bucket, obj, bl, path, al);
			r = -1;
		}
		free(a);
		free(b);
		free(path);
		free(obj);
	}
	closedir(d);
	free(sdir);
	if (r == 0 && seen < 2) {
		snprintf(why, whylen,
			 "step %" PRIu64 ": only %d files of "
			 "host %u locally",
			 step, seen, host);
		r = -1;
	}
	return r;
}

static int check_index(struct gcs_client *gc, const char *bucket,
		       const char *prefix, uint64_t step, uint32_t h, char *why,
		       size_t whylen)
{
	char iname[32], err[256];
	char *obj;
	void *buf = NULL;
	size_t len = 0, i;
	fmt_index ix;
	int r;

	fmt_index_name(h, iname);
	obj = gk_object(prefix, step, iname);
	r = gcs_get(gc, bucket, obj, 0, &buf, &len, NULL);
	if (r < 0) {
		snprintf(why, whylen, "gs://%s/%s: %s", bucket, obj,
			 gcs_errmsg(gc));
		free(obj);
		return -1;
	}
	free(obj);
	memset(&ix, 0, sizeof(ix));
	if (fmt_index_decode(buf, len, &ix, err, sizeof(err)) < 0) {
		snprintf(why, whylen, "host %u index: %s", h, err);
		free(buf);
		return -1;
	}
	free(buf);
	for (i = 0, r = 0; r == 0 && i < ix.nfiles; i++) {
		const fmt_file_entry *fe = &ix.files[i];
		void *d = NULL;
		size_t dl = 0;

		obj = gk_object(prefix, step, fe->name);
		if (gcs_get(gc, bucket, obj, 0, &d, &dl, NULL) < 0) {
			snprintf(why, whylen,
				 "committed step %" PRIu64
				 " lacks gs://%s/%s: %s",
				 step, bucket, obj, gcs_errmsg(gc));
			r = -1;
		} else if (dl != fe->size || fmt_xxh3(d, dl) != fe->xxh3) {
			snprintf(why, whylen,
				 "committed gs://%s/%s: %zu bytes"
				 " (index: %" PRIu64 ") or hash differ",
				 bucket, obj, dl, fe->size);
			r = -1;
		}
		free(d);
		free(obj);
	}
	fmt_index_free(&ix);
	return r;
}

int gk_step_complete(struct gcs_client *gc, const char *bucket,
		     const char *prefix, uint64_t step, uint32_t hosts,
		     char *why, size_t whylen)
{
	uint32_t h;

	for (h = 0; h < hosts; h++)
		if (check_index(gc, bucket, prefix, step, h, why, whylen) < 0)
			return -1;
	return 0;
}

int gk_download(struct gcs_client *gc, const char *bucket, const char *prefix,
		const char *dir)
{
	char *pre = tu_path("%s/", prefix);
	struct gcs_list l;
	size_t i;
	int r = 0;

	if (gcs_list(gc, bucket, pre, NULL, &l) < 0) {
		free(pre);
		return -1;
	}
	mkdir(dir, 0755);
	for (i = 0; r == 0 && i < l.n_items; i++) {
		const char *rel = l.items[i].name + strlen(pre);
		char *path = tu_path("%s/%s", dir, rel), *sl;
		void *d = NULL;
		size_t n = 0;
		FILE *f;

		sl = strrchr(path, '/');
		*sl = 0;
		mkdir(path, 0755);
		*sl = '/';
		f = gcs_get(gc, bucket, l.items[i].name, 0, &d, &n, NULL) == 0 ?
			    fopen(path, "wb") :
			    NULL;
		if (!f || fwrite(d, 1, n, f) != n)
			r = -1;
		if (f && fclose(f))
			r = -1;
		free(d);
		free(path);
	}
	gcs_list_free(&l);
	free(pre);
	return r;
}
