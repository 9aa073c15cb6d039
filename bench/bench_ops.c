/*
 * bench_ops.c - the C API's figures for bench/run.py, on a state read from
 * a safetensors file (the harness's workload, the same bytes every peer
 * saves), one JSON object on stdout.
 *
 *   bench_ops --state FILE --dir DIR [--codec none|zstd|float]
 *             [--pool BYTES] [--threads N] [--remote gs://B/P]
 *             [--one NAME] [--slice NAME] [--no-load]
 *   bench_ops --state FILE --limits
 *
 * Save mode: ckpt_open, one save right after the open (its blocking time
 * is "first_block_s"), then the timed save on the same handle, as a
 * training loop does: "block_s" (ckpt_save returned), "durable_s"
 * (ckpt_wait: durable and committed on disk, or in the bucket for gs://
 * alone), "bucket_s" (ckpt_upload_wait, with --remote). Then, page cache
 * dropped before each when root: "load_all_s" (ckpt_reader_open +
 * ckpt_read_batch of every tensor, compared byte for byte),
 * "load_one_s" (open + ckpt_read of --one), "load_slice_s" (open +
 * ckpt_read_slice of the middle eighth of --slice's rows), and with
 * --remote "load_remote_s" (read everything back from the bucket).
 * "rss_save" / "rss_load" are VmHWM after each phase (the high-water mark
 * is reset in between through /proc/self/clear_refs).
 *
 * Limits mode (single core, on the state's bytes): memcpy into warm
 * memory (best of 3), XXH3-64, zstd -1 compress and decompress of 4 MiB
 * blocks. Each "*_bps" is bytes per second of input.
 *
 * Public API of libckpt only; libzstd, libxxhash and jansson directly.
 *
 *   safetensors file --read--> buffers --ckpt_save--> DIR [+ remote]
 *                                   ^--ckpt_read_batch/read/read_slice--'
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>
#include <zstd.h>

#include "ckpt.h"
#include "synth.h"

struct tensor {
	char *name;
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[8];
	uint64_t nbytes;
	void *data;
};

struct state {
	struct tensor *t;
	size_t n;
	uint64_t bytes;
};

static int die(const char *what, int err, const char *msg)
{
	fprintf(stderr, "bench_ops: %s: %s%s%s\n", what,
		err ? ckpt_strerror(err) : "", err && msg && *msg ? ": " : "",
		msg ? msg : "");
	exit(1);
}

static int dtype_of(const char *s, uint64_t *size)
{
	static const struct {
		const char *n;
		int32_t d;
		uint64_t sz;
	} tab[] = { { "BF16", CKPT_BF16, 2 }, { "F32", CKPT_F32, 4 } };

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (!strcmp(s, tab[i].n)) {
			*size = tab[i].sz;
			return tab[i].d;
		}
	return -1;
}

static void read_full(int fd, void *buf, uint64_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t k = pread(fd, p, len > (1u << 30) ? (1u << 30) : len,
				  (off_t)off);

		if (k <= 0)
			die("read state", 0, k ? strerror(errno) : "short");
		p += k;
		off += (uint64_t)k;
		len -= (uint64_t)k;
	}
}

/* Reads a safetensors file of BF16/F32 tensors into 64-byte aligned
 * buffers, in file order, and touches them (synth_touch). The first save
 * after open took 1.1-1.4 s for 512 MiB with a cold state and 0.11-0.41 s
 * with a touched one. */
