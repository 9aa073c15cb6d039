/*
 * bench_core.c - core performance of libckpt against baselines measured in
 * the same run.
 *
 * For a bf16 transformer-like state (default 4 GiB, a few hundred tensors,
 * values N(0, 0.02)) it measures:
 *   - ckpt_save() blocking time with a staging pool larger than the state
 *     vs memcpy of the same bytes into pre-faulted memory;
 *   - the same in borrow mode (CKPT_SAVE_BORROW: validation only, no
 *     copy; pool --borrow-pool), first save after ckpt_open and a later
 *     one, and the time until the engine released the caller's memory;
 *     --stall-only --reps N runs just memcpy, the copying save (codec
 *     none) and the borrowed one, interleaved N times, and prints the
 *     median with min and max of each and of their ratios;
 *   - time to durable (ckpt_save .. ckpt_wait) with codec none and float,
 *     as bandwidth vs fio's O_DIRECT sequential write (--fio-write-bw);
 *   - load (ckpt_reader_open + ckpt_read_batch of every tensor, page cache
 *     dropped when permitted) vs fio's O_DIRECT read (--fio-read-bw);
 *   - peak RSS during a save through a small (512 MiB) pool, in a child
 *     process so earlier phases do not pollute its high-water mark.
 * --finetune runs only the fine-tuning case (issue 10): the first 80% of
 * the state's bytes (tensors in order) are frozen and the rest change
 * between two saves; the second save is timed (ckpt_save .. ckpt_wait)
 * and its step's file bytes counted, with deduplication (CKPT_F_DEDUP)
 * and without, interleaved --reps times, and their ratios printed. The
 * first save's time is printed too (what dedup's extra XXH3-128 costs).
 * With --remote gs://BUCKET/PREFIX the directory has that remote and each
 * save is timed until it is committed in the bucket too (ckpt_upload_wait),
 * each configuration under its own prefix.
 * run_core.sh runs fio and passes its bandwidths here. Every loaded byte
 * is compared with what was saved; a mismatch or API error exits 1.
 * Targets are reported, not enforced (exit 0) unless --strict.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "synth.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

struct opts {
	const char *dir;
	uint64_t size;
	uint64_t pool;
	uint64_t rss_pool;
	uint64_t borrow_pool;
	unsigned threads, reps;
	double fio_write_bw; /* bytes/s, 0 = not measured */
	double fio_read_bw;
	int json, keep, no_rss, strict, stall_only, finetune;
	const char *remote; /* --finetune: the directory's remote */
};

struct rss_result {
	int err;
	uint64_t hwm;   /* bytes */
	uint64_t state; /* bytes of the caller's tensors */
	double durable_s;
	char msg[512];
};

struct results {
	size_t tensors;
	uint32_t d_model, layers;
	double fill_s, open_none_s;
	double memcpy_s;
	double block_none_s, durable_none_s;
	double block_float_s, durable_float_s;
	double first_block_none_s, first_block_float_s;
	double first_block_borrow_s, block_borrow_s, release_borrow_s,
		durable_borrow_s;
	uint64_t raw_float, stored_float;
	double load_none_s, load_float_s;
	int caches_dropped;
	char drop_note[128];
	struct rss_result rss;
	int rss_done;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: bench_core --dir DIR [options]\n"
		"  --dir DIR          scratch directory (a subdirectory is created\n"
		"                     and removed)\n"
		"  --size BYTES       state size (default 4G; e.g. 256M for a quick run)\n"
		"  --pool BYTES       staging pool for the main saves (default size*1.125)\n"
		"  --rss-pool BYTES   staging pool of the peak-RSS save (default 512M)\n"
		"  --borrow-pool BYTES staging pool of the borrowed saves (default 512M)\n"
		"  --stall-only       only memcpy, copying and borrowed save stalls\n"
		"  --reps N           repetitions of --stall-only (default 5)\n"
		"  --finetune         only the fine-tuning dedup case (80%% frozen)\n"
		"  --remote gs://B/P  --finetune: saves go to a directory with that\n"
		"                     remote, timed until committed in the bucket\n"
		"  --threads N        library worker threads (default: CPUs)\n"
		"  --fio-write-bw B/s fio O_DIRECT sequential write bandwidth\n"
		"  --fio-read-bw B/s  fio O_DIRECT sequential read bandwidth\n"
		"  --no-rss           skip the peak-RSS phase\n"
		"  --keep             keep the checkpoints written\n"
		"  --json             print JSON instead of a table\n"
		"  --strict           exit 3 if a target is missed\n");
}

