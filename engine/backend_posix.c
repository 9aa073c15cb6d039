/*
 * backend_posix.c - the POSIX backend: a root directory on a local or
 * network file system, and the small-file helpers the engine shares.
 *
 * Design note. Every call goes through the eng_io table (io.c) so fault
 * injection and the crash tests see it. Durability: a document is written
 * to a unique temporary (NAME.<pid>-<rand>.tmp, so two processes never
 * share one), fsynced, renamed into place and the directory fsynced. A
 * create (COMMIT) renames with RENAME_NOREPLACE (link + unlink where the
 * file system lacks it), so of two processes creating one name exactly one
 * succeeds and the other gets CKPT_E_EXISTS; a process only ever removes a
 * record it wrote itself (checked by inode after a failed directory
 * fsync). The shard sink is writer.c's io_uring/O_DIRECT local sink.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "save_internal.h"

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

/*
 * Writes a unique temporary next to dir/name, fsynced and closed; its
 * inode in *st. Returns the malloc'd temporary path or NULL (*r set, the
 * temporary removed).
 */
static char *write_tmp(const char *dir, const char *name, const void *buf,
		       size_t len, struct stat *st, int *r, char *errbuf)
{
	char *tmp = eng_tmp_name(dir, name);
	int fd;

	if (!tmp) {
		*r = eng_err(errbuf, -ENOMEM, "%s/%s: out of memory", dir,
			     name);
		return NULL;
	}
	fd = eng_open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0) {
		*r = eng_err(errbuf, fd, "%s: create: %s", tmp,
			     ckpt_strerror(fd));
		free(tmp);
		return NULL;
	}
	*r = eng_pwrite_all(fd, buf, len, 0);
	if (*r < 0) {
		eng_err(errbuf, *r, "%s: write: %s", tmp, ckpt_strerror(*r));
		goto fail;
	}
	*r = eng_fsync(fd);
	if (*r < 0) {
		eng_err(errbuf, *r, "%s: fsync: %s", tmp, ckpt_strerror(*r));
		goto fail;
	}
	if (st && fstat(fd, st) < 0) {
		*r = eng_err(errbuf, -errno, "%s: stat: %s", tmp,
			     strerror(errno));
		goto fail;
	}
	*r = eng_close(fd);
	fd = -1;
	if (*r < 0) {
		eng_err(errbuf, *r, "%s: close: %s", tmp, ckpt_strerror(*r));
		goto fail;
	}
	return tmp;
fail:
	if (fd >= 0)
		eng_close(fd);
	eng_unlink(tmp);
	free(tmp);
	return NULL;
}

int eng_write_file_atomic(const char *dir, const char *name, const void *buf,
			  size_t len, char *errbuf)
{
	char *dst = eng_path("%s/%s", dir, name);
	char *tmp = NULL;
	int r;

	if (!dst)
		return eng_err(errbuf, -ENOMEM, "%s/%s: out of memory", dir,
			       name);
	tmp = write_tmp(dir, name, buf, len, NULL, &r, errbuf);
	if (!tmp)
		goto out;
	r = eng_rename(tmp, dst);
	if (r < 0) {
		eng_err(errbuf, r, "%s: rename to %s: %s", tmp, name,
			ckpt_strerror(r));
		eng_unlink(tmp);
		goto out;
	}
	r = eng_fsync_dir(dir);
	if (r < 0)
		eng_err(errbuf, r, "%s: fsync directory after renaming %s: %s",
			dir, name, ckpt_strerror(r));
out:
	free(tmp);
	free(dst);
	return r;
}

/* Is `path` still the inode we wrote? */
static int same_inode(const char *path, const struct stat *ours)
{
	struct stat st;

	return stat(path, &st) == 0 && st.st_ino == ours->st_ino &&
	       st.st_dev == ours->st_dev;
}

