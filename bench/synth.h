/*
 * synth.h - synthetic transformer-like models for the demo and benchmarks.
 *
 * A model is a list of named tensors laid out like a decoder-only
 * transformer (embedding, per-layer attention/MLP weights and norms, final
 * norm, LM head). Values are N(0, 0.02) drawn from a fixed table with a
 * counter-based generator, so the bytes of any 64 KiB block of any tensor
 * are a pure function of (seed, tensor index, block index): the demo can
 * regenerate what it saved, and filling is deterministic whatever the
 * number of threads.
 */
#ifndef CKPT_BENCH_SYNTH_H
#define CKPT_BENCH_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define SYNTH_NAME_MAX 96

/* Flags of synth_plan(). */
#define SYNTH_EXACT (1u << 0)       /* add a filler tensor to hit target */
#define SYNTH_F32_NORMS (1u << 1)   /* norm weights as f32, not bf16 */
#define SYNTH_STEP_SCALAR (1u << 2) /* add an i64 scalar "trainer.step" */

struct synth_tensor {
	char name[SYNTH_NAME_MAX];
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[2];
	uint64_t nbytes;
	void *data;
};

struct synth_model {
	struct synth_tensor *t;
	size_t count;
	uint64_t total_bytes;
	uint32_t d_model;
	uint32_t layers;
};

/*
 * Plans (no data allocated) a model of about `target` bytes. `layers` 0
 * picks the width for ~40 layers and then as many layers as fit.
 * Returns 0 or -EINVAL (target too small) / -ENOMEM.
 */
int synth_plan(struct synth_model *m, uint64_t target, uint32_t layers,
	       unsigned flags);
/* Allocates every tensor (64-byte aligned, not yet touched). */
int synth_alloc(struct synth_model *m);
/* Fills every tensor with N(0, 0.02) values of its dtype using `threads`
 * threads (0 = online CPUs). The i64 step scalar gets `seed`. */
void synth_fill(struct synth_model *m, uint64_t seed, unsigned threads);
/* Fills `len` bytes at byte offset `off` (multiple of the dtype size) of
 * tensor `i` exactly as synth_fill() would, into dst. */
void synth_fill_range(const struct synth_model *m, size_t i, uint64_t seed,
		      uint64_t off, uint64_t len, void *dst);
void synth_free(struct synth_model *m);

/* ckpt_tensor descriptors pointing at the model's data (count entries). */
void synth_to_ckpt(const struct synth_model *m, ckpt_tensor *out);

/* Monotonic seconds. */
double synth_now(void);

/* Zeroes [p, p+n) so its pages are faulted in before a timed run. A plain
 * memset(0) right after malloc is folded into calloc by the compiler,
 * which leaves the pages untouched (and the timed run faulting them). */
void synth_warm(void *p, size_t n);
/*
 * Reads a byte of every page of [p, p+n) from user space, leaving it
 * as it is. On some VMs the first user-mode touch of a page the kernel
 * wrote (pread) costs a trip to the hypervisor, and so does the next
 * touch of every 4 KiB page after a large region is pre-faulted (shadow
 * paging: ckpt_open's pool evicts the translations of the state's
 * pages; a 2 GiB read took 0.09 s before and 0.66-1.4 s after). A
 * training loop's state is touched every step, so the benchmarks touch
 * theirs after reading it and again after ckpt_open, untimed.
 */
void synth_touch(const void *p, size_t n);
/* sync, then drop the page cache; 0 or -errno (not root, read-only
 * /proc: loads may then be served from the cache). */
int synth_drop_caches(void);
/* rm -r, best effort (no symlinks followed). */
void synth_rm_tree(const char *path);
/* mkdir -p, best effort. */
void synth_mkdir_p(const char *dir);
/* "4G", "256M", "512K", "1.5G", plain bytes. Returns 0 or -1. */
int synth_parse_size(const char *s, uint64_t *out);
/* "4.00 GiB" style; returns buf. */
const char *synth_fmt_bytes(uint64_t v, char *buf, size_t len);

#endif /* CKPT_BENCH_SYNTH_H */
