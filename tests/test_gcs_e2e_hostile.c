/*
 * test_gcs_e2e_hostile.c - servers that lie, through the whole product:
 * the fake's hostile rules (tests/servers/fake_gcs_hostile.py) and objects
 * tampered with in the bucket, against what a user runs: the gs:// reader
 * (open, read every tensor, verify), a save to gs:// alone and to a
 * directory with a remote, and ckptctl ls / inspect / verify / restore /
 * push (run as a program: $CKPT_CKPTCTL; skipped without it).
 *
 * Every case must end in an error naming the object (gs://BUCKET/...) and
 * what was wrong, never a crash (the suite runs under ASan in CI), and
 * must commit nothing from bad bytes: no COMMIT object for a failed
 * upload, no committed step in a directory a failed restore wrote to; and
 * the committed checkpoint already in the bucket still verifies. Each rule
 * is checked to have fired, so a case cannot pass by missing its target.
 *
 *   local DIR (steps 1, 2) --ckptctl push--> gs://B/good@1 (and copies)
 *   rule on --> each path --> error? names gs://? nothing committed?
 *   rule off --> gs://B/good@1 still verifies
 */
#include "test_gcs_ckpt.h"
#include "test_gcs_util.h"
#include "testutil.h"

#include "ckpt.h"
#include "fmt.h"
#include "gcs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUCKET "ckpt-e2e"
#define GS "gs://" BUCKET "/"

static char *src;    /* local checkpoint: steps 1 and 2 */
static tu_set set;   /* its tensors */
static int have_ctl; /* $CKPT_CKPTCTL runs */
static int nctx;     /* unique names */

/* ---- the fake's hostile rules ---- */

static void rule(const char *mode, const char *match)
{
	gt_rule(gk_srv.url, mode, match);
}

static long rules_fired(void)
{
	return gt_rules_fired(gk_srv.url);
}

static long rules_clear(void)
{
	return gt_rules_clear(gk_srv.url);
}

/* A path the lie reached (the rule fired since `before`; with no rule:
 * always) must fail; one it did not reach must succeed. */
static int reached(long before, int rule_on)
{
	return !rule_on || rules_fired() > before;
}

/* A call's result: if the lie reached it, an error naming gs:// and
 * `what`; else success. Returns 1 when it failed. `lenient`: a lie met
 * after the commit (the `latest` hint lists the steps) may be survived;
 * the caller then checks that what was committed is sound. */
static int lenient;
static const char *cur_mode, *cur_match; /* the rule of the case */
static long fired_before;                /* by its earlier incarnations */

static void committed_sound(const char *loc, uint64_t step);

/* ---- ckptctl ---- */

/* Runs ckptctl with args (a shell word list); exit status, output (stdout
 * and stderr) in *out (malloc'd). */
