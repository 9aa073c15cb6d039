/*
 * demo.c - ckpt_demo: what a training loop does with libckpt, end to end.
 *
 * Saves a synthetic transformer (bf16 weights, f32 norms, an i64 step
 * counter) at a few steps, scribbling over the tensors right after each
 * ckpt_save() returns to show that the library has its own copy; waits for
 * each step to be durable, lists the committed steps, then restores the
 * latest one and checks every byte against a regenerated copy.
 *
 * usage: ckpt_demo [DIR] [--size BYTES] [--steps N]
 * Only the public API (ckpt.h) is used.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "synth.h"

#define MIB (1024.0 * 1024.0)

static int fail(const char *what, int err, const char *msg)
{
	fprintf(stderr, "ckpt_demo: %s: %s%s%s\n", what, ckpt_strerror(err),
		msg && *msg ? ": " : "", msg ? msg : "");
	return 1;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: ckpt_demo [DIR] [--size BYTES] [--steps N]\n"
		   "  DIR      checkpoint root (default ./ckpt-demo-data)\n"
		   "  --size   model size, e.g. 64M, 256M (default 128M)\n"
		   "  --steps  steps to save (default 3)\n");
}

/* Compares tensor i of the model (as read back) with the bytes synth
 * would generate for `seed`; returns the first differing byte offset or
 * UINT64_MAX when equal. */
static uint64_t check_tensor(const struct synth_model *m, size_t i,
			     uint64_t seed, uint8_t *scratch,
			     size_t scratch_len)
{
	const struct synth_tensor *t = &m->t[i];
	const uint8_t *got = t->data;

	for (uint64_t off = 0; off < t->nbytes; off += scratch_len) {
		uint64_t len = t->nbytes - off;

		if (len > scratch_len)
			len = scratch_len;
		synth_fill_range(m, i, seed, off, len, scratch);
		if (memcmp(got + off, scratch, len)) {
			for (uint64_t k = 0; k < len; k++)
				if (got[off + k] != scratch[k])
					return off + k;
		}
	}
	return UINT64_MAX;
}

