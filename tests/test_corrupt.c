/*
 * test_corrupt.c - damage every file of a committed step (bit flips at
 * many positions, truncations, extensions) and check that the damage is
 * always detected, reported with the right code and a message naming the
 * file, and never crashes (CI runs this under ASan/UBSan).
 *
 * Expected outcome, per damaged file of step 2 (step 1 stays intact):
 *  - shard or index file: ckpt_reader_open fails, or it succeeds and then
 *    every ckpt_read either returns the exact saved bytes or fails, and
 *    ckpt_reader_verify fails (verify must catch EVERY case: it checks
 *    each file's size and XXH3 against the commit record). Every failure is
 *    CKPT_E_CORRUPT (CKPT_E_VERSION is also accepted when the flipped byte
 *    is in the first 64 bytes of the file, where the version fields are)
 *    and its message names the damaged file.
 *  - COMMIT: the step has no valid commit record. Opening it explicitly
 *    fails with CKPT_E_CORRUPT (or CKPT_E_VERSION as above) naming COMMIT;
 *    ckpt_list does not list it; opening CKPT_LATEST either falls back to
 *    step 1 or fails with CKPT_E_CORRUPT.
 *  - latest: only a hint. Opening CKPT_LATEST still gives step 2, which
 *    verifies and reads correctly, and ckpt_latest() says 2.
 *  - in all cases the older step 1 still opens, verifies and reads.
 *
 * Each case mutates one file and restores it from memory afterwards (the
 * rest of the tree is never written), which keeps ~10k cases fast.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmt.h"
#include "testutil.h"

#define STEP_OLD 1
#define STEP 2

static char cur_case[512];
static char why[1024];

static void crash_handler(int sig)
{
	const char pre[] = "\n*** crashed in case: ";
	ssize_t w = write(2, pre, sizeof(pre) - 1);
	w = write(2, cur_case, strlen(cur_case));
	w = write(2, "\n", 1);
	(void)w;
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install_crash_handler(void)
{
	signal(SIGSEGV, crash_handler);
	signal(SIGBUS, crash_handler);
	signal(SIGFPE, crash_handler);
	signal(SIGABRT, crash_handler);
}

struct fixture {
	const char *root;
	char *step_dir;
	tu_set sets[2][2]; /* [old/new][host] */
	ckpt *lister;      /* staging 0 handle for ckpt_list/latest */
	uint64_t cases, opened, read_fail;
};

static void host_set(tu_set *set, uint32_t h, uint64_t step)
{
	tu_set_init(set);
	uint64_t shape[2] = {64, 1000}, off[2] = {32 * h, 0}, ext[2] = {32, 1000};
	tu_set_add_slice(set, "w", CKPT_BF16, 2, shape, off, ext, step * 7);
	char name[32];
	uint64_t r[1] = {70000 + 1000 * h}, z[1] = {10000}, f[1] = {3000},
		 t[1] = {5};
	snprintf(name, sizeof(name), "h%u.random", h);
	tu_set_add(set, name, CKPT_U8, 1, r, step * 100 + h);
	snprintf(name, sizeof(name), "h%u.zeros", h);
	tu_tensor *zt = tu_set_add(set, name, CKPT_I32, 1, z, 0);
	memset(zt->data, 0, zt->nbytes);
	snprintf(name, sizeof(name), "h%u.f32", h);
	tu_set_add(set, name, CKPT_F32, 1, f, step * 100 + h + 50);
	snprintf(name, sizeof(name), "h%u.tail", h);
	tu_set_add(set, name, CKPT_F64, 1, t, step * 100 + h + 60);
}

static void build(struct fixture *fx)
{
	memset(fx, 0, sizeof(*fx));
	fx->root = tu_tmpdir();
	ckpt *c[2];
	for (uint32_t h = 0; h < 2; h++) {
		ckpt_settings s;
		tu_settings(&s);
		s.host_index = h;
		s.host_count = 2;
		s.files_per_host = h ? 1 : 2;
		s.codec = h ? CKPT_CODEC_ZSTD : CKPT_CODEC_FLOAT;
		ck_assert_int_eq(ckpt_open(&c[h], fx->root, &s), 0);
	}
	for (int k = 0; k < 2; k++) {
		uint64_t step = k ? STEP : STEP_OLD;
		for (uint32_t h = 0; h < 2; h++) {
			host_set(&fx->sets[k][h], h, step);
			int rc = tu_save(c[h], step, &fx->sets[k][h]);
			ck_assert_msg(rc == 0, "save: %d %s", rc, ckpt_errmsg(c[h]));
		}
		int rc = ckpt_commit(c[1], step);
		ck_assert_msg(rc == 0, "commit: %d %s", rc, ckpt_errmsg(c[1]));
	}
	ckpt_close(c[0]);
	ckpt_close(c[1]);
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ck_assert_int_eq(ckpt_open(&fx->lister, fx->root, &s), 0);
	fx->step_dir = tu_step_dir(fx->root, STEP);
	for (int k = 0; k < 2; k++)
		for (int h = 0; h < 2; h++) {
			int rc = tu_check_root(fx->root, k ? STEP : STEP_OLD,
					       &fx->sets[k][h], why, sizeof(why));
			ck_assert_msg(rc == 0, "pristine: %s", why);
		}
	install_crash_handler();
}

