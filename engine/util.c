/*
 * util.c - paths, small files written atomically, and the committed steps
 * of a root directory.
 *
 * A step exists for readers only when its COMMIT record is present and
 * valid; the `latest` file is a hint kept for people and tools, and a newer
 * committed step found by scanning always wins (a crash between writing
 * COMMIT and updating `latest` must not hide a durable step).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

char *eng_path(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

unsigned eng_ncpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : (unsigned)n;
}

int eng_fsync_dir(const char *dir)
{
	int fd = eng_open(dir, O_RDONLY | O_DIRECTORY, 0);
	int r;

	if (fd < 0)
		return fd;
	r = eng_fsync(fd);
	eng_close(fd);
	return r;
}

int eng_read_file(const char *path, uint64_t max_len, uint8_t **out,
		  size_t *out_len, char *errbuf)
{
	struct stat st;
	uint8_t *buf = NULL;
	int fd, r;

	*out = NULL;
	*out_len = 0;
	fd = eng_open(path, O_RDONLY, 0);
	if (fd < 0)
		return eng_err(errbuf, fd, "%s: open: %s", path,
			       ckpt_strerror(fd));
	if (fstat(fd, &st) < 0) {
		r = eng_err(errbuf, -errno, "%s: stat: %s", path,
			    strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size > max_len) {
		r = eng_err(errbuf, CKPT_E_CORRUPT,
			    "%s: %llu bytes, more than the %llu allowed", path,
			    (unsigned long long)st.st_size,
			    (unsigned long long)max_len);
		goto out;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		r = eng_err(errbuf, -ENOMEM, "%s: out of memory", path);
		goto out;
	}
	r = eng_pread_all(fd, buf, (size_t)st.st_size, 0);
	if (r < 0) {
		r = eng_err(errbuf, r, "%s: read: %s", path, ckpt_strerror(r));
		goto out;
	}
	*out = buf;
	*out_len = (size_t)st.st_size;
	buf = NULL;
out:
	free(buf);
	eng_close(fd);
	return r;
}

int eng_write_file_atomic(const char *dir, const char *name,
			  const void *buf, size_t len, char *errbuf)
{
	char *tmp = eng_path("%s/%s" FMT_TMP_SUFFIX, dir, name);
	char *dst = eng_path("%s/%s", dir, name);
	int fd = -1, r;

	if (!tmp || !dst) {
		r = eng_err(errbuf, -ENOMEM, "%s/%s: out of memory", dir, name);
		goto out;
	}
	fd = eng_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		r = eng_err(errbuf, fd, "%s: create: %s", tmp,
			    ckpt_strerror(fd));
		goto out;
	}
	r = eng_pwrite_all(fd, buf, len, 0);
	if (r < 0) {
		eng_err(errbuf, r, "%s: write: %s", tmp, ckpt_strerror(r));
		goto fail;
	}
	r = eng_fsync(fd);
	if (r < 0) {
		eng_err(errbuf, r, "%s: fsync: %s", tmp, ckpt_strerror(r));
		goto fail;
	}
	r = eng_close(fd);
	fd = -1;
	if (r < 0) {
		eng_err(errbuf, r, "%s: close: %s", tmp, ckpt_strerror(r));
		goto fail;
	}
	r = eng_rename(tmp, dst);
	if (r < 0) {
		eng_err(errbuf, r, "%s: rename to %s: %s", tmp, name,
			ckpt_strerror(r));
		goto fail;
	}
	r = eng_fsync_dir(dir);
	if (r < 0)
		eng_err(errbuf, r, "%s: fsync directory after renaming %s: %s",
			dir, name, ckpt_strerror(r));
	goto out;
fail:
	if (fd >= 0)
		eng_close(fd);
	fd = -1;
	eng_unlink(tmp);
out:
	if (fd >= 0)
		eng_close(fd);
	free(tmp);
	free(dst);
	return r;
}

int eng_remove_tree(const char *dir, uint64_t *bytes_freed)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int r = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		char *p;
		int e;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		p = eng_path("%s/%s", dir, de->d_name);
		if (!p) {
			r = -ENOMEM;
			break;
		}
		if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
			e = eng_remove_tree(p, bytes_freed);
		} else {
			e = eng_unlink(p);
			if (e == 0 && bytes_freed)
				*bytes_freed += (uint64_t)st.st_size;
		}
		if (e < 0 && e != -ENOENT && r == 0)
			r = e;
		free(p);
	}
	closedir(d);
	if (r == 0) {
		r = eng_rmdir(dir);
		if (r == -ENOENT)
			r = 0;
	}
	return r;
}

int eng_probe_direct(const char *dir)
{
	/* Named like every temporary file, so gc removes it if a crash
	 * strikes between create and unlink. */
	struct timespec ts;
	char *p;

	clock_gettime(CLOCK_REALTIME, &ts);
	p = eng_path("%s/.direct-probe.%ld.%lx" FMT_TMP_SUFFIX, dir,
		     (long)getpid(), (unsigned long)ts.tv_nsec);
	void *buf = NULL;
	int fd, ok = 0;

	if (!p)
		return 0;
	fd = eng_open(p, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
	if (fd >= 0) {
		if (posix_memalign(&buf, FMT_ALIGN, FMT_ALIGN) == 0) {
			memset(buf, 0, FMT_ALIGN);
			ok = eng_pwrite_all(fd, buf, FMT_ALIGN, 0) == 0;
			free(buf);
		}
		eng_close(fd);
		eng_unlink(p);
	}
	free(p);
	return ok;
}