static int ctl(char **out, const char *fmt, ...)
{
	char args[1024], *cmd, buf[4096];
	size_t len = 0, n;
	va_list ap;
	FILE *p;
	int st;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	cmd = tu_path("'%s' %s 2>&1", getenv("CKPT_CKPTCTL"), args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	*out = calloc(1, 1);
	while ((n = fread(buf, 1, sizeof(buf), p)) > 0) {
		*out = realloc(*out, len + n + 1);
		memcpy(*out + len, buf, n);
		len += n;
		(*out)[len] = 0;
	}
	st = pclose(p);
	free(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ckptctl with args: if the lie reached it (see reached()), it must fail
 * (status 1: not a crash) naming gs:// and `what`; else succeed. Returns
 * 1 when it failed. */
static int ctl_check(int rule_on, const char *what, const char *fmt, ...)
{
	char args[1024], *out;
	long before = rule_on ? rules_fired() : 0;
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	st = ctl(&out, "%s", args);
	printf("  ckptctl %s -> %d: %s", args, st, out);
	if (!reached(before, rule_on) || (st == 0 && lenient)) {
		ck_assert_msg(st == 0,
			      "ckptctl %s (not reached): status %d: %s", args,
			      st, out);
		free(out);
		return 0;
	}
	ck_assert_msg(st == 1, "ckptctl %s: status %d: %s", args, st, out);
	ck_assert_msg(strstr(out, GS), "ckptctl %s: no " GS " in: %s", args,
		      out);
	ck_assert_msg(!what || strstr(out, what), "ckptctl %s: no '%s' in: %s",
		      args, what, out);
	free(out);
	return 1;
}

static void ctl_ok(const char *args)
{
	char *out;
	int st = ctl(&out, "%s", args);

	ck_assert_msg(st == 0, "ckptctl %s: status %d: %s", args, st, out);
	free(out);
}

/* ---- checks ---- */

static int check(int rule_on, long before, int r, const char *msg,
		 const char *what, const char *doing)
{
	printf("  %s -> %d: %s\n", doing, r, r ? msg : "");
	if (!reached(before, rule_on) || (r == 0 && lenient)) {
		ck_assert_msg(r == 0, "%s (not reached): %s", doing, msg);
		return 0;
	}
	ck_assert_msg(r < 0, "%s succeeded", doing);
	ck_assert_msg(strstr(msg, GS), "%s: no " GS " in: %s", doing, msg);
	ck_assert_msg(!what || strstr(msg, what), "%s: no '%s' in: %s", doing,
		      what, msg);
	return 1;
}

/* Opens loc@step, reads every tensor, verifies: the first error. */
static int read_all(const char *loc, uint64_t step, char *msg, size_t len)
{
	ckpt_reader *r = NULL;
	size_t i;
	int rc;

	msg[0] = 0;
	rc = ckpt_reader_open(&r, loc, step, NULL);
	if (rc) {
		snprintf(msg, len, "%s", ckpt_errmsg(NULL));
		return rc;
	}
	for (i = 0; rc == 0 && i < set.n; i++) {
		void *buf = malloc(set.t[i].nbytes);

		rc = ckpt_read(r, set.t[i].name, buf, set.t[i].nbytes);
		free(buf);
	}
	if (rc == 0)
		rc = ckpt_reader_verify(r, NULL, NULL);
	if (rc)
		snprintf(msg, len, "%s", ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
	return rc;
}

/* No committed step in a local directory (a failed restore's target). */
static void dir_uncommitted(const char *dir)
{
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	ckpt *c = NULL;

	if (ckpt_open(&c, dir, NULL) != 0)
		return; /* never created */
	ck_assert_int_eq(ckpt_list(c, &steps, &n), 0);
	ck_assert_msg(n == 0, "%s: %zu committed steps after a failure", dir,
		      n);
	ckpt_free(steps);
	ckpt_close(c);
}

static void no_commit(const char *prefix, uint64_t step)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	char *o = gk_object(prefix, step, FMT_COMMIT_NAME);

	ck_assert_msg(gk_exists(gc, BUCKET, o) == 0,
		      GS "%s exists after a failed upload", o);
	free(o);
	gcs_client_free(gc);
}

/* A step an upload path committed reads back whole and verified. */
static void committed_sound(const char *loc, uint64_t step)
{
	char msg[512];

	/* read with the rule out of the way */
	fired_before += rules_clear();
	ck_assert_msg(read_all(loc, step, msg, sizeof(msg)) == 0,
		      "%s@%" PRIu64 ": %s", loc, step, msg);
	rule(cur_mode, cur_match);
}

/* The committed step the bucket had still reads and verifies. */
static void good_intact(void)
{
	char msg[512];

	ck_assert_msg(read_all(GS "good", 1, msg, sizeof(msg)) == 0, "%s", msg);
	if (have_ctl)
		ctl_ok("verify " GS "good@1");
}

/* ---- setup ---- */

/* src@step copied to dst by the library; an earlier test's copy is kept */
static void copy_step(uint64_t step, const char *dst)
{
	ckpt_reader *r = NULL;
	int rc;

	ck_assert_int_eq(ckpt_reader_open(&r, src, step, NULL), 0);
	rc = ckpt_reader_copy(r, dst, NULL, NULL);
	ck_assert_msg(rc == 0 || rc == CKPT_E_EXISTS, "copy to %s: %s", dst,
		      ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
}

static void setup(void)
{
	const char *ctlp = getenv("CKPT_CKPTCTL");
	ckpt_settings s;
	ckpt *c = NULL;
	size_t i;

	have_ctl = ctlp && access(ctlp, X_OK) == 0;
	/* retries of a lie (a truncated body is retried) end within 10 s:
	 * it never changes its mind; honest operations have time enough
	 * even under ASan on a loaded machine */
	setenv("CKPT_GCS_DEADLINE", "10", 1);
	src = tu_path("%s/src", tu_tmpdir());
	ckpt_settings_default(&s);
	s.staging_bytes = 16u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 2;
	s.codec = CKPT_CODEC_NONE;
	ck_assert_int_eq(ckpt_open(&c, src, &s), 0);
	tu_set_init(&set);
	for (i = 0; i < 3; i++) {
		char name[32];
		uint64_t shape[1] = { (1u << 20) + i * 1000 };

		snprintf(name, sizeof(name), "layer%zu.w", i);
		tu_set_add(&set, name, CKPT_F32, 1, shape, 40 + i);
	}
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	ck_assert_int_eq(tu_save(c, 2, &set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	c = NULL;
	/* gs://B/good@1: copied by the library (ckptctl push is a path
	 * under test, not a fixture) */
	copy_step(1, GS "good");
}

/* ---- reads ---- */

struct read_case {
	const char *mode, *match; /* rule, or NULL: a tampered copy */
	const char *what;         /* expected in every message */
	int meta;                 /* tampered metadata: inspect must fail too */
};

/* Every read path on loc@1; each one the lie reaches must fail (with a
 * rule: each one it reached; tampered: the reader, verify, restore, and
 * inspect when metadata was damaged). */
static void read_paths(const char *loc, const struct read_case *k)
{
	int on = k->mode != NULL;
	char msg[1024], *dir;
	long before;
	int r;

	printf("case %s %s:\n", k->mode ? k->mode : "tampered", loc);
	before = on ? rules_fired() : 0;
	r = read_all(loc, 1, msg, sizeof(msg));
	check(on, before, r, msg, k->what, "reader");
	if (!have_ctl)
		return;
	/* ls lists what is committed: it need not read what was damaged */
	if (on) {
		ctl_check(on, k->what, "ls %s", loc);
	} else {
		char *out;
		int st = ctl(&out, "ls %s", loc);

		printf("  ckptctl ls %s -> %d: %s", loc, st, out);
		ck_assert_int_le(st, 1);
		free(out);
	}
	if (on || k->meta)
		ctl_check(on, k->what, "inspect %s@1", loc);
	ctl_check(on, k->what, "verify %s@1", loc);
	dir = tu_path("%s/restore%d", tu_tmpdir(), nctx++);
	if (ctl_check(on, k->what, "restore %s@1 --to %s", loc, dir))
		dir_uncommitted(dir);
	free(dir);
}

START_TEST(hostile_reads)
{
	static const struct read_case cases[] = {
		{ "bad-crc", ".shard", ".shard", 0 },
		{ "truncate", ".shard", ".shard", 0 },
		{ "garbage-stat", "good/", NULL, 0 },
		{ "garbage-list", "good", NULL, 0 },
		{ "endless-list", "good", NULL, 0 },
	};
	size_t i;

	setup();
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		rule(cases[i].mode, cases[i].match);
		read_paths(GS "good", &cases[i]);
		ck_assert_int_gt(rules_clear(), 0);
		good_intact();
	}
}
END_TEST

/* A copy of good@1 at gs://B/prefix whose object `name` is replaced by
 * its bytes with one bit flipped (flip) or cut to half (else). */
static void tampered_copy(const char *prefix, const char *name, int flip)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	char *loc = tu_path(GS "%s", prefix), *o = gk_object(prefix, 1, name);
	uint8_t *buf;
	void *data = NULL;
	size_t len = 0;

	copy_step(1, loc);
	ck_assert_int_eq(gcs_get(gc, BUCKET, o, 0, &data, &len, NULL), 0);
	buf = data;
	if (flip)
		buf[len / 2] ^= 0x04;
	else
		len /= 2;
	ck_assert_int_eq(gcs_put(gc, BUCKET, o, buf, len, GCS_NO_COND, NULL),
			 0);
	free(data);
	free(o);
	free(loc);
	gcs_client_free(gc);
}

START_TEST(tampered_objects)
{
	char ix[32], sh[32];
	const struct read_case idx = { NULL, NULL, ix, 1 },
			       commit = { NULL, NULL, FMT_COMMIT_NAME, 1 },
			       shard = { NULL, NULL, sh, 0 };

	setup();
	fmt_index_name(0, ix);
	fmt_shard_name(0, 0, sh);
	tampered_copy("tidx", ix, 1);
	read_paths(GS "tidx", &idx);
	tampered_copy("tcommit", FMT_COMMIT_NAME, 1);
	read_paths(GS "tcommit", &commit);
	tampered_copy("tshort", sh, 0);
	read_paths(GS "tshort", &shard);
	good_intact();
}
END_TEST

/* ---- uploads ---- */

static ckpt *open_loc(const char *dir, const char *remote)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = 16u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 2;
	s.codec = CKPT_CODEC_NONE;
	s.remote = remote;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	return c;
}

/* Every upload path with a rule on; a path it reached must fail and
 * commit nothing, one it did not reach must commit. Returns how many
 * failed. */
static int upload_paths(const char *mode, const char *match, const char *what)
{
	char pre[64], why[256], *loc, *dir;
	int r, failed = 0, f;
	long before;
	ckpt *c;

	printf("case %s %s:\n", mode, match);
	/* gs:// alone: the save itself */
	snprintf(pre, sizeof(pre), "alone%d", nctx++);
	loc = tu_path(GS "%s", pre);
	before = rules_fired();
	c = open_loc(loc, NULL);
	r = tu_save(c, 3, &set);
	f = check(1, before, r, ckpt_errmsg(c), what, "save gs:// alone");
	ckpt_close(c);
	if (f)
		no_commit(pre, 3);
	else
		committed_sound(loc, 3);
	failed += f;
	free(loc);
	/* DIR + remote: committed locally whatever the upload does */
	snprintf(pre, sizeof(pre), "both%d", nctx++);
	loc = tu_path(GS "%s", pre);
	dir = tu_path("%s/%s", tu_tmpdir(), pre);
	before = rules_fired();
	c = open_loc(dir, loc);
	ck_assert_int_eq(tu_save(c, 3, &set), 0);
	r = ckpt_upload_wait(c, -1);
	f = check(1, before, r, ckpt_errmsg(c), what, "save DIR+remote");
	ck_assert_int_eq(ckpt_close(c), 0);
	if (f)
		no_commit(pre, 3);
	else
		committed_sound(loc, 3);
	failed += f;
	ck_assert_msg(tu_check_root(dir, 3, &set, why, sizeof(why)) == 0, "%s",
		      why);
	free(dir);
	free(loc);
	if (!have_ctl)
		return failed;
	snprintf(pre, sizeof(pre), "push%d", nctx++);
	for (int k = 0; k < 2; k++) {
		snprintf(pre, sizeof(pre), "%s%d", k ? "rto" : "push", nctx++);
		f = k ? ctl_check(1, what, "restore %s@2 --to " GS "%s", src,
				  pre) :
			ctl_check(1, what, "push %s@2 " GS "%s", src, pre);
		loc = tu_path(GS "%s", pre);
		if (f)
			no_commit(pre, 2);
		else
			committed_sound(loc, 2);
		free(loc);
		failed += f;
	}
	return failed;
}

START_TEST(hostile_uploads)
{
	static const char *const cases[][3] = {
		/* mode, match, expected in the message */
		{ "garbage-upload", ".shard", ".shard" },
		{ "garbage-upload", ".index", ".index" },
		{ "range-lie", ".shard", ".shard" },
		{ "foreign-location", ".shard", "another host" },
		{ "garbage-stat", "", NULL },
		{ "garbage-list", "", NULL },
	};
	size_t i;

	setup();
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cur_mode = cases[i][0];
		cur_match = cases[i][1];
		fired_before = 0;
		rule(cur_mode, cur_match);
		lenient = !strcmp(cur_mode, "garbage-list");
		upload_paths(cur_mode, cur_match, cases[i][2]);
		ck_assert_int_gt(fired_before + rules_clear(), 0);
		good_intact();
	}
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { hostile_reads, tampered_objects,
				       hostile_uploads };

	return gk_main(BUCKET, "gcs_e2e_hostile", 600, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