static void teardown(struct fixture *fx)
{
	fprintf(stderr, "%s: %llu cases, %llu opened, %llu failed a read\n",
		cur_case, (unsigned long long)fx->cases,
		(unsigned long long)fx->opened,
		(unsigned long long)fx->read_fail);
	ckpt_close(fx->lister);
	free(fx->step_dir);
	for (int k = 0; k < 2; k++)
		for (int h = 0; h < 2; h++)
			tu_set_free(&fx->sets[k][h]);
}

static void expect_failure(int rc, const char *msg, const char *file,
			   int allow_version, const char *stage)
{
	if (!(rc == CKPT_E_CORRUPT || (allow_version && rc == CKPT_E_VERSION)))
		ck_abort_msg("%s: %s returned %d (%s), want CKPT_E_CORRUPT: %s",
			     cur_case, stage, rc, ckpt_strerror(rc), msg);
	if (!msg || !strstr(msg, file))
		ck_abort_msg("%s: %s message \"%s\" does not name %s", cur_case,
			     stage, msg ? msg : "(null)", file);
}

/* Damage is in place; judge the outcome for a shard or index file. */
static void judge_data_file(struct fixture *fx, const char *file,
			    int allow_version)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, fx->root, STEP, NULL);
	if (rc) {
		if (r)
			ck_abort_msg("%s: failed open left *out set", cur_case);
		expect_failure(rc, ckpt_reader_errmsg(NULL), file, allow_version,
			       "reader_open");
		return;
	}
	fx->opened++;
	for (int h = 0; h < 2; h++) {
		const tu_set *set = &fx->sets[1][h];
		for (size_t i = 0; i < set->n; i++) {
			const tu_tensor *t = &set->t[i];
			uint8_t *buf = malloc(t->nbytes);
			if (t->sliced)
				rc = ckpt_read_slice(r, t->name, t->off, t->ext,
						     buf, t->nbytes);
			else
				rc = ckpt_read(r, t->name, buf, t->nbytes);
			if (rc) {
				fx->read_fail++;
				expect_failure(rc, ckpt_reader_errmsg(r), file,
					       0, "read");
			} else if (memcmp(buf, t->data, t->nbytes)) {
				ck_abort_msg("%s: read of \"%s\" returned wrong "
					     "bytes without an error",
					     cur_case, t->name);
			}
			free(buf);
		}
	}
	rc = ckpt_reader_verify(r, NULL, NULL);
	if (rc == 0)
		ck_abort_msg("%s: verify did not detect the damage", cur_case);
	expect_failure(rc, ckpt_reader_errmsg(r), file, allow_version, "verify");
	ckpt_reader_close(r);
}

static size_t list_has(struct fixture *fx, uint64_t step)
{
	ckpt_step_info *li;
	size_t n, found = 0;
	int rc = ckpt_list(fx->lister, &li, &n);
	if (rc)
		ck_abort_msg("%s: ckpt_list: %d %s", cur_case, rc,
			     ckpt_errmsg(fx->lister));
	for (size_t i = 0; i < n; i++)
		found += li[i].step == step;
	ckpt_free(li);
	return found;
}

static void judge_commit(struct fixture *fx, int allow_version)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, fx->root, STEP, NULL);
	if (rc == 0) {
		ckpt_reader_close(r);
		ck_abort_msg("%s: damaged COMMIT opened", cur_case);
	}
	expect_failure(rc, ckpt_reader_errmsg(NULL), "COMMIT", allow_version,
		       "reader_open");
	if (list_has(fx, STEP))
		ck_abort_msg("%s: step with damaged COMMIT is listed", cur_case);
	rc = ckpt_reader_open(&r, fx->root, CKPT_LATEST, NULL);
	if (rc == 0) {
		uint64_t st = ckpt_reader_step(r);
		ckpt_reader_close(r);
		if (st != STEP_OLD)
			ck_abort_msg("%s: CKPT_LATEST opened step %llu", cur_case,
				     (unsigned long long)st);
	} else if (rc != CKPT_E_CORRUPT &&
		   !(allow_version && rc == CKPT_E_VERSION)) {
		ck_abort_msg("%s: CKPT_LATEST open: %d (%s)", cur_case, rc,
			     ckpt_strerror(rc));
	}
}