static void load_state(const char *path, struct state *s)
{
	uint64_t hlen;
	char *hdr;
	json_t *root, *v;
	json_error_t jerr;
	const char *key;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		die(path, -errno, NULL);
	read_full(fd, &hlen, 8, 0);
	hdr = malloc(hlen + 1);
	if (!hdr)
		die("header", -ENOMEM, NULL);
	read_full(fd, hdr, hlen, 8);
	hdr[hlen] = 0;
	root = json_loads(hdr, 0, &jerr);
	if (!root || !json_is_object(root))
		die(path, 0, jerr.text);
	s->t = calloc(json_object_size(root), sizeof(*s->t));
	json_object_foreach (root, key, v) {
		struct tensor *t = &s->t[s->n];
		json_t *shape = json_object_get(v, "shape");
		json_t *offs = json_object_get(v, "data_offsets");
		uint64_t esz = 0, b, e, count = 1;
		const char *key_dt;
		size_t j;
		json_t *d;

		if (!strcmp(key, "__metadata__"))
			continue;
		key_dt = json_string_value(json_object_get(v, "dtype"));
		t->dtype = dtype_of(key_dt ? key_dt : "", &esz);
		if (t->dtype < 0 || !json_is_array(shape) ||
		    json_array_size(shape) > 8 || json_array_size(offs) != 2)
			die(path, 0, key);
		json_array_foreach (shape, j, d) {
			t->shape[j] = (uint64_t)json_integer_value(d);
			count *= t->shape[j];
		}
		t->ndim = (uint32_t)json_array_size(shape);
		b = (uint64_t)json_integer_value(json_array_get(offs, 0));
		e = (uint64_t)json_integer_value(json_array_get(offs, 1));
		t->nbytes = e - b;
		if (t->nbytes != count * esz)
			die(path, 0, key);
		t->name = strdup(key);
		t->data = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
		if (!t->name || !t->data)
			die("state", -ENOMEM, key);
		read_full(fd, t->data, t->nbytes, 8 + hlen + b);
		synth_touch(t->data, t->nbytes);
		s->bytes += t->nbytes;
		s->n++;
	}
	json_decref(root);
	free(hdr);
	close(fd);
}

static uint64_t hwm_bytes(void)
{
	char line[256];
	uint64_t v = 0;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			v = strtoull(line + 6, NULL, 10) * 1024;
	if (f)
		fclose(f);
	return v;
}

static void hwm_reset(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (write(fd, "5", 1) != 1) {
			/* older kernel: the mark is not reset */
		}
		close(fd);
	}
}

static const struct tensor *find(const struct state *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	die("no such tensor", 0, name);
	return NULL;
}

static void limits(const struct state *s)
{
	uint8_t *dst = aligned_alloc(64, (s->bytes + 63) / 64 * 64);
	size_t cap = ZSTD_compressBound(4u << 20);
	uint8_t *cbuf = malloc(cap), *dbuf = malloc(4u << 20);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_DCtx *dc = ZSTD_createDCtx();
	double best = 1e30, t0, xxh_s, zc_s = 0, zd_s = 0;
	uint64_t h = 0, zin = 0, zout = 0;

	if (!dst || !cbuf || !dbuf || !cc || !dc)
		die("limits", -ENOMEM, NULL);
	synth_warm(dst, s->bytes);
	for (int rep = 0; rep < 3; rep++) {
		uint64_t off = 0;

		t0 = synth_now();
		for (size_t i = 0; i < s->n; i++) {
			memcpy(dst + off, s->t[i].data, s->t[i].nbytes);
			off += s->t[i].nbytes;
		}
		t0 = synth_now() - t0;
		best = t0 < best ? t0 : best;
	}
	t0 = synth_now();
	for (size_t i = 0; i < s->n; i++)
		h ^= XXH3_64bits(s->t[i].data, s->t[i].nbytes);
	xxh_s = synth_now() - t0;
	/* zstd -1 over the contiguous copy, 4 MiB blocks, at most 512 MiB */
	for (uint64_t off = 0; off < s->bytes && zin < (512u << 20);
	     off += 4u << 20) {
		size_t len = s->bytes - off < (4u << 20) ? s->bytes - off :
							   (4u << 20);
		size_t c, d;

		t0 = synth_now();
		c = ZSTD_compressCCtx(cc, cbuf, cap, dst + off, len, 1);
		zc_s += synth_now() - t0;
		if (ZSTD_isError(c))
			die("zstd", 0, ZSTD_getErrorName(c));
		t0 = synth_now();
		d = ZSTD_decompressDCtx(dc, dbuf, 4u << 20, cbuf, c);
		zd_s += synth_now() - t0;
		if (ZSTD_isError(d) || d != len)
			die("unzstd", 0, "round trip");
		zin += len;
		zout += c;
	}
	printf("{\"bytes\": %llu, \"tensors\": %zu, \"memcpy_bps\": %.0f, "
	       "\"xxh3_bps\": %.0f, \"zstd1_bps\": %.0f, \"unzstd1_bps\": "
	       "%.0f, \"zstd1_ratio\": %.4f, \"xxh3\": \"%016llx\"}\n",
	       (unsigned long long)s->bytes, s->n, s->bytes / best,
	       s->bytes / xxh_s, zin / zc_s, zin / zd_s,
	       zout ? (double)zin / (double)zout : 0.0, (unsigned long long)h);
	ZSTD_freeCCtx(cc);
	ZSTD_freeDCtx(dc);
	free(cbuf);
	free(dbuf);
	free(dst);
}

