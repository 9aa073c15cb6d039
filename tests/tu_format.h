/*
 * tu_format.h - helpers shared by the suites of format/
 * (test_format_layout.c, test_format_codec.c, test_format_docs.c): a
 * reproducible pseudo-random stream, test data drawn from it (random
 * bytes, bf16 and f32 from a normal distribution), a monotonic clock and
 * the runner of a suite. Like those suites, it uses only fmt.h / ckpt.h
 * (no testutil).
 */
#ifndef CKPT_TU_FORMAT_H
#define CKPT_TU_FORMAT_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* splitmix64 from a fixed seed; each test runs in a process of its own
 * (CK_FORK), so each starts from the same state. A test may set
 * tf_rng_state to a seed of its own. */
extern uint64_t tf_rng_state;
uint64_t tf_rnd(void);

/* n random bytes */
void tf_fill_random(uint8_t *p, size_t n);
/* round to nearest even */
uint16_t tf_f32_to_bf16(float f);
/* n_elems bf16 / f32 values from N(0, sigma), little-endian. */
void tf_fill_bf16_normal(uint8_t *p, size_t n_elems, double sigma);
void tf_fill_f32_normal(uint8_t *p, size_t n_elems, double sigma);

/* CLOCK_MONOTONIC in seconds */
double tf_now_s(void);

/* Runs the suite (CK_NORMAL), frees it; returns the exit status (0: every
 * check passed). */
int tf_main(Suite *s);

#endif