static void judge_latest(struct fixture *fx)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, fx->root, CKPT_LATEST, NULL);
	if (rc)
		ck_abort_msg("%s: damaged hint broke CKPT_LATEST: %d %s",
			     cur_case, rc, ckpt_reader_errmsg(NULL));
	if (ckpt_reader_step(r) != STEP)
		ck_abort_msg("%s: CKPT_LATEST opened step %llu", cur_case,
			     (unsigned long long)ckpt_reader_step(r));
	ckpt_reader_close(r);
	uint64_t l = 0;
	rc = ckpt_latest(fx->lister, &l);
	if (rc || l != STEP)
		ck_abort_msg("%s: ckpt_latest: %d step %llu", cur_case, rc,
			     (unsigned long long)l);
	if (fx->cases % 16 == 0)
		for (int h = 0; h < 2; h++)
			if (tu_check_root(fx->root, CKPT_LATEST, &fx->sets[1][h],
					  why, sizeof(why)))
				ck_abort_msg("%s: %s", cur_case, why);
}

static void check_old_step(struct fixture *fx)
{
	for (int h = 0; h < 2; h++)
		if (tu_check_root(fx->root, STEP_OLD, &fx->sets[0][h], why,
				  sizeof(why)))
			ck_abort_msg("%s: older step: %s", cur_case, why);
}

enum fkind { K_DATA, K_COMMIT, K_LATEST };

static void judge(struct fixture *fx, enum fkind kind, const char *file,
		  int allow_version)
{
	fx->cases++;
	switch (kind) {
	case K_DATA:
		judge_data_file(fx, file, allow_version);
		break;
	case K_COMMIT:
		judge_commit(fx, allow_version);
		break;
	case K_LATEST:
		judge_latest(fx);
		break;
	}
	if (fx->cases % 97 == 0)
		check_old_step(fx);
}

struct target {
	char *path;
	char name[64];
	enum fkind kind;
	uint8_t *orig;
	size_t len;
};

static int targets(struct fixture *fx, struct target *t, int max)
{
	char **names;
	int n = tu_list_files(fx->step_dir, &names), k = 0;
	ck_assert_int_ge(n, 6); /* 3 shards, 2 indexes, COMMIT */
	for (int i = 0; i < n && k < max - 1; i++, k++) {
		t[k].path = tu_path("%s/%s", fx->step_dir, names[i]);
		snprintf(t[k].name, sizeof(t[k].name), "%s", names[i]);
		t[k].kind = strcmp(names[i], "COMMIT") ? K_DATA : K_COMMIT;
		ck_assert_int_eq(tu_read_file(t[k].path, &t[k].orig, &t[k].len), 0);
	}
	tu_free_names(names, n);
	t[k].path = tu_path("%s/latest", fx->root);
	snprintf(t[k].name, sizeof(t[k].name), "latest");
	t[k].kind = K_LATEST;
	ck_assert_int_eq(tu_read_file(t[k].path, &t[k].orig, &t[k].len), 0);
	return k + 1;
}

static void restore(struct target *t)
{
	if (tu_write_file(t->path, t->orig, t->len))
		ck_abort_msg("cannot restore %s", t->path);
}

static void free_targets(struct target *t, int n)
{
	for (int i = 0; i < n; i++) {
		free(t[i].path);
		free(t[i].orig);
	}
}

/* Positions worth flipping in a shard file: the whole header's first
 * bytes, then for every chunk its header, payload edges and padding. */
static size_t shard_positions(const struct target *t, uint64_t *pos,
			      size_t max, tu_rng *g)
{
	size_t n = 0;
#define ADD(p)                                                           \
	do {                                                             \
		if ((uint64_t)(p) < t->len && n < max)                    \
			pos[n++] = (uint64_t)(p);                        \
	} while (0)
	for (uint64_t i = 0; i < 128; i++)
		ADD(i);
	for (uint64_t i = 128; i < FMT_SHARD_HDR_SIZE; i += 97)
		ADD(i);
	ADD(FMT_SHARD_HDR_SIZE - 1);
	uint64_t off = FMT_SHARD_HDR_SIZE;
	while (off + FMT_CHUNK_HDR_SIZE <= t->len) {
		fmt_chunk_hdr h;
		char err[256];
		if (fmt_chunk_hdr_decode(t->orig + off, FMT_CHUNK_HDR_SIZE, &h,
					 err, sizeof(err)))
			ck_abort_msg("%s: chunk at %llu: %s", t->name,
				     (unsigned long long)off, err);
		for (uint64_t i = 0; i < FMT_CHUNK_HDR_SIZE; i++)
			ADD(off + i);
		uint64_t p0 = off + FMT_CHUNK_HDR_SIZE, p1 = p0 + h.stored_len;
		for (uint64_t i = 0; i < 8 && p0 + i < p1; i++) {
			ADD(p0 + i);
			ADD(p1 - 1 - i);
		}
		for (int i = 0; i < 12 && h.stored_len; i++)
			ADD(p0 + tu_rng_below(g, h.stored_len));
		uint64_t next = off + fmt_chunk_span(h.stored_len);
		if (next > p1) {
			ADD(p1);
			ADD(next - 1);
			ADD(p1 + tu_rng_below(g, next - p1));
		}
		off = next;
	}
	ADD(t->len - 1);
#undef ADD
	return n;
}

