/*
 * util.c - small helpers every engine file uses: paths and the CPU count.
 * (File helpers live with the POSIX backend, backend_posix.c; committed
 * steps in root.c.)
 */
#include <stdio.h>
#include <stdlib.h>
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