static int fail(const char *what, int err, const char *msg)
{
	fprintf(stderr, "bench_core: %s: %s%s%s\n", what, ckpt_strerror(err),
		msg && *msg ? ": " : "", msg ? msg : "");
	return 1;
}

static uint64_t status_kib(const char *key)
{
	char line[256];
	size_t kl = strlen(key);
	uint64_t v = 0;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = strtoull(line + kl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static uint64_t peak_rss_bytes(void)
{
	uint64_t kib = status_kib("VmHWM");
	struct rusage ru;

	if (!kib && !getrusage(RUSAGE_SELF, &ru))
		kib = (uint64_t)ru.ru_maxrss;
	return kib * 1024;
}

/* ---- peak RSS, in a child process ---- */

static void rss_child(const struct opts *o, const char *root,
		      struct rss_result *res)
{
	struct synth_model m;
	ckpt_tensor *desc = NULL;
	ckpt_settings s;
	ckpt *c = NULL;
	double t0;
	int err;

	memset(res, 0, sizeof(*res));
	err = synth_plan(&m, o->size, 0, SYNTH_EXACT);
	if (!err)
		err = synth_alloc(&m);
	desc = calloc(m.count ? m.count : 1, sizeof(*desc));
	if (err || !desc) {
		res->err = err ? err : -ENOMEM;
		snprintf(res->msg, sizeof(res->msg),
			 "cannot allocate the state");
		goto out;
	}
	synth_fill(&m, 7, 0);
	synth_to_ckpt(&m, desc);
	res->state = m.total_bytes;

	ckpt_settings_default(&s);
	s.staging_bytes = o->rss_pool;
	s.threads = o->threads;
	err = ckpt_open(&c, root, &s);
	if (err) {
		res->err = err;
		snprintf(res->msg, sizeof(res->msg), "ckpt_open: %s",
			 ckpt_errmsg(NULL));
		goto out;
	}
	t0 = synth_now();
	err = ckpt_save(c, 1, desc, m.count);
	if (!err)
		err = ckpt_wait(c);
	res->durable_s = synth_now() - t0;
	if (err) {
		res->err = err;
		snprintf(res->msg, sizeof(res->msg), "save: %s",
			 ckpt_errmsg(c));
		goto out;
	}
	err = ckpt_close(c);
	c = NULL;
	if (err) {
		res->err = err;
		snprintf(res->msg, sizeof(res->msg), "ckpt_close: %s",
			 ckpt_errmsg(NULL));
	}
out:
	res->hwm = peak_rss_bytes();
	ckpt_close(c);
	free(desc);
	synth_free(&m);
}

static int run_rss(const struct opts *o, const char *base,
		   struct rss_result *res)
{
	char root[4200];
	int pfd[2], status;
	pid_t pid;
	ssize_t n;

	snprintf(root, sizeof(root), "%s/rss", base);
	if (pipe(pfd))
		return -errno;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		struct rss_result r;

		close(pfd[0]);
		rss_child(o, root, &r);
		n = write(pfd[1], &r, sizeof(r));
		_exit(n == (ssize_t)sizeof(r) ? 0 : 1);
	}
	close(pfd[1]);
	n = read(pfd[0], res, sizeof(*res));
	close(pfd[0]);
	waitpid(pid, &status, 0);
	if (!o->keep)
		synth_rm_tree(root);
	if (n != (ssize_t)sizeof(*res)) {
		memset(res, 0, sizeof(*res));
		res->err = -ECHILD;
		snprintf(res->msg, sizeof(res->msg), "child died (status 0x%x)",
			 status);
	}
	return res->err;
}

/* ---- main phases ---- */

/*
 * Opens a handle, saves once right after the open (step + 1000, timed as
 * first_block_s), then saves `step` on the same handle, which is what is
 * reported: a training job opens its handle once and saves many times.
 * Between the open and the first save the state is touched, untimed, as
 * a loop's training steps touch it (synth_touch in synth.h says why).
 */
static int save_one(const struct opts *o, const char *root, int codec,
		    int borrow, uint64_t step, const ckpt_tensor *desc,
		    size_t n, double *open_s, double *first_block_s,
		    double *block_s, double *durable_s, double *release_s)
{
	ckpt_save_opts so;
	ckpt_settings s;
	ckpt *c = NULL;
	double t0, t1, t2, tr = 0;
	int err;

	ckpt_save_opts_default(&so);
	so.flags = borrow ? CKPT_SAVE_BORROW : 0;
	ckpt_settings_default(&s);
	s.staging_bytes = borrow ? o->borrow_pool : o->pool;
	s.codec = codec;
	s.threads = o->threads;
	t0 = synth_now();
	err = ckpt_open(&c, root, &s);
	if (err)
		return fail("ckpt_open", err, ckpt_errmsg(NULL));
	if (open_s)
		*open_s = synth_now() - t0;
	for (size_t i = 0; i < n; i++)
		synth_touch(desc[i].data, desc[i].nbytes);
	t0 = synth_now();
	err = ckpt_save_ex(c, step + 1000, desc, n, &so);
	*first_block_s = synth_now() - t0;
	if (!err)
		err = ckpt_wait(c);
	if (err) {
		fail("first save", err, ckpt_errmsg(c));
		ckpt_close(c);
		return 1;
	}
	t0 = synth_now();
	err = ckpt_save_ex(c, step, desc, n, &so);
	t1 = synth_now();
	if (!err && borrow) { /* the caller may write its tensors again */
		err = ckpt_wait_released(c, -1);
		tr = synth_now();
	}
	if (!err)
		err = ckpt_wait(c);
	t2 = synth_now();
	if (err) {
		fail("save", err, ckpt_errmsg(c));
		ckpt_close(c);
		return 1;
	}
	*block_s = t1 - t0;
	*durable_s = t2 - t0;
	if (release_s)
		*release_s = borrow ? tr - t0 : 0;
	err = ckpt_close(c);
	if (err)
		return fail("ckpt_close", err, ckpt_errmsg(NULL));
	return 0;
}

static int load_one(const struct opts *o, const char *root, uint64_t step,
		    const struct synth_model *m, uint8_t *dest,
		    ckpt_read_req *reqs, double *load_s, ckpt_stats *st)
{
	ckpt_settings s;
	ckpt_reader *r = NULL;
	uint64_t off = 0;
	double t0;
	int err;

	ckpt_settings_default(&s);
	s.threads = o->threads;
	for (size_t i = 0; i < m->count; i++) {
		memset(&reqs[i], 0, sizeof(reqs[i]));
		reqs[i].name = m->t[i].name;
		reqs[i].dst = dest + off;
		reqs[i].dst_bytes = m->t[i].nbytes;
		off += m->t[i].nbytes;
	}
	synth_warm(dest, off); /* warm and clear, outside the timing */
	t0 = synth_now();
	err = ckpt_reader_open(&r, root, step, &s);
	if (err)
		return fail("ckpt_reader_open", err, ckpt_reader_errmsg(NULL));
	err = ckpt_read_batch(r, reqs, m->count);
	*load_s = synth_now() - t0;
	if (err) {
		fail("ckpt_read_batch", err, ckpt_reader_errmsg(r));
		ckpt_reader_close(r);
		return 1;
	}
	if (st && (err = ckpt_reader_stats(r, st)))
		memset(st, 0, sizeof(*st));
	ckpt_reader_close(r);

	off = 0;
	for (size_t i = 0; i < m->count; i++) {
		if (memcmp(dest + off, m->t[i].data, m->t[i].nbytes)) {
			fprintf(stderr,
				"bench_core: step %llu: tensor %s "
				"differs from what was saved\n",
				(unsigned long long)step, m->t[i].name);
			return 1;
		}
		off += m->t[i].nbytes;
	}
	return 0;
}

static double ratio(double a, double b)
{
	return a > 0 && b > 0 ? a / b : 0.0;
}

struct row {
	const char *key, *label;
	double value; /* in `unit` */
	const char *unit;
	const char *base_label;
	double base;     /* in `unit`, 0 = none */
	double r;        /* 0 = n/a */
	const char *cmp; /* "<=", ">=" or NULL */
	double target;
};

static int row_ok(const struct row *w)
{
	if (!w->cmp || w->r <= 0)
		return -1; /* not judged */
	return w->cmp[0] == '<' ? w->r <= w->target : w->r >= w->target;
}

static void print_table(const struct opts *o, const struct synth_model *m,
			const struct results *res, const struct row *rows,
			size_t nrows)
{
	char b1[32], b2[32];

	printf("bench_core: ckpt %s, state %s in %zu bf16 tensors (d_model "
	       "%u, %u layers), staging pool %s, threads %s\n",
	       ckpt_version_string(),
	       synth_fmt_bytes(m->total_bytes, b1, sizeof(b1)), m->count,
	       m->d_model, m->layers, synth_fmt_bytes(o->pool, b2, sizeof(b2)),
	       o->threads ? "set" : "default (CPUs)");
	printf("page cache before loads: %s\n", res->drop_note);
	printf("%-34s %14s   %-26s %7s  %-9s\n", "metric", "value", "baseline",
	       "ratio", "target");
	for (size_t i = 0; i < nrows; i++) {
		const struct row *w = &rows[i];
		char val[32], base[48], rs[16], tg[32];
		int ok = row_ok(w);

		snprintf(val, sizeof(val), "%.3f %s", w->value, w->unit);
		if (w->base > 0)
			snprintf(base, sizeof(base), "%s %.3f %s",
				 w->base_label, w->base, w->unit);
		else
			snprintf(base, sizeof(base), "%s",
				 w->base_label ? "(not measured)" : "");
		if (w->r > 0)
			snprintf(rs, sizeof(rs), "%.3f", w->r);
		else
			snprintf(rs, sizeof(rs), "%s", w->cmp ? "n/a" : "");
		if (w->cmp)
			snprintf(tg, sizeof(tg), "%s %.2f %s", w->cmp,
				 w->target,
				 ok < 0 ? "" :
				 ok     ? "ok" :
					  "MISSED");
		else
			tg[0] = 0;
		printf("%-34s %14s   %-26s %7s  %s\n", w->label, val, base, rs,
		       tg);
	}
}

static void print_json(const struct opts *o, const struct synth_model *m,
		       const struct results *res, const struct row *rows,
		       size_t nrows)
{
	printf("{\n  \"version\": \"%s\",\n  \"state_bytes\": %llu,\n"
	       "  \"tensors\": %zu,\n  \"pool_bytes\": %llu,\n"
	       "  \"rss_pool_bytes\": %llu,\n  \"threads\": %u,\n"
	       "  \"caches_dropped\": %s,\n  \"fio_write_bw\": %.0f,\n"
	       "  \"fio_read_bw\": %.0f,\n  \"memcpy_s\": %.6f,\n"
	       "  \"open_prefault_s\": %.6f,\n  \"float_raw_bytes\": %llu,\n"
	       "  \"float_stored_bytes\": %llu,\n  \"metrics\": {\n",
	       ckpt_version_string(), (unsigned long long)m->total_bytes,
	       m->count, (unsigned long long)o->pool,
	       (unsigned long long)o->rss_pool, o->threads,
	       res->caches_dropped ? "true" : "false", o->fio_write_bw,
	       o->fio_read_bw, res->memcpy_s, res->open_none_s,
	       (unsigned long long)res->raw_float,
	       (unsigned long long)res->stored_float);
	for (size_t i = 0; i < nrows; i++) {
		const struct row *w = &rows[i];
		int ok = row_ok(w);

		printf("    \"%s\": {\"value\": %.6f, \"unit\": \"%s\", "
		       "\"baseline\": %.6f, \"ratio\": %.6f, \"target\": "
		       "\"%s %.2f\", \"ok\": %s}%s\n",
		       w->key, w->value, w->unit, w->base, w->r,
		       w->cmp ? w->cmp : "", w->cmp ? w->target : 0.0,
		       ok < 0 ? "null" :
		       ok     ? "true" :
				"false",
		       i + 1 < nrows ? "," : "");
	}
	printf("  }\n}\n");
}

/* ---- --stall-only: interleaved repetitions, median [min, max] ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void print_stat(const char *label, double *v, unsigned n,
		       const char *unit)
{
	qsort(v, n, sizeof(*v), cmp_double);
	printf("%-40s median %9.5f %s  [%.5f, %.5f]\n", label,
	       n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, unit, v[0],
	       v[n - 1]);
}

/* Each repetition: memcpy, a copying save (codec none, pool --pool), a
 * borrowed one (pool --borrow-pool), each on a fresh handle (the first
 * save after ckpt_open) and again on it; ratios within a repetition. */
static int stall_only(const struct opts *o, const struct synth_model *m,
		      const ckpt_tensor *desc, uint8_t *dest,
		      const char *root)
{
	enum { MC, CF, CB, BF, BB, BR, RCF, RCB, RBF, RBB, NV };
	static const char *const lab[NV] = {
		"memcpy",
		"copying save, first after open",
		"copying save, later",
		"borrowed save, first after open",
		"borrowed save, later",
		"borrowed save, until released",
		"ratio copying first / memcpy",
		"ratio copying later / memcpy",
		"ratio borrowed first / memcpy",
		"ratio borrowed later / memcpy",
	};
	double v[NV][100], dur;
	char b1[32];
	unsigned r;

	for (r = 0; r < o->reps; r++) {
		double t0 = synth_now();
		uint64_t off = 0;

		for (size_t i = 0; i < m->count; i++) {
			memcpy(dest + off, m->t[i].data, m->t[i].nbytes);
			off += m->t[i].nbytes;
		}
		v[MC][r] = synth_now() - t0;
		if (save_one(o, root, CKPT_CODEC_NONE, 0, 10 + 10 * r, desc,
			     m->count, NULL, &v[CF][r], &v[CB][r], &dur,
			     NULL) ||
		    save_one(o, root, CKPT_CODEC_NONE, 1, 11 + 10 * r, desc,
			     m->count, NULL, &v[BF][r], &v[BB][r], &dur,
			     &v[BR][r]))
			return 1;
		v[RCF][r] = ratio(v[CF][r], v[MC][r]);
		v[RCB][r] = ratio(v[CB][r], v[MC][r]);
		v[RBF][r] = ratio(v[BF][r], v[MC][r]);
		v[RBB][r] = ratio(v[BB][r], v[MC][r]);
		synth_rm_tree(root);
	}
	printf("bench_core --stall-only: state %s in %zu tensors, %u "
	       "repetitions, pools %llu (copying) and %llu (borrowed) "
	       "bytes\n",
	       synth_fmt_bytes(m->total_bytes, b1, sizeof(b1)), m->count,
	       o->reps, (unsigned long long)o->pool,
	       (unsigned long long)o->borrow_pool);
	for (int k = 0; k < NV; k++)
		print_stat(lab[k], v[k], o->reps, k < RCF ? "s" : "x");
	return 0;
}

/* Trainable tensors (those after the first 80% of bytes) refilled with
 * `seed`. */
static void finetune_fill(struct synth_model *m, size_t first, uint64_t seed)
{
	for (size_t i = first; i < m->count; i++)
		synth_fill_range(m, i, seed, 0, m->t[i].nbytes, m->t[i].data);
}

/* One configuration: save, change the trainable part, timed save; its
 * step's file bytes (read back and compared byte for byte). */
static int finetune_once(const struct opts *o, struct synth_model *m,
			 size_t first, const ckpt_tensor *desc, uint8_t *dest,
			 ckpt_read_req *reqs, const char *root, int dedup,
			 double *first_s, double *second_s, uint64_t *bytes)
{
	static unsigned run;
	char remote[1024];
	ckpt_settings s;
	ckpt_stats st;
	ckpt *c = NULL;
	double t0, load_s;
	int err;

	synth_rm_tree(root);
	finetune_fill(m, first, 42);
	ckpt_settings_default(&s);
	s.staging_bytes = o->pool;
	s.threads = o->threads;
	s.flags = dedup ? CKPT_F_DEDUP : 0;
	if (o->remote) { /* a fresh prefix: the bucket keeps earlier runs */
		snprintf(remote, sizeof(remote), "%s/ft%d-%u-%d", o->remote,
			 (int)getpid(), run++, dedup);
		s.remote = remote;
	}
	err = ckpt_open(&c, root, &s);
	if (err)
		return fail("ckpt_open", err, ckpt_errmsg(NULL));
	t0 = synth_now();
	err = ckpt_save(c, 1, desc, m->count);
	if (!err)
		err = ckpt_wait(c);
	if (!err && o->remote)
		err = ckpt_upload_wait(c, -1);
	*first_s = synth_now() - t0;
	finetune_fill(m, first, 43);
	t0 = synth_now();
	if (!err)
		err = ckpt_save(c, 2, desc, m->count);
	if (!err)
		err = ckpt_wait(c);
	if (!err && o->remote)
		err = ckpt_upload_wait(c, -1);
	*second_s = synth_now() - t0;
	if (err) {
		fail("fine-tuning save", err, ckpt_errmsg(c));
		ckpt_close(c);
		return 1;
	}
	ckpt_close(c);
	synth_drop_caches();
	if (load_one(o, root, 2, m, dest, reqs, &load_s, &st))
		return 1;
	*bytes = st.file_bytes;
	return 0;
}

static int finetune(const struct opts *o, struct synth_model *m,
		    const ckpt_tensor *desc, uint8_t *dest, ckpt_read_req *reqs,
		    const char *root)
{
	enum { F0, F1, S0, S1, B0, B1, RS, RB, RF, NV };
	static const char *const lab[NV] = {
		"first save, dedup off (s)",
		"first save, dedup on (s)",
		"second save, dedup off (s)",
		"second save, dedup on (s)",
		"second save bytes, dedup off (MiB)",
		"second save bytes, dedup on (MiB)",
		"ratio second save time on / off",
		"ratio second save bytes on / off",
		"ratio first save time on / off",
	};
	double v[NV][100];
	uint64_t frozen = 0, b[2];
	size_t first = 0;
	char b1[32], b2[32];

	while (first < m->count && frozen < m->total_bytes / 10 * 8)
		frozen += m->t[first++].nbytes;
	for (unsigned r = 0; r < o->reps; r++) {
		for (int d = 0; d < 2; d++) {
			int k = (int)(r & 1) ^ d; /* alternate the order */

			if (finetune_once(o, m, first, desc, dest, reqs, root,
					  k, &v[F0 + k][r], &v[S0 + k][r],
					  &b[k]))
				return 1;
			v[B0 + k][r] = (double)b[k] / MIB;
		}
		v[RS][r] = ratio(v[S1][r], v[S0][r]);
		v[RB][r] = ratio(v[B1][r], v[B0][r]);
		v[RF][r] = ratio(v[F1][r], v[F0][r]);
	}
	synth_rm_tree(root);
	printf("bench_core --finetune: state %s in %zu tensors, %s frozen "
	       "(%zu tensors), codec float, %u repetitions, saves timed to "
	       "%s\n",
	       synth_fmt_bytes(m->total_bytes, b1, sizeof(b1)), m->count,
	       synth_fmt_bytes(frozen, b2, sizeof(b2)), first, o->reps,
	       o->remote ? "committed in the remote too" : "durable");
	for (int k = 0; k < NV; k++)
		print_stat(lab[k], v[k], o->reps, k < RS ? "" : "x");
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .size = 4ull << 30,
			  .rss_pool = 512ull << 20,
			  .borrow_pool = 512ull << 20,
			  .reps = 5 };
	struct results res;
	struct synth_model m = { 0 };
	ckpt_tensor *desc = NULL;
	ckpt_read_req *reqs = NULL;
	uint8_t *dest = NULL;
	struct row rows[10];
	size_t nrows = 0;
	char base[4096], root[4200];
	ckpt_stats st;
	int err, rc = 1, missed = 0;

	memset(&res, 0, sizeof(res));
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--json")) {
			o.json = 1;
		} else if (!strcmp(a, "--keep")) {
			o.keep = 1;
		} else if (!strcmp(a, "--no-rss")) {
			o.no_rss = 1;
		} else if (!strcmp(a, "--strict")) {
			o.strict = 1;
		} else if (!strcmp(a, "--finetune")) {
			o.finetune = 1;
			o.no_rss = 1;
		} else if (!strcmp(a, "--stall-only")) {
			o.stall_only = 1;
			o.no_rss = 1;
		} else if (!v) {
			bad = 1;
		} else if (!strcmp(a, "--dir")) {
			o.dir = v;
			i++;
		} else if (!strcmp(a, "--remote")) {
			o.remote = v;
			bad = strncmp(v, "gs://", 5) != 0;
			i++;
		} else if (!strcmp(a, "--size")) {
			bad = synth_parse_size(v, &o.size);
			i++;
		} else if (!strcmp(a, "--pool")) {
			bad = synth_parse_size(v, &o.pool);
			i++;
		} else if (!strcmp(a, "--rss-pool")) {
			bad = synth_parse_size(v, &o.rss_pool);
			i++;
		} else if (!strcmp(a, "--borrow-pool")) {
			bad = synth_parse_size(v, &o.borrow_pool);
			i++;
		} else if (!strcmp(a, "--reps")) {
			o.reps = (unsigned)strtoul(v, NULL, 10);
			bad = o.reps < 1 || o.reps > 99;
			i++;
		} else if (!strcmp(a, "--threads")) {
			o.threads = (unsigned)strtoul(v, NULL, 10);
			i++;
		} else if (!strcmp(a, "--fio-write-bw")) {
			o.fio_write_bw = strtod(v, NULL);
			i++;
		} else if (!strcmp(a, "--fio-read-bw")) {
			o.fio_read_bw = strtod(v, NULL);
			i++;
		} else {
			bad = 1;
		}
		if (bad) {
			usage(stderr);
			return 2;
		}
	}
	if (!o.dir) {
		usage(stderr);
		return 2;
	}
	if (!o.pool) /* larger than the state, so the copy never waits */
		o.pool = (o.size + o.size / 8 + (1u << 20) - 1) &
			 ~((uint64_t)(1u << 20) - 1);

	snprintf(base, sizeof(base), "%s/bench_core-%d", o.dir, (int)getpid());
	synth_mkdir_p(base);

	/* Peak RSS first, in a child, before this process grows. */
	if (!o.no_rss) {
		err = run_rss(&o, base, &res.rss);
		if (err) {
			fprintf(stderr,
				"bench_core: peak-RSS save failed: %s: "
				"%s\n",
				ckpt_strerror(err), res.rss.msg);
			goto out;
		}
		res.rss_done = 1;
	}

	err = synth_plan(&m, o.size, 0, SYNTH_EXACT);
	if (!err)
		err = synth_alloc(&m);
	desc = calloc(m.count ? m.count : 1, sizeof(*desc));
	reqs = calloc(m.count ? m.count : 1, sizeof(*reqs));
	dest = aligned_alloc(4096, (m.total_bytes + 4095) / 4096 * 4096);
	if (err || !desc || !reqs || !dest) {
		fprintf(stderr,
			"bench_core: cannot allocate a %llu-byte state "
			"(%s)\n",
			(unsigned long long)o.size,
			strerror(err ? -err : ENOMEM));
		goto out;
	}
	res.fill_s = synth_now();
	synth_fill(&m, 42, 0);
	res.fill_s = synth_now() - res.fill_s;
	synth_to_ckpt(&m, desc);

	/* Baseline: memcpy into warm memory, best of 3. */
	synth_warm(dest, m.total_bytes);
	res.memcpy_s = 1e30;
	for (int rep = 0; rep < 3; rep++) {
		double t0 = synth_now();
		uint64_t off = 0;

		for (size_t i = 0; i < m.count; i++) {
			memcpy(dest + off, m.t[i].data, m.t[i].nbytes);
			off += m.t[i].nbytes;
		}
		t0 = synth_now() - t0;
		if (t0 < res.memcpy_s)
			res.memcpy_s = t0;
	}

	snprintf(root, sizeof(root), "%s/ckpt", base);
	if (o.stall_only) {
		rc = stall_only(&o, &m, desc, dest, root);
		goto out;
	}
	if (o.finetune) {
		rc = finetune(&o, &m, desc, dest, reqs, root);
		goto out;
	}
	if (save_one(&o, root, CKPT_CODEC_NONE, 0, 1, desc, m.count,
		     &res.open_none_s, &res.first_block_none_s,
		     &res.block_none_s, &res.durable_none_s, NULL))
		goto out;
	if (save_one(&o, root, CKPT_CODEC_FLOAT, 0, 2, desc, m.count, NULL,
		     &res.first_block_float_s, &res.block_float_s,
		     &res.durable_float_s, NULL))
		goto out;
	if (save_one(&o, root, CKPT_CODEC_NONE, 1, 3, desc, m.count, NULL,
		     &res.first_block_borrow_s, &res.block_borrow_s,
		     &res.durable_borrow_s, &res.release_borrow_s))
		goto out;

	err = synth_drop_caches();
	res.caches_dropped = !err;
	snprintf(res.drop_note, sizeof(res.drop_note), "%s",
		 err ? "NOT dropped (no permission to write "
		       "/proc/sys/vm/drop_caches): loads may be cached" :
		       "dropped before each load");
	if (load_one(&o, root, 1, &m, dest, reqs, &res.load_none_s, NULL))
		goto out;
	if (res.caches_dropped)
		synth_drop_caches();
	if (load_one(&o, root, 2, &m, dest, reqs, &res.load_float_s, &st))
		goto out;
	res.raw_float = st.raw_bytes;
	res.stored_float = st.stored_bytes;

	{
		double S = (double)m.total_bytes;
		double fw = o.fio_write_bw / MIB, fr = o.fio_read_bw / MIB;
		double wn = S / res.durable_none_s / MIB;
		double wf = S / res.durable_float_s / MIB;
		double ln = S / res.load_none_s / MIB;
		double lf = S / res.load_float_s / MIB;

		rows[nrows++] =
			(struct row){ "save_blocking_none",
				      "save blocking (codec none)",
				      res.block_none_s,
				      "s",
				      "memcpy",
				      res.memcpy_s,
				      ratio(res.block_none_s, res.memcpy_s),
				      "<=",
				      1.25 };
		rows[nrows++] =
			(struct row){ "save_blocking_float",
				      "save blocking (codec float)",
				      res.block_float_s,
				      "s",
				      "memcpy",
				      res.memcpy_s,
				      ratio(res.block_float_s, res.memcpy_s),
				      "<=",
				      1.25 };
		rows[nrows++] =
			(struct row){ "save_blocking_borrow",
				      "save blocking (borrow mode)",
				      res.block_borrow_s,
				      "s",
				      "memcpy",
				      res.memcpy_s,
				      ratio(res.block_borrow_s, res.memcpy_s),
				      "<=",
				      0.05 };
		rows[nrows++] = (struct row){
			"first_save_blocking_borrow",
			"first save after open (borrow)",
			res.first_block_borrow_s,
			"s",
			"memcpy",
			res.memcpy_s,
			ratio(res.first_block_borrow_s, res.memcpy_s),
			"<=",
			0.05
		};
		rows[nrows++] = (struct row){ "durable_none_bw",
					      "save to durable, codec none",
					      wn,
					      "MiB/s",
					      "fio write",
					      fw,
					      ratio(wn, fw),
					      ">=",
					      0.95 };
		rows[nrows++] = (struct row){ "float_stored_ratio",
					      "float codec: raw / stored",
					      ratio((double)res.raw_float,
						    (double)res.stored_float),
					      "x",
					      NULL,
					      0,
					      0,
					      NULL,
					      0 };
		rows[nrows++] =
			(struct row){ "durable_float_bw",
				      "save to durable, float (logical)",
				      wf,
				      "MiB/s",
				      "fio write",
				      fw,
				      ratio(wf, fw),
				      ">=",
				      1.3 };
		rows[nrows++] = (struct row){ "load_none_bw",
					      "load, codec none",
					      ln,
					      "MiB/s",
					      "fio read",
					      fr,
					      ratio(ln, fr),
					      ">=",
					      0.95 };
		rows[nrows++] = (struct row){ "load_float_bw",
					      "load, float (logical)",
					      lf,
					      "MiB/s",
					      "fio read",
					      fr,
					      ratio(lf, fr),
					      NULL,
					      0 };
		if (res.rss_done) {
			double over =
				((double)res.rss.hwm - (double)res.rss.state) /
				MIB;
			double budget = o.rss_pool / MIB + 64.0;

			rows[nrows++] =
				(struct row){ "peak_rss_over_state",
					      "peak RSS - state (small pool)",
					      over,
					      "MiB",
					      "pool+64MiB",
					      budget,
					      ratio(over, budget),
					      "<=",
					      1.0 };
		}
	}
	for (size_t i = 0; i < nrows; i++)
		if (row_ok(&rows[i]) == 0)
			missed++;
	if (o.json)
		print_json(&o, &m, &res, rows, nrows);
	else {
		print_table(&o, &m, &res, rows, nrows);
		printf("(fill %.2f s, ckpt_open with pool pre-fault %.2f s; "
		       "every loaded byte matched)\n",
		       res.fill_s, res.open_none_s);
		printf("(first save right after ckpt_open, blocking: none "
		       "%.3f s = %.3f x memcpy, float %.3f s = %.3f x "
		       "memcpy)\n",
		       res.first_block_none_s,
		       ratio(res.first_block_none_s, res.memcpy_s),
		       res.first_block_float_s,
		       ratio(res.first_block_float_s, res.memcpy_s));
	}
	rc = o.strict && missed ? 3 : 0;
out:
	if (!o.keep)
		synth_rm_tree(base);
	free(dest);
	free(reqs);
	free(desc);
	synth_free(&m);
	return rc;
}