static double load_all(const struct state *s, const char *loc,
		       const ckpt_settings *set, uint64_t step)
{
	ckpt_read_req *reqs = calloc(s->n, sizeof(*reqs));
	void **dst = calloc(s->n, sizeof(*dst));
	ckpt_reader *r;
	double t0;
	int err;

	for (size_t i = 0; i < s->n; i++) {
		dst[i] = malloc(s->t[i].nbytes);
		if (!dst[i])
			die("load", -ENOMEM, NULL);
		synth_warm(dst[i], s->t[i].nbytes); /* warm, untimed */
		reqs[i].name = s->t[i].name;
		reqs[i].dst = dst[i];
		reqs[i].dst_bytes = s->t[i].nbytes;
	}
	t0 = synth_now();
	err = ckpt_reader_open(&r, loc, step, set);
	if (err)
		die("ckpt_reader_open", err, ckpt_reader_errmsg(NULL));
	err = ckpt_read_batch(r, reqs, s->n);
	if (err)
		die("ckpt_read_batch", err, ckpt_reader_errmsg(r));
	t0 = synth_now() - t0;
	ckpt_reader_close(r);
	for (size_t i = 0; i < s->n; i++) {
		if (memcmp(dst[i], s->t[i].data, s->t[i].nbytes))
			die("load", 0, "a tensor differs from what was saved");
		free(dst[i]);
	}
	free(dst);
	free(reqs);
	return t0;
}

/* Opens a reader and reads one tensor (slice: the middle eighth of its
 * first dimension), checked against the state. */
static double load_part(const struct state *s, const char *loc,
			const ckpt_settings *set, uint64_t step,
			const char *name, int slice)
{
	const struct tensor *t = find(s, name);
	uint64_t off[8] = { 0 }, ext[8], row = t->nbytes / t->shape[0];
	uint64_t bytes = t->nbytes;
	uint8_t *dst;
	ckpt_reader *r;
	double t0;
	int err;

	memcpy(ext, t->shape, sizeof(ext));
	if (slice) {
		ext[0] = t->shape[0] / 8 ? t->shape[0] / 8 : 1;
		off[0] = (t->shape[0] - ext[0]) / 2;
		bytes = ext[0] * row;
	}
	dst = malloc(bytes);
	if (!dst)
		die("load", -ENOMEM, NULL);
	synth_warm(dst, bytes);
	t0 = synth_now();
	err = ckpt_reader_open(&r, loc, step, set);
	if (err)
		die("ckpt_reader_open", err, ckpt_reader_errmsg(NULL));
	err = slice ? ckpt_read_slice(r, name, off, ext, dst, bytes) :
		      ckpt_read(r, name, dst, bytes);
	if (err)
		die(slice ? "ckpt_read_slice" : "ckpt_read", err,
		    ckpt_reader_errmsg(r));
	t0 = synth_now() - t0;
	ckpt_reader_close(r);
	if (memcmp(dst, (uint8_t *)t->data + off[0] * row, bytes))
		die("load", 0, "a part differs from what was saved");
	free(dst);
	return t0;
}

