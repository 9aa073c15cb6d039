/*
 * util.c - small helpers every engine file uses: paths and the CPU count.
 * (File helpers live with the POSIX backend, backend_posix.c; committed
 * steps in root.c.)
 */
#include <stdio.h>
#include <stdlib.h>
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