START_TEST(test_flip_small_files)
{
	struct fixture fx;
	build(&fx);
	struct target t[32];
	int nt = targets(&fx, t, 32);
	for (int i = 0; i < nt; i++) {
		if (strstr(t[i].name, ".shard"))
			continue;
		ck_assert_msg(t[i].len < (64u << 10), "%s is %zu bytes",
			      t[i].name, t[i].len);
		/* every byte; every bit for files below 8 KiB... is 8x the
		 * time: one bit per byte, rotating, plus all 8 in the header */
		for (size_t off = 0; off < t[i].len; off++) {
			int bits = off < 64 ? 8 : 1;
			for (int b = 0; b < bits; b++) {
				unsigned bit = bits == 8 ? (unsigned)b
							 : (unsigned)(off % 8);
				snprintf(cur_case, sizeof(cur_case),
					 "flip %s byte %zu bit %u", t[i].name,
					 off, bit);
				ck_assert_int_eq(tu_flip_bit(t[i].path, off, bit), 0);
				judge(&fx, t[i].kind, t[i].name, off < 64);
				restore(&t[i]);
			}
		}
	}
	check_old_step(&fx);
	snprintf(cur_case, sizeof(cur_case), "flip small files");
	free_targets(t, nt);
	teardown(&fx);
}
END_TEST

START_TEST(test_flip_shards)
{
	struct fixture fx;
	build(&fx);
	struct target t[32];
	int nt = targets(&fx, t, 32);
	tu_rng g;
	tu_rng_seed(&g, 1234);
	uint64_t *pos = malloc(4096 * sizeof(*pos));
	int shards = 0;
	for (int i = 0; i < nt; i++) {
		if (!strstr(t[i].name, ".shard"))
			continue;
		shards++;
		size_t np = shard_positions(&t[i], pos, 4096, &g);
		ck_assert_uint_gt(np, 200);
		for (size_t k = 0; k < np; k++) {
			unsigned bit = (unsigned)tu_rng_below(&g, 8);
			snprintf(cur_case, sizeof(cur_case),
				 "flip %s byte %llu bit %u", t[i].name,
				 (unsigned long long)pos[k], bit);
			ck_assert_int_eq(tu_flip_bit(t[i].path, pos[k], bit), 0);
			judge(&fx, K_DATA, t[i].name, pos[k] < 64);
			restore(&t[i]);
		}
	}
	ck_assert_int_eq(shards, 3);
	check_old_step(&fx);
	snprintf(cur_case, sizeof(cur_case), "flip shards");
	free(pos);
	free_targets(t, nt);
	teardown(&fx);
}
END_TEST

START_TEST(test_truncate_extend)
{
	struct fixture fx;
	build(&fx);
	struct target t[32];
	int nt = targets(&fx, t, 32);
	tu_rng g;
	tu_rng_seed(&g, 99);
	uint64_t *pos = malloc(4096 * sizeof(*pos));
	uint8_t *big = calloc(1, 1 << 20);
	for (int i = 0; i < nt; i++) {
		size_t np = 0;
		if (t[i].len < 8192) {
			for (size_t l = 0; l < t[i].len; l++)
				pos[np++] = l;
		} else {
			/* every chunk edge, plus a spread */
			size_t sp = shard_positions(&t[i], pos, 4000, &g);
			np = sp;
			for (int k = 0; k < 64; k++)
				pos[np++] = tu_rng_below(&g, t[i].len);
			pos[np++] = 0;
			pos[np++] = t[i].len - 4096;
		}
		for (size_t k = 0; k < np; k++) {
			snprintf(cur_case, sizeof(cur_case),
				 "truncate %s to %llu of %zu", t[i].name,
				 (unsigned long long)pos[k], t[i].len);
			ck_assert_int_eq(tu_truncate(t[i].path, pos[k]), 0);
			judge(&fx, t[i].kind, t[i].name, 0);
			restore(&t[i]);
		}
		/* extensions: zeros, garbage, a whole extra block */
		static const size_t ext[] = {1, 7, 4096, 65536};
		for (size_t k = 0; k < 4; k++) {
			for (int fill = 0; fill < 2; fill++) {
				snprintf(cur_case, sizeof(cur_case),
					 "extend %s by %zu %s", t[i].name, ext[k],
					 fill ? "random" : "zero");
				size_t nl = t[i].len + ext[k];
				memcpy(big, t[i].orig, t[i].len);
				if (fill)
					tu_fill_bytes(big + t[i].len, ext[k], k);
				else
					memset(big + t[i].len, 0, ext[k]);
				ck_assert_int_eq(tu_write_file(t[i].path, big, nl), 0);
				judge(&fx, t[i].kind, t[i].name, 0);
				restore(&t[i]);
			}
		}
		/* the file gone altogether */
		snprintf(cur_case, sizeof(cur_case), "remove %s", t[i].name);
		ck_assert_int_eq(unlink(t[i].path), 0);
		if (t[i].kind == K_COMMIT) {
			/* no COMMIT at all: the step simply does not exist */
			ckpt_reader *r = NULL;
			ck_assert_int_eq(ckpt_reader_open(&r, fx.root, STEP, NULL),
					 CKPT_E_NOTFOUND);
			ck_assert(!list_has(&fx, STEP));
		} else if (t[i].kind == K_LATEST) {
			judge(&fx, t[i].kind, t[i].name, 0);
		} else {
			/* a file the commit lists is missing: CKPT_E_CORRUPT,
			 * or the -ENOENT of the OS passed through */
			ckpt_reader *r = NULL;
			int rc = ckpt_reader_open(&r, fx.root, STEP, NULL);
			const char *m = ckpt_reader_errmsg(NULL);
			if (rc == 0) {
				rc = ckpt_reader_verify(r, NULL, NULL);
				m = ckpt_reader_errmsg(r);
			}
			ck_assert_msg(rc == CKPT_E_CORRUPT || rc == -ENOENT,
				      "%s: %d (%s)", cur_case, rc, ckpt_strerror(rc));
			ck_assert_msg(strstr(m, t[i].name), "%s: message \"%s\"",
				      cur_case, m);
			ckpt_reader_close(r);
		}
		restore(&t[i]);
	}
	check_old_step(&fx);
	snprintf(cur_case, sizeof(cur_case), "truncate/extend");
	free(big);
	free(pos);
	free_targets(t, nt);
	teardown(&fx);
}
END_TEST