int main(int argc, char **argv)
{
	const char *dir = "ckpt-demo-data";
	uint64_t size = 128ull << 20, first = 100, latest = 0;
	unsigned steps = 3;
	struct synth_model m = { 0 };
	ckpt_tensor *desc = NULL;
	ckpt_read_req *reqs = NULL;
	ckpt_step_info *info = NULL;
	size_t ninfo = 0, scratch_len = 1u << 20;
	uint8_t *scratch = NULL;
	ckpt_settings s;
	ckpt_reader *r = NULL;
	ckpt_stats st;
	ckpt *c = NULL;
	char b1[32];
	double t0, t1, t2;
	int err, rc = 1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
			if (synth_parse_size(argv[++i], &size)) {
				usage(stderr);
				return 2;
			}
		} else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
			steps = (unsigned)strtoul(argv[++i], NULL, 10);
			if (!steps || steps > 1000) {
				usage(stderr);
				return 2;
			}
		} else if (argv[i][0] != '-') {
			dir = argv[i];
		} else {
			usage(stderr);
			return 2;
		}
	}

	err = synth_plan(&m, size, 6, SYNTH_F32_NORMS | SYNTH_STEP_SCALAR);
	if (!err)
		err = synth_alloc(&m);
	desc = calloc(m.count ? m.count : 1, sizeof(*desc));
	reqs = calloc(m.count ? m.count : 1, sizeof(*reqs));
	scratch = malloc(scratch_len);
	if (err || !desc || !reqs || !scratch) {
		fprintf(stderr,
			"ckpt_demo: cannot plan/allocate a %s model: %s\n",
			synth_fmt_bytes(size, b1, sizeof(b1)),
			strerror(err ? -err : ENOMEM));
		goto out;
	}
	synth_to_ckpt(&m, desc);
	printf("ckpt %s: model of %zu tensors, %s (d_model %u, %u layers)\n",
	       ckpt_version_string(), m.count,
	       synth_fmt_bytes(m.total_bytes, b1, sizeof(b1)), m.d_model,
	       m.layers);

	/* Defaults: float codec, 512 MiB staging pool, 4 MiB chunks. Keep
	 * the two newest steps, like a training job would. */
	ckpt_settings_default(&s);
	s.keep_last = 2;
	err = ckpt_open(&c, dir, &s);
	if (err) {
		rc = fail("ckpt_open", err, ckpt_errmsg(NULL));
		goto out;
	}
	/* Resume numbering after whatever an earlier run left. */
	err = ckpt_latest(c, &latest);
	if (!err)
		first = latest + 100;
	else if (err != CKPT_E_NOTFOUND) {
		rc = fail("ckpt_latest", err, ckpt_errmsg(c));
		goto out;
	}

	for (unsigned k = 0; k < steps; k++) {
		uint64_t step = first + 100ull * k;

		synth_fill(&m, step, 0); /* "train" to this step's weights */
		t0 = synth_now();
		err = ckpt_save(c, step, desc, m.count);
		t1 = synth_now();
		if (err) {
			rc = fail("ckpt_save", err, ckpt_errmsg(c));
			goto out;
		}
		/* Training goes on and overwrites the weights in place while
		 * the library writes its staged copy. */
		for (size_t i = 0; i < m.count; i++)
			memset(m.t[i].data, 0x5a, m.t[i].nbytes);
		err = ckpt_wait(c);
		t2 = synth_now();
		if (err) {
			rc = fail("ckpt_wait", err, ckpt_errmsg(c));
			goto out;
		}
		printf("step %llu: ckpt_save returned after %.1f ms, durable and "
		       "committed after %.1f ms (%.0f MiB/s)\n",
		       (unsigned long long)step, (t1 - t0) * 1e3,
		       (t2 - t0) * 1e3, m.total_bytes / MIB / (t2 - t0));
	}

	err = ckpt_list(c, &info, &ninfo);
	if (err) {
		rc = fail("ckpt_list", err, ckpt_errmsg(c));
		goto out;
	}
	printf("committed steps in %s (keep_last=2):\n", dir);
	for (size_t i = 0; i < ninfo; i++)
		printf("  step %-8llu %6llu tensors  raw %10.1f MiB  stored "
		       "%10.1f MiB  ratio %.2f\n",
		       (unsigned long long)info[i].step,
		       (unsigned long long)info[i].tensor_count,
		       info[i].raw_bytes / MIB, info[i].stored_bytes / MIB,
		       info[i].stored_bytes ? (double)info[i].raw_bytes /
						      info[i].stored_bytes :
					      0.0);
	err = ckpt_close(c);
	c = NULL;
	if (err) {
		rc = fail("ckpt_close", err, ckpt_errmsg(NULL));
		goto out;
	}

	/* Restore the newest step into the (scribbled-over) model memory. */
	t0 = synth_now();
	err = ckpt_reader_open(&r, dir, CKPT_LATEST, NULL);
	if (err) {
		rc = fail("ckpt_reader_open", err, ckpt_reader_errmsg(NULL));
		goto out;
	}
	if (ckpt_reader_tensor_count(r) != m.count) {
		fprintf(stderr, "ckpt_demo: step has %zu tensors, saved %zu\n",
			ckpt_reader_tensor_count(r), m.count);
		goto out;
	}
	for (size_t i = 0; i < m.count; i++) {
		reqs[i].name = m.t[i].name;
		reqs[i].dst = m.t[i].data;
		reqs[i].dst_bytes = m.t[i].nbytes;
	}
	err = ckpt_read_batch(r, reqs, m.count);
	t1 = synth_now();
	if (err) {
		rc = fail("ckpt_read_batch", err, ckpt_reader_errmsg(r));
		goto out;
	}
	latest = ckpt_reader_step(r);
	printf("restored step %llu: %zu tensors in %.1f ms (%.0f MiB/s)\n",
	       (unsigned long long)latest, m.count, (t1 - t0) * 1e3,
	       m.total_bytes / MIB / (t1 - t0));

	for (size_t i = 0; i < m.count; i++) {
		ckpt_tensor_info ti;
		size_t idx;
		uint64_t bad;

		err = ckpt_reader_find(r, m.t[i].name, &idx);
		if (!err)
			err = ckpt_reader_tensor(r, idx, &ti);
		if (err) {
			rc = fail(m.t[i].name, err, ckpt_reader_errmsg(r));
			goto out;
		}
		if (ti.dtype != m.t[i].dtype || ti.ndim != m.t[i].ndim ||
		    ti.nbytes != m.t[i].nbytes ||
		    (ti.ndim && memcmp(ti.shape, m.t[i].shape,
				       ti.ndim * sizeof(uint64_t)))) {
			fprintf(stderr, "ckpt_demo: %s: dtype/shape differ\n",
				m.t[i].name);
			goto out;
		}
		bad = check_tensor(&m, i, latest, scratch, scratch_len);
		if (bad != UINT64_MAX) {
			fprintf(stderr,
				"ckpt_demo: %s: byte %llu differs from "
				"what step %llu saved\n",
				m.t[i].name, (unsigned long long)bad,
				(unsigned long long)latest);
			goto out;
		}
	}
	printf("checked every byte of %zu tensors: identical\n", m.count);

	t0 = synth_now();
	err = ckpt_reader_verify(r, NULL, NULL);
	t1 = synth_now();
	if (err) {
		rc = fail("ckpt_reader_verify", err, ckpt_reader_errmsg(r));
		goto out;
	}
	if (!ckpt_reader_stats(r, &st) && st.stored_bytes)
		printf("verify: every file and chunk checksum ok in %.1f ms; "
		       "compression %.1f MiB -> %.1f MiB (ratio %.2f, %llu "
		       "chunks)\n",
		       (t1 - t0) * 1e3, st.raw_bytes / MIB,
		       st.stored_bytes / MIB,
		       (double)st.raw_bytes / st.stored_bytes,
		       (unsigned long long)st.chunks);
	printf("ok\n");
	rc = 0;
out:
	ckpt_reader_close(r);
	if (c)
		ckpt_close(c);
	ckpt_free(info);
	free(scratch);
	free(reqs);
	free(desc);
	synth_free(&m);
	return rc;
}
