/*
 * io.c - the table every file-system call of the engine goes through.
 *
 * Tests replace members to inject ENOSPC, EIO, short counts and crashes
 * (SQLite's test6.c does the same with its VFS). Wrappers return -errno so
 * callers never consult errno after another call could have changed it.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static _Atomic(const eng_io *) io_table;

void eng_io_set(const eng_io *io)
{
	atomic_store(&io_table, io);
}

static const eng_io *cur(void)
{
	return atomic_load_explicit(&io_table, memory_order_acquire);
}

#define NEG_ERRNO(expr)                           \
	do {                                      \
		long r_ = (long)(expr);           \
		return r_ < 0 ? -errno : (int)r_; \
	} while (0)

int eng_open(const char *path, int flags, mode_t mode)
{
	const eng_io *io = cur();
	int fd;

	if (io && io->open)
		return io->open(path, flags, mode);
	do
		fd = open(path, flags | O_CLOEXEC, mode);
	while (fd < 0 && errno == EINTR);
	return fd < 0 ? -errno : fd;
}

int eng_close(int fd)
{
	const eng_io *io = cur();

	if (io && io->close)
		return io->close(fd);
	NEG_ERRNO(close(fd));
}

long eng_filter_write(int fd, uint64_t off, size_t len, long res)
{
	const eng_io *io = cur();

	if (io && io->write_result)
		return io->write_result(fd, off, len, res);
	return res;
}

long eng_filter_read(int fd, uint64_t off, size_t len, long res)
{
	const eng_io *io = cur();

	if (io && io->read_result)
		return io->read_result(fd, off, len, res);
	return res;
}

int eng_pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
	const eng_io *io = cur();
	const char *p = buf;

	while (n > 0) {
		long r;

		if (io && io->pwrite)
			r = io->pwrite(fd, p, n, (off_t)off);
		else
			r = pwrite(fd, p, n, (off_t)off);
		if (r < 0)
			r = -errno;
		if (r == -EINTR)
			continue;
		r = eng_filter_write(fd, off, n, r);
		if (r < 0)
			return (int)r;
		if (r == 0)
			return -EIO;
		p += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

int eng_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	const eng_io *io = cur();
	char *p = buf;

	while (n > 0) {
		long r;

		if (io && io->pread)
			r = io->pread(fd, p, n, (off_t)off);
		else
			r = pread(fd, p, n, (off_t)off);
		if (r < 0)
			r = -errno;
		if (r == -EINTR)
			continue;
		r = eng_filter_read(fd, off, n, r);
		if (r < 0)
			return (int)r;
		if (r == 0)
			return -EIO; /* file ended early */
		p += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

int eng_fsync(int fd)
{
	const eng_io *io = cur();

	if (io && io->fsync)
		return io->fsync(fd);
	NEG_ERRNO(fsync(fd));
}

int eng_fdatasync(int fd)
{
	const eng_io *io = cur();

	if (io && io->fdatasync)
		return io->fdatasync(fd);
	NEG_ERRNO(fdatasync(fd));
}

int eng_rename(const char *from, const char *to)
{
	const eng_io *io = cur();

	if (io && io->rename)
		return io->rename(from, to);
	NEG_ERRNO(rename(from, to));
}

int eng_unlink(const char *path)
{
	const eng_io *io = cur();

	if (io && io->unlink)
		return io->unlink(path);
	NEG_ERRNO(unlink(path));
}

int eng_link(const char *from, const char *to)
{
	const eng_io *io = cur();

	if (io && io->link)
		return io->link(from, to);
	NEG_ERRNO(link(from, to));
}

int eng_rename_noreplace(const char *from, const char *to)
{
	const eng_io *io = cur();
	int r;

	if (io && io->rename_noreplace)
		r = io->rename_noreplace(from, to);
	else
		r = renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) <
				    0 ?
			    -errno :
			    0;
	if (r != -EINVAL && r != -ENOSYS)
		return r;
	/* no RENAME_NOREPLACE here (some network file systems): a hard
	 * link fails with EEXIST just the same */
	r = eng_link(from, to);
	if (r < 0)
		return r;
	(void)eng_unlink(from);
	return 0;
}

int eng_mkdir(const char *path, mode_t mode)
{
	const eng_io *io = cur();
	int r;

	if (io && io->mkdir)
		r = io->mkdir(path, mode);
	else
		r = mkdir(path, mode) < 0 ? -errno : 0;
	if (r == -EEXIST) {
		struct stat st;

		if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
			return 0;
	}
	return r;
}

int eng_rmdir(const char *path)
{
	const eng_io *io = cur();

	if (io && io->rmdir)
		return io->rmdir(path);
	NEG_ERRNO(rmdir(path));
}

int eng_ftruncate(int fd, off_t len)
{
	const eng_io *io = cur();

	if (io && io->ftruncate)
		return io->ftruncate(fd, len);
	NEG_ERRNO(ftruncate(fd, len));
}

int eng_fallocate(int fd, int mode, off_t off, off_t len)
{
	const eng_io *io = cur();

	if (io && io->fallocate)
		return io->fallocate(fd, mode, off, len);
	NEG_ERRNO(fallocate(fd, mode, off, len));
}

int eng_fcntl(int fd, int cmd, long arg)
{
	const eng_io *io = cur();

	if (io && io->fcntl)
		return io->fcntl(fd, cmd, arg);
	NEG_ERRNO(fcntl(fd, cmd, arg));
}

int eng_uring_submit(struct io_uring *ring)
{
	const eng_io *io = cur();

	if (io && io->uring_submit)
		return io->uring_submit(ring);
	return io_uring_submit(ring);
}

/*
 * Rings and ThreadSanitizer. liburing (2.2 and later on x86-64, as
 * packaged in Debian 12) maps and unmaps its rings with raw mmap/munmap
 * system calls: liburing.so imports no mmap from libc, so TSan never sees
 * a ring's memory go away. Its inline CQ helpers (io_uring_peek_cqe,
 * io_uring_cqe_seen...) are compiled into this library and instrumented;
 * when a new ring is mapped at the address of a destroyed one, TSan
 * compares the new ring's accesses with the old ring's stale history and
 * reports a race between, say, a closed handle's writer thread and a
 * reader thread. The kernel orders the munmap before the mmap that reuses
 * the address, so there is a real happens-before: every ring teardown
 * releases and every ring setup acquires one sync object, which tells
 * TSan exactly that (nothing else is hidden).
 */
#if defined(__SANITIZE_THREAD__)
#define ENG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ENG_TSAN 1
#endif
#endif
#ifdef ENG_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static char ring_sync;
#endif

int eng_uring_queue_init(unsigned entries, struct io_uring *ring,
			 unsigned flags)
{
	int r = io_uring_queue_init(entries, ring, flags);

#ifdef ENG_TSAN
	__tsan_acquire(&ring_sync);
#endif
	return r;
}

void eng_uring_queue_exit(struct io_uring *ring)
{
#ifdef ENG_TSAN
	__tsan_release(&ring_sync);
#endif
	io_uring_queue_exit(ring);
}