/* Damage to a whole region rather than one bit: zeroed 4 KiB blocks
 * (a lost write), and a block of one file replaced by the same block of
 * another (a misdirected write). */
START_TEST(test_block_damage)
{
	struct fixture fx;
	build(&fx);
	struct target t[32];
	int nt = targets(&fx, t, 32);
	for (int i = 0; i < nt; i++) {
		if (!strstr(t[i].name, ".shard"))
			continue;
		for (size_t off = 0; off < t[i].len; off += 4096) {
			snprintf(cur_case, sizeof(cur_case), "zero block %zu of %s",
				 off / 4096, t[i].name);
			uint8_t *b = malloc(t[i].len);
			memcpy(b, t[i].orig, t[i].len);
			size_t n = t[i].len - off < 4096 ? t[i].len - off : 4096;
			int allzero = 1;
			for (size_t k = 0; k < n && allzero; k++)
				allzero = !b[off + k];
			memset(b + off, 0, n);
			ck_assert_int_eq(tu_write_file(t[i].path, b, t[i].len), 0);
			if (!allzero)
				judge(&fx, K_DATA, t[i].name, off == 0);
			restore(&t[i]);
			/* the same block from another shard file */
			for (int j = 0; j < nt; j++) {
				if (j == i || !strstr(t[j].name, ".shard") ||
				    t[j].len < off + n)
					continue;
				if (!memcmp(t[i].orig + off, t[j].orig + off, n))
					break; /* identical: no damage */
				memcpy(b + off, t[j].orig + off, n);
				snprintf(cur_case, sizeof(cur_case),
					 "block %zu of %s from %s", off / 4096,
					 t[i].name, t[j].name);
				ck_assert_int_eq(tu_write_file(t[i].path, b, t[i].len), 0);
				judge(&fx, K_DATA, t[i].name, off == 0);
				restore(&t[i]);
				break;
			}
			free(b);
		}
	}
	/* swapping two whole shard files of one host */
	snprintf(cur_case, sizeof(cur_case), "swap h00000 shards");
	char *a = tu_path("%s/h00000-f000.shard", fx.step_dir);
	char *b = tu_path("%s/h00000-f001.shard", fx.step_dir);
	char *tmp = tu_path("%s/swap", fx.step_dir);
	ck_assert_int_eq(rename(a, tmp), 0);
	ck_assert_int_eq(rename(b, a), 0);
	ck_assert_int_eq(rename(tmp, b), 0);
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, fx.root, STEP, NULL);
	if (rc == 0) {
		rc = ckpt_reader_verify(r, NULL, NULL);
		ck_assert_msg(rc == CKPT_E_CORRUPT, "swap: verify %d", rc);
		ckpt_reader_close(r);
	} else {
		ck_assert_int_eq(rc, CKPT_E_CORRUPT);
	}
	free(a);
	free(b);
	free(tmp);
	check_old_step(&fx);
	snprintf(cur_case, sizeof(cur_case), "block damage");
	free_targets(t, nt);
	teardown(&fx);
}
END_TEST


/* ---- crafted files: internally consistent checksums, wrong content ----
 *
 * The index of host 0 is decoded, altered, re-encoded, and the COMMIT is
 * rewritten with the new size and hash, so no checksum can catch the
 * change: only validation of the values (ranges, coverage, cross-checks
 * between index, commit and shard headers) can. Every case must be
 * detected by open, a read or verify, never crash, never return wrong
 * bytes as success. */

struct craft {
	struct fixture *fx;
	uint8_t *commit_orig, *index_orig, *shard_orig;
	size_t commit_len, index_len, shard_len;
	char *commit_path, *index_path, *shard_path;
};

