/*
 * tu_dedup.h - helpers of the deduplication tests (tu_dedup.c).
 *
 * The state is fine-tuning shaped: a large "frozen" tensor (the same bytes
 * at every step) and a small "head" that changes with the step.
 */
#ifndef CKPT_TU_DEDUP_H
#define CKPT_TU_DEDUP_H

#include <stddef.h>
#include <stdint.h>

#include "save_internal.h"
#include "testutil.h"

/* 1 MiB frozen + 64 KiB head, 64 KiB chunks: 17 chunks, 16 frozen. */
#define FROZEN_BYTES (1u << 20)
#define HEAD_BYTES (64u << 10)

/* A handle on dir (tu_settings + flags, keep_last); the test fails if
 * ckpt_open does. */
ckpt *open_dedup(const char *dir, uint32_t flags, uint32_t keep_last);
/* frozen (seed 1, unchanged) + head (seed = step) */
void make_state(tu_set *set, uint64_t step);
/* Saves step's state (borrowed if borrow) and waits; the test fails if
 * either fails. */
void save_step(ckpt *c, uint64_t step, int borrow);
/* Step's tensors in dir (a directory or gs://) are step's state. */
void check_step(const char *dir, uint64_t step);
/* The bytes of file `name` of step's directory (the caller frees them). */
uint8_t *step_file(const char *dir, uint64_t step, const char *name,
		   size_t *len);
void load_index(const char *dir, uint64_t step, fmt_index *ix);
void load_commit(const char *dir, uint64_t step, fmt_commit *cm);
/* Chunks of step's index that refer to older files (*ref_step: the step
 * of the last one, if not NULL). */
size_t count_refs(const fmt_index *ix, uint64_t *ref_step);
/* 1 if step is committed in the directory dir. */
int step_committed(const char *dir, uint64_t step);
/* ckpt_reader_verify of step in dir; msg gets the reader's message. */
int verify(const char *dir, uint64_t step, char *msg, size_t len);
/* Chunks sink i of c was sent by the last save. */
uint64_t sink_chunks(ckpt *c, unsigned i);

#endif
