/*
 * util.c - small helpers every engine file uses: paths, the CPU count,
 * clocks, prefaulting.
 * (File helpers live with the POSIX backend, backend_posix.c; committed
 * steps in root.c.)
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
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

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * A restore writes into memory the caller just allocated: every 4 KiB page
 * of it faults on first write, and on this VM a fault's entry and exit
 * cost about as much as zeroing the page (perf of a 4 GiB restore into
 * fresh memory: a fifth of the samples in exc_page_fault alone). One
 * madvise faults a block's pages in without the trap per page, and costs
 * a page-table walk when they are already there.
 */
static atomic_int prefault_off;

void eng_prefault_write(void *p, size_t n)
{
	uintptr_t a, e;

	if (n < (64u << 10) || atomic_load_explicit(&prefault_off,
						    memory_order_relaxed))
		return;
	a = (uintptr_t)p & ~(uintptr_t)4095;
	e = (uintptr_t)p + n;
	if (madvise((void *)a, e - a, MADV_POPULATE_WRITE) < 0 &&
	    errno == EINVAL)
		atomic_store_explicit(&prefault_off, 1, memory_order_relaxed);
}

int64_t eng_unix_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t eng_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void eng_realtime_after_ms(struct timespec *dl, int ms)
{
	clock_gettime(CLOCK_REALTIME, dl);
	if (ms <= 0)
		return;
	dl->tv_sec += ms / 1000;
	dl->tv_nsec += (long)(ms % 1000) * 1000000;
	if (dl->tv_nsec >= 1000000000) {
		dl->tv_sec++;
		dl->tv_nsec -= 1000000000;
	}
}