/* Writes the index and a COMMIT matching it (and, with shards, matching
 * the shard sizes/hashes the index claims). */
static void write_meta(struct craft *cr, fmt_index *ix, int shards)
{
	uint8_t *ib;
	size_t il;
	int rc = fmt_index_encode(ix, &ib, &il);
	if (rc)
		ck_abort_msg("%s: fmt_index_encode: %d", cur_case, rc);
	ck_assert_int_eq(tu_write_file(cr->index_path, ib, il), 0);
	fmt_commit cm;
	char err[256];
	ck_assert_int_eq(fmt_commit_decode(cr->commit_orig, cr->commit_len, &cm,
					   err, sizeof(err)), 0);
	for (size_t i = 0; i < cm.nfiles; i++) {
		if (!strcmp(cm.files[i].name, "h00000.index")) {
			cm.files[i].size = il;
			cm.files[i].xxh3 = fmt_xxh3(ib, il);
		}
		for (size_t j = 0; shards && j < ix->nfiles; j++)
			if (!strcmp(cm.files[i].name, ix->files[j].name)) {
				cm.files[i].size = ix->files[j].size;
				cm.files[i].xxh3 = ix->files[j].xxh3;
			}
	}
	cm.stored_bytes = 0;
	for (size_t i = 0; i < cm.nfiles; i++)
		cm.stored_bytes += cm.files[i].size;
	uint8_t *cb;
	size_t cl;
	ck_assert_int_eq(fmt_commit_encode(&cm, &cb, &cl), 0);
	ck_assert_int_eq(tu_write_file(cr->commit_path, cb, cl), 0);
	fmt_commit_free(&cm);
	free(cb);
	free(ib);
}

static void craft_restore(struct craft *cr)
{
	ck_assert_int_eq(tu_write_file(cr->commit_path, cr->commit_orig,
				       cr->commit_len), 0);
	ck_assert_int_eq(tu_write_file(cr->index_path, cr->index_orig,
				       cr->index_len), 0);
	ck_assert_int_eq(tu_write_file(cr->shard_path, cr->shard_orig,
				       cr->shard_len), 0);
}

static int crafted_ok_code(int rc, int reading)
{
	return rc == CKPT_E_CORRUPT || rc == CKPT_E_MISMATCH ||
	       (reading && rc == CKPT_E_NOTFOUND);
}

static void judge_crafted(struct fixture *fx)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, fx->root, STEP, NULL), detected = 0;
	fx->cases++;
	if (getenv("CKPT_TEST_VERBOSE"))
		fprintf(stderr, "%s: open %d %s\n", cur_case, rc,
			rc ? ckpt_reader_errmsg(NULL) : "");
	if (rc) {
		if (!crafted_ok_code(rc, 0))
			ck_abort_msg("%s: open: %d (%s): %s", cur_case, rc,
				     ckpt_strerror(rc), ckpt_reader_errmsg(NULL));
		if (!ckpt_reader_errmsg(NULL)[0])
			ck_abort_msg("%s: no message", cur_case);
		return;
	}
	fx->opened++;
	for (int h = 0; h < 2; h++) {
		const tu_set *set = &fx->sets[1][h];
		for (size_t i = 0; i < set->n; i++) {
			const tu_tensor *t = &set->t[i];
			uint8_t *buf = malloc(t->nbytes + 1);
			if (t->sliced)
				rc = ckpt_read_slice(r, t->name, t->off, t->ext,
						     buf, t->nbytes);
			else
				rc = ckpt_read(r, t->name, buf, t->nbytes);
			if (rc) {
				detected = 1;
				if (!crafted_ok_code(rc, 1))
					ck_abort_msg("%s: read %s: %d (%s): %s",
						     cur_case, t->name, rc,
						     ckpt_strerror(rc),
						     ckpt_reader_errmsg(r));
			} else if (memcmp(buf, t->data, t->nbytes)) {
				ck_abort_msg("%s: read of \"%s\" returned wrong "
					     "bytes without an error", cur_case,
					     t->name);
			}
			free(buf);
		}
	}
	rc = ckpt_reader_verify(r, NULL, NULL);
	if (rc) {
		detected = 1;
		if (rc != CKPT_E_CORRUPT && rc != CKPT_E_MISMATCH)
			ck_abort_msg("%s: verify: %d (%s)", cur_case, rc,
				     ckpt_strerror(rc));
	}
	ckpt_reader_close(r);
	if (!detected)
		ck_abort_msg("%s: crafted inconsistency not detected by open, "
			     "reads or verify", cur_case);
}

static fmt_tensor_entry *find_t(fmt_index *ix, const char *name)
{
	for (size_t i = 0; i < ix->ntensors; i++)
		if (!strcmp(ix->tensors[i].name, name))
			return &ix->tensors[i];
	ck_abort_msg("no tensor %s in index", name);
	return NULL;
}

#define NCRAFT 25