int eng_load_commit(const char *root, uint64_t step, fmt_commit *cm,
		    char *errbuf)
{
	char dname[32], err[512];
	char *path;
	uint8_t *buf = NULL;
	size_t len = 0;
	int r;

	memset(cm, 0, sizeof(*cm));
	fmt_step_dirname(step, dname);
	path = eng_path("%s/%s/" FMT_COMMIT_NAME, root, dname);
	if (!path)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_read_file(path, FMT_MAX_META_BYTES, &buf, &len, errbuf);
	if (r == -ENOENT || r == -ENOTDIR) {
		r = eng_err(errbuf, CKPT_E_NOTFOUND,
			    "%s: step %llu is not committed (no %s)", root,
			    (unsigned long long)step, FMT_COMMIT_NAME);
		goto out;
	}
	if (r < 0)
		goto out;
	err[0] = 0;
	r = fmt_commit_decode(buf, len, cm, err, sizeof(err));
	if (r < 0) {
		r = eng_err(errbuf, r, "%s: %s", path, err);
		goto out;
	}
	if (cm->step != step) {
		r = eng_err(errbuf, CKPT_E_CORRUPT,
			    "%s: records step %llu, directory says %llu", path,
			    (unsigned long long)cm->step,
			    (unsigned long long)step);
		fmt_commit_free(cm);
		goto out;
	}
out:
	free(buf);
	free(path);
	return r;
}

static int cmp_step(const void *a, const void *b)
{
	const eng_step_ent *x = a, *y = b;

	return x->step < y->step ? -1 : x->step > y->step;
}

int eng_scan_steps(const char *root, eng_step_ent **out, size_t *count,
		   char *errbuf)
{
	DIR *d = opendir(root);
	struct dirent *de;
	eng_step_ent *v = NULL;
	size_t n = 0, cap = 0;
	int r = 0;

	*out = NULL;
	*count = 0;
	if (!d) {
		r = -errno;
		if (r == -ENOENT)
			return eng_err(errbuf, CKPT_E_NOTFOUND,
				       "%s: no such directory", root);
		return eng_err(errbuf, r, "%s: %s", root, strerror(-r));
	}
	while ((de = readdir(d)) != NULL) {
		fmt_commit cm;
		uint64_t step;
		char *p;
		struct stat st;

		if (fmt_step_parse(de->d_name, &step) < 0)
			continue;
		p = eng_path("%s/%s", root, de->d_name);
		if (!p) {
			r = eng_err(errbuf, -ENOMEM, "out of memory");
			break;
		}
		if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode)) {
			free(p);
			continue;
		}
		free(p);
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			eng_step_ent *nv = realloc(v, ncap * sizeof(*v));

			if (!nv) {
				r = eng_err(errbuf, -ENOMEM, "out of memory");
				break;
			}
			v = nv;
			cap = ncap;
		}
		v[n].step = step;
		v[n].committed = eng_load_commit(root, step, &cm, NULL) == 0;
		if (v[n].committed)
			fmt_commit_free(&cm);
		n++;
	}
	closedir(d);
	if (r < 0) {
		free(v);
		return r;
	}
	if (n)
		qsort(v, n, sizeof(*v), cmp_step);
	*out = v;
	*count = n;
	return 0;
}

int eng_resolve_latest(const char *root, uint64_t *step, char *errbuf)
{
	eng_step_ent *v;
	size_t n, i;
	int r = eng_scan_steps(root, &v, &n, errbuf);

	if (r < 0)
		return r;
	for (i = n; i-- > 0;) {
		if (v[i].committed) {
			*step = v[i].step;
			free(v);
			return 0;
		}
	}
	free(v);
	return eng_err(errbuf, CKPT_E_NOTFOUND,
		       "%s: no committed checkpoint", root);
}

int eng_write_latest(const char *root, uint64_t step, char *errbuf)
{
	char dname[32], line[40];
	int n;

	fmt_step_dirname(step, dname);
	n = snprintf(line, sizeof(line), "%s\n", dname);
	return eng_write_file_atomic(root, FMT_LATEST_NAME, line, (size_t)n,
				     errbuf);
}
