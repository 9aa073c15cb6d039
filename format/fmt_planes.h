/*
 * fmt_planes.h - the float codec's byte planes (fmt_planes.c). Internal to
 * format/.
 */
#ifndef CKPT_FMT_PLANES_H
#define CKPT_FMT_PLANES_H

#include <stddef.h>
#include <stdint.h>

/* p[j] receives byte (w-1-j) of each of the n elements at src, rotated
 * left by one bit; w is 2, 4 or 8. For w = 2 and 4, a NULL p[0] skips
 * plane 0 (the fast path codes it straight from the elements). */
void fmt_planes_split(const uint8_t *src, size_t n, unsigned w,
		      uint8_t *const p[8]);
/* The inverse: n elements of w bytes into dst from the planes p. */
void fmt_planes_join(const uint8_t *const p[8], size_t n, unsigned w,
		     uint8_t *dst);

#endif /* CKPT_FMT_PLANES_H */