static const char *craft_name(int k)
{
	static const char *const n[NCRAFT] = {
		"tensor nbytes+4", "tensor shape huge", "tensor past stream end",
		"tensors overlap", "chunk raw_len+4096", "chunk outside file",
		"chunk stored_len 1 GiB", "chunk raw hash", "chunk codec",
		"chunk elem_width", "chunk in the other file", "index step",
		"index host_index", "index chunk_bytes tiny", "stream_bytes+64K",
		"last chunk dropped", "duplicate tensor name", "dtype f32->f64",
		"slice outside shape", "shard from step 1", "file size in index",
		"chunk stream_offset+64", "chunk_bytes huge", "global shape differs",
		"slices overlap across hosts",
	};
	return n[k];
}

/* Applies mutation k. Returns 0 if it does not apply to this layout. */
static int mutate(struct craft *cr, fmt_index *ix, int k)
{
	fmt_tensor_entry *t;
	fmt_chunk_entry *c0 = &ix->chunks[0];
	switch (k) {
	case 0:
		find_t(ix, "h0.f32")->nbytes += 4;
		return 1;
	case 1:
		t = find_t(ix, "h0.random");
		t->shape[0] = t->extent[0] = 1ull << 50;
		t->nbytes = 1ull << 50;
		return 1;
	case 2:
		find_t(ix, "h0.tail")->stream_offset =
			fmt_align_up(ix->stream_bytes, 64);
		return 1;
	case 3:
		find_t(ix, "h0.random")->stream_offset += 64;
		return 1;
	case 4:
		c0->raw_len += 4096;
		return 1;
	case 5:
		ix->chunks[ix->nchunks - 1].file_offset += 1u << 20;
		return 1;
	case 6:
		c0->stored_len = 1u << 30;
		return 1;
	case 7:
		c0->raw_xxh3 ^= 1;
		return 1;
	case 8:
		c0->codec = c0->codec == CKPT_CODEC_NONE ? CKPT_CODEC_ZSTD
							 : CKPT_CODEC_NONE;
		return 1;
	case 9:
		c0->elem_width = c0->elem_width == 2 ? 4 : 2;
		return c0->codec == CKPT_CODEC_FLOAT;
	case 10:
		if (ix->nfiles < 2)
			return 0;
		c0->file = c0->file ? 0 : 1;
		return 1;
	case 11:
		ix->step = 99;
		return 1;
	case 12:
		ix->host_index = 1;
		return 1;
	case 13:
		ix->chunk_bytes = 4096;
		return 1;
	case 14:
		ix->stream_bytes += 65536;
		return 1;
	case 15:
		if (ix->nchunks < 2)
			return 0;
		ix->nchunks--;
		return 1;
	case 16:
		t = find_t(ix, "h0.zeros");
		free(t->name);
		t->name = strdup("h0.f32");
		t->name_len = strlen(t->name);
		return 1;
	case 17:
		t = find_t(ix, "h0.f32");
		t->dtype = CKPT_F64;
		t->nbytes *= 2;
		return 1;
	case 18:
		find_t(ix, "w")->offset[0] = 60;
		return 1;
	case 19: {
		/* a stale shard: the same file of step 1, hashes updated */
		char *old = tu_path("%s/step-%020d/h00000-f000.shard",
				    cr->fx->root, STEP_OLD);
		uint8_t *b;
		size_t l;
		ck_assert_int_eq(tu_read_file(old, &b, &l), 0);
		ck_assert_int_eq(tu_write_file(cr->shard_path, b, l), 0);
		for (size_t i = 0; i < ix->nfiles; i++)
			if (!strcmp(ix->files[i].name, "h00000-f000.shard")) {
				ix->files[i].size = l;
				ix->files[i].xxh3 = fmt_xxh3(b, l);
			}
		free(b);
		free(old);
		return 1;
	}
	case 20:
		ix->files[0].size += 4096;
		return 2; /* the commit keeps the true size */
	case 21:
		if (ix->nchunks < 2)
			return 0;
		ix->chunks[1].stream_offset += 64;
		return 1;
	case 22:
		ix->chunk_bytes = 1u << 30;
		return 1;
	case 23:
		/* valid for host 0 alone, disagrees with host 1's slice */
		find_t(ix, "w")->shape[1] = 1001;
		return 1;
	case 24:
		/* rows [1, 33): inside the shape, overlaps host 1's [32, 64) */
		find_t(ix, "w")->offset[0] = 1;
		return 1;
	}
	return 0;
}