int eng_create_file(const char *dir, const char *name, const void *buf,
		    size_t len, char *errbuf)
{
	char *dst = eng_path("%s/%s", dir, name);
	char *tmp = NULL;
	struct stat ours, st;
	int r;

	if (!dst)
		return eng_err(errbuf, -ENOMEM, "%s/%s: out of memory", dir,
			       name);
	if (stat(dst, &st) == 0) {
		r = eng_err(errbuf, CKPT_E_EXISTS, "%s: already exists", dst);
		goto out;
	}
	tmp = write_tmp(dir, name, buf, len, &ours, &r, errbuf);
	if (!tmp)
		goto out;
	r = eng_rename_noreplace(tmp, dst);
	if (r == -EEXIST || (r == -ENOENT && stat(dst, &st) == 0)) {
		/* another process won (ENOENT: and gc has since removed our
		 * temporary from the committed step) */
		eng_unlink(tmp);
		r = eng_err(errbuf, CKPT_E_EXISTS, "%s: already exists", dst);
		goto out;
	}
	if (r < 0) {
		eng_err(errbuf, r, "%s: rename to %s: %s", tmp, name,
			ckpt_strerror(r));
		eng_unlink(tmp);
		goto out;
	}
	r = eng_fsync_dir(dir);
	if (r < 0) {
		/* The record is in place but not known durable: take it back
		 * so the error we return is the truth, but only if it is
		 * still the one this process wrote. */
		eng_err(errbuf, r, "%s: fsync directory after creating %s: %s",
			dir, name, ckpt_strerror(r));
		if (same_inode(dst, &ours))
			eng_unlink(dst);
	}
out:
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
	char *p = eng_tmp_name(dir, ".direct-probe");
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

/* ------------------------------------------------------------------ */
/* The backend table                                                  */
/* ------------------------------------------------------------------ */

static char *key_path(eng_loc *l, const char *key)
{
	size_t n = strlen(key);

	while (n > 0 && key[n - 1] == '/')
		n--;
	return n ? eng_path("%s/%.*s", l->dir, (int)n, key) :
		   eng_path("%s", l->dir);
}

/* Splits dir/key into the parent directory (malloc'd) and the last name
 * (pointing into key). */
static char *parent_of(eng_loc *l, const char *key, const char **name)
{
	const char *s = strrchr(key, '/');

	*name = s ? s + 1 : key;
	return s ? eng_path("%s/%.*s", l->dir, (int)(s - key), key) :
		   eng_path("%s", l->dir);
}

static int px_list(eng_loc *l, const char *prefix, unsigned flags,
		   eng_list_fn fn, void *arg, char *errbuf)
{
	char *dir = key_path(l, prefix);
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (!dir)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	d = opendir(dir);
	if (!d) {
		r = eng_err(errbuf, errno == ENOENT ? CKPT_E_NOTFOUND : -errno,
			    "%s: %s", dir, strerror(errno));
		free(dir);
		return r;
	}
	while ((de = readdir(d)) != NULL) {
		eng_list_ent e = { de->d_name, 0, 0 };
		struct stat st;
		int t = de->d_type;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (t == DT_UNKNOWN || t == DT_LNK ||
		    (flags & ENG_LIST_SIZES)) {
			if (fstatat(dirfd(d), de->d_name, &st, 0) < 0)
				continue; /* removed meanwhile */
			t = S_ISDIR(st.st_mode) ? DT_DIR :
			    S_ISREG(st.st_mode) ? DT_REG :
						  DT_UNKNOWN;
			e.size = (uint64_t)st.st_size;
		}
		if (t != DT_DIR && t != DT_REG)
			continue;
		e.is_prefix = t == DT_DIR;
		if (e.is_prefix)
			e.size = 0;
		r = fn(arg, &e);
		if (r)
			break;
	}
	closedir(d);
	free(dir);
	return r;
}

static int px_size(eng_loc *l, const char *key, uint64_t *size)
{
	char *p = key_path(l, key);
	struct stat st;
	int r = 0;

	if (!p)
		return -ENOMEM;
	if (stat(p, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -ENOENT;
	else
		*size = (uint64_t)st.st_size;
	free(p);
	return r;
}

static int px_get(eng_loc *l, const char *key, uint64_t max_len, uint8_t **out,
		  size_t *out_len, char *errbuf)
{
	char *p = key_path(l, key);
	int r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_read_file(p, max_len, out, out_len, errbuf);
	free(p);
	return r;
}

static int px_read_range(eng_loc *l, const char *key, uint64_t off, void *buf,
			 size_t n, char *errbuf)
{
	char *p = key_path(l, key);
	int fd, r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	fd = eng_open(p, O_RDONLY, 0);
	if (fd < 0) {
		r = eng_err(errbuf, fd, "%s: open: %s", p, ckpt_strerror(fd));
	} else {
		r = eng_pread_all(fd, buf, n, off);
		if (r < 0)
			eng_err(errbuf, r, "%s: read at offset %llu: %s", p,
				(unsigned long long)off, ckpt_strerror(r));
		eng_close(fd);
	}
	free(p);
	return r;
}

/* create (COMMIT: never replaces) or replace (latest) dir/name */
static int put_doc(eng_loc *l, const char *key, const void *buf, size_t len,
		   int create, char *errbuf)
{
	const char *name;
	char *dir = parent_of(l, key, &name);
	int r;

	if (!dir)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = create ? eng_create_file(dir, name, buf, len, errbuf) :
		     eng_write_file_atomic(dir, name, buf, len, errbuf);
	free(dir);
	return r;
}

static int px_create(eng_loc *l, const char *key, const void *buf, size_t len,
		     char *errbuf)
{
	return put_doc(l, key, buf, len, 1, errbuf);
}

static int px_replace(eng_loc *l, const char *key, const void *buf, size_t len,
		      char *errbuf)
{
	return put_doc(l, key, buf, len, 0, errbuf);
}

static int px_remove(eng_loc *l, const char *key, char *errbuf)
{
	char *p = key_path(l, key);
	int r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_unlink(p);
	if (r < 0 && r != -ENOENT)
		eng_err(errbuf, r, "%s: unlink: %s", p, ckpt_strerror(r));
	free(p);
	return r;
}

static int px_sync(eng_loc *l, const char *prefix, char *errbuf)
{
	char *p = key_path(l, prefix);
	int r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_fsync_dir(p);
	if (r < 0)
		eng_err(errbuf, r, "%s: fsync directory: %s", p,
			ckpt_strerror(r));
	free(p);
	return r;
}

static int px_remove_all(eng_loc *l, const char *prefix, uint64_t *bytes,
			 char *errbuf)
{
	char *p = key_path(l, prefix);
	int r;

	if (!p)
		return eng_err(errbuf, -ENOMEM, "out of memory");
	r = eng_remove_tree(p, bytes);
	if (r == -ENOENT)
		r = 0;
	if (r < 0)
		eng_err(errbuf, r, "%s: remove: %s", p, ckpt_strerror(r));
	free(p);
	return r;
}

/* flock on the root directory: across threads (one open file each) and
 * processes. Best effort: -1 means unlocked. */
static int px_lock(eng_loc *l)
{
	int fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0)
		while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
			;
	return fd;
}

static void px_unlock(eng_loc *l, int token)
{
	(void)l;
	if (token >= 0)
		close(token); /* releases the flock */
}

const eng_backend eng_backend_posix = {
	.name = "posix",
	.list = px_list,
	.size = px_size,
	.get = px_get,
	.read_range = px_read_range,
	.create = px_create,
	.replace = px_replace,
	.remove = px_remove,
	.sync = px_sync,
	.remove_all = px_remove_all,
	.lock = px_lock,
	.unlock = px_unlock,
	.sink_new = eng_local_sink_new,
};