int main(int argc, char **argv)
{
	const char *path = NULL, *dir = NULL, *remote = NULL, *codec = "float";
	const char *one = NULL, *sl = NULL;
	uint64_t pool = 0;
	unsigned threads = 0;
	int lim = 0, noload = 0, err, dropped = 0;
	struct state s = { 0 };
	ckpt_tensor *desc;
	ckpt_settings set;
	ckpt *c = NULL;
	double t0, first, block, durable, bucket = 0;
	uint64_t rss_save;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";

		if (!strcmp(a, "--limits"))
			lim = 1;
		else if (!strcmp(a, "--no-load"))
			noload = 1;
		else if (i + 1 >= argc)
			die("usage", 0, "see the top of bench/bench_ops.c");
		else if (!strcmp(a, "--state"))
			path = v;
		else if (!strcmp(a, "--dir"))
			dir = v;
		else if (!strcmp(a, "--remote"))
			remote = v;
		else if (!strcmp(a, "--codec"))
			codec = v;
		else if (!strcmp(a, "--one"))
			one = v;
		else if (!strcmp(a, "--slice"))
			sl = v;
		else if (!strcmp(a, "--threads"))
			threads = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(a, "--pool") && synth_parse_size(v, &pool))
			die("usage", 0, "bad --pool");
		else if (strcmp(a, "--pool"))
			die("usage", 0, a);
		i += strcmp(a, "--limits") && strcmp(a, "--no-load");
	}
	if (!path || (!lim && !dir && !remote))
		die("usage", 0, "see the top of bench/bench_ops.c");
	load_state(path, &s);
	if (lim) {
		limits(&s);
		return 0;
	}
	desc = calloc(s.n, sizeof(*desc));
	for (size_t i = 0; i < s.n; i++)
		desc[i] = (ckpt_tensor){ .name = s.t[i].name,
					 .dtype = s.t[i].dtype,
					 .ndim = s.t[i].ndim,
					 .shape = s.t[i].shape,
					 .data = s.t[i].data,
					 .nbytes = s.t[i].nbytes };
	ckpt_settings_default(&set);
	set.codec = !strcmp(codec, "none") ? CKPT_CODEC_NONE :
		    !strcmp(codec, "zstd") ? CKPT_CODEC_ZSTD :
					     CKPT_CODEC_FLOAT;
	set.threads = threads;
	if (pool)
		set.staging_bytes = pool;
	if (dir && remote)
		set.remote = remote;
	hwm_reset();
	err = ckpt_open(&c, dir ? dir : remote, &set);
	if (err)
		die("ckpt_open", err, ckpt_errmsg(NULL));
	/* A training loop runs steps, which touch its whole state, between
	 * ckpt_open and its first save: so does this (synth.h). */
	for (size_t i = 0; i < s.n; i++)
		synth_touch(s.t[i].data, s.t[i].nbytes);
	t0 = synth_now();
	err = ckpt_save(c, 1, desc, s.n);
	first = synth_now() - t0;
	if (!err)
		err = ckpt_wait(c);
	if (!err && set.remote)
		err = ckpt_upload_wait(c, -1);
	t0 = synth_now();
	if (!err)
		err = ckpt_save(c, 2, desc, s.n);
	block = synth_now() - t0;
	if (!err)
		err = ckpt_wait(c);
	durable = synth_now() - t0;
	if (!err && set.remote) {
		err = ckpt_upload_wait(c, -1);
		bucket = synth_now() - t0;
	}
	if (err)
		die("save", err, ckpt_errmsg(c));
	err = ckpt_close(c);
	if (err)
		die("ckpt_close", err, ckpt_errmsg(NULL));
	rss_save = hwm_bytes();
	printf("{\"bytes\": %llu, \"tensors\": %zu, \"codec\": \"%s\", "
	       "\"first_block_s\": %.6f, \"block_s\": %.6f, \"durable_s\": "
	       "%.6f, \"bucket_s\": %.6f, \"rss_save\": %llu",
	       (unsigned long long)s.bytes, s.n, codec, first, block, durable,
	       bucket, (unsigned long long)rss_save);
	if (!noload) {
		const char *loc = dir ? dir : remote;

		hwm_reset();
		dropped = synth_drop_caches() == 0;
		printf(", \"load_all_s\": %.6f", load_all(&s, loc, &set, 2));
		if (one) {
			synth_drop_caches();
			printf(", \"load_one_s\": %.6f",
			       load_part(&s, loc, &set, 2, one, 0));
		}
		if (sl) {
			synth_drop_caches();
			printf(", \"load_slice_s\": %.6f",
			       load_part(&s, loc, &set, 2, sl, 1));
		}
		if (dir && remote)
			printf(", \"load_remote_s\": %.6f",
			       load_all(&s, remote, &set, 2));
		printf(", \"rss_load\": %llu, \"caches_dropped\": %s",
		       (unsigned long long)hwm_bytes(),
		       dropped ? "true" : "false");
	}
	printf("}\n");
	return 0;
}