START_TEST(test_crafted)
{
	struct fixture fx;
	build(&fx);
	struct craft cr = {.fx = &fx};
	cr.commit_path = tu_path("%s/COMMIT", fx.step_dir);
	cr.index_path = tu_path("%s/h00000.index", fx.step_dir);
	cr.shard_path = tu_path("%s/h00000-f000.shard", fx.step_dir);
	ck_assert_int_eq(tu_read_file(cr.commit_path, &cr.commit_orig,
				      &cr.commit_len), 0);
	ck_assert_int_eq(tu_read_file(cr.index_path, &cr.index_orig,
				      &cr.index_len), 0);
	ck_assert_int_eq(tu_read_file(cr.shard_path, &cr.shard_orig,
				      &cr.shard_len), 0);
	/* the re-encoding itself is faithful: unmodified, all is well */
	{
		fmt_index ix;
		char err[256];
		ck_assert_int_eq(fmt_index_decode(cr.index_orig, cr.index_len,
						  &ix, err, sizeof(err)), 0);
		snprintf(cur_case, sizeof(cur_case), "crafted: identity");
		write_meta(&cr, &ix, 1);
		fmt_index_free(&ix);
		for (int h = 0; h < 2; h++)
			ck_assert_msg(tu_check_root(fx.root, STEP, &fx.sets[1][h],
						    why, sizeof(why)) == 0,
				      "re-encoded: %s", why);
		craft_restore(&cr);
	}
	int applied = 0;
	for (int k = 0; k < NCRAFT; k++) {
		fmt_index ix;
		char err[256];
		ck_assert_int_eq(fmt_index_decode(cr.index_orig, cr.index_len,
						  &ix, err, sizeof(err)), 0);
		snprintf(cur_case, sizeof(cur_case), "crafted: %s",
			 craft_name(k));
		int how = mutate(&cr, &ix, k);
		if (how)
			write_meta(&cr, &ix, how == 1);
		fmt_index_free(&ix);
		if (!how)
			continue;
		applied++;
		if (k == 23 || k == 24) {
			/* the rule across hosts (the commit would have refused
			 * these): open itself must */
			ckpt_reader *r = NULL;
			int rc = ckpt_reader_open(&r, fx.root, STEP, NULL);
			const char *m = ckpt_reader_errmsg(NULL);
			ck_assert_msg(rc == CKPT_E_MISMATCH && strstr(m, "\"w\""),
				      "%s: open %d: %s", cur_case, rc, m);
		}
		judge_crafted(&fx);
		craft_restore(&cr);
	}
	ck_assert_int_ge(applied, NCRAFT - 3);
	check_old_step(&fx);
	snprintf(cur_case, sizeof(cur_case), "crafted");
	free(cr.commit_orig);
	free(cr.index_orig);
	free(cr.shard_orig);
	free(cr.commit_path);
	free(cr.index_path);
	free(cr.shard_path);
	teardown(&fx);
}
END_TEST


/* ckpt_reader_copy of a damaged step fails and commits nothing. */
START_TEST(test_copy_damaged)
{
	struct fixture fx;
	build(&fx);
	struct target t[32];
	int nt = targets(&fx, t, 32);
	tu_rng g;
	tu_rng_seed(&g, 5);
	uint64_t *pos = malloc(4096 * sizeof(*pos));
	int n = 0;
	for (int i = 0; i < nt; i++) {
		if (!strstr(t[i].name, ".shard"))
			continue;
		size_t np = shard_positions(&t[i], pos, 4096, &g);
		for (size_t k = 0; k < np; k += 17, n++) {
			snprintf(cur_case, sizeof(cur_case),
				 "copy with %s byte %llu flipped", t[i].name,
				 (unsigned long long)pos[k]);
			ck_assert_int_eq(tu_flip_bit(t[i].path, pos[k], 3), 0);
			char *dst = tu_path("%s/copy-%d", tu_tmpdir(), n);
			ckpt_reader *r = NULL;
			int rc = ckpt_reader_open(&r, fx.root, STEP, NULL);
			if (rc == 0) {
				rc = ckpt_reader_copy(r, dst, NULL, NULL);
				if (rc != CKPT_E_CORRUPT)
					ck_abort_msg("%s: copy returned %d", cur_case,
						     rc);
				if (!strstr(ckpt_reader_errmsg(r), t[i].name))
					ck_abort_msg("%s: message \"%s\"", cur_case,
						     ckpt_reader_errmsg(r));
				ckpt_reader_close(r);
			}
			ckpt_reader *r2 = NULL;
			rc = ckpt_reader_open(&r2, dst, CKPT_LATEST, NULL);
			if (rc != CKPT_E_NOTFOUND)
				ck_abort_msg("%s: destination has a committed step "
					     "(%d)", cur_case, rc);
			tu_rm_rf(dst);
			free(dst);
			restore(&t[i]);
		}
	}
	ck_assert_int_gt(n, 20);
	snprintf(cur_case, sizeof(cur_case), "copy damaged");
	free(pos);
	free_targets(t, nt);
	teardown(&fx);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("corrupt");
	TCase *tc = tu_tcase("corrupt", 300);
	tcase_add_test(tc, test_flip_small_files);
	tcase_add_test(tc, test_flip_shards);
	tcase_add_test(tc, test_truncate_extend);
	tcase_add_test(tc, test_block_damage);
	tcase_add_test(tc, test_crafted);
	tcase_add_test(tc, test_copy_damaged);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
