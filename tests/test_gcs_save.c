/*
 * test_gcs_save.c - saves to a directory and a gs:// location at once
 * ("both": settings.remote), against the loopback fake server.
 *
 * What is checked: the step is committed locally, then uploaded in the
 * background and committed in the bucket; the objects are byte-identical
 * to the local files and the committed step is complete by its indexes;
 * the local reader reads the tensors back; a pool small enough that the
 * uploader is detached for lagging still ends with the same objects
 * (caught up from the local files); several steps in a row; a soak under
 * the server's random faults (10%: 503, 429, resets, broken streams,
 * stalls) lands byte-identical with no stray objects, retries counted and
 * printed; an upload that cannot succeed (no such bucket) is reported by
 * the upload status and the sink status, by the handle's message after
 * the next save (whose own result is 0) and by ckpt_upload_wait, and
 * leaves its journal, which keeps the step from retention unless gc is told; a
 * local file changed before its upload resumed is not uploaded; a copy
 * to gs:// (ckptctl push) uploads the files at once, bounded by the
 * streams setting; gs:// alone with the float and the zstd codec
 * (compressed chunks staged in output buffers) completes, under a
 * watchdog, and reads back byte-identical; borrowed saves (both, and
 * gs:// alone with the float codec) whose memory is overwritten right
 * after its release land byte-identical. Sizes: CKPT_GCS_SOAK_MIB
 * (default 256) for the soak.
 */
#include "test_gcs_ckpt.h"
#include "test_gcs_util.h"
#include "testutil.h"

#include "ckpt.h"
#include "fmt.h"
#include "gcs.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUCKET "ckpt-save"

static ckpt *open_both(const char *dir, const char *remote, uint64_t pool,
		       uint32_t chunk)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = pool;
	s.chunk_bytes = chunk;
	s.threads = 2;
	s.codec = CKPT_CODEC_NONE;
	s.remote = remote;
	ck_assert_msg(ckpt_open(&c, dir, &s) == 0, "%s", ckpt_errmsg(NULL));
	return c;
}

static void make_set(tu_set *set, size_t mib, uint64_t seed)
{
	size_t i, n = mib / 4 ? mib / 4 : 1;

	tu_set_init(set);
	for (i = 0; i < n; i++) {
		char name[32];
		uint64_t shape[1] = { (mib << 20) / n / 4 + i * 3 };

		snprintf(name, sizeof(name), "layer%zu.w", i);
		tu_set_add(set, name, CKPT_F32, 1, shape, seed + i);
	}
}

/* Save, wait locally, wait for the bucket; check everything. */
static void save_and_check(ckpt *c, const char *dir, const char *prefix,
			   uint64_t step, const tu_set *set)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	ckpt_upload_status us;
	char why[512], *commit;
	int r;

	ck_assert_int_eq(tu_save(c, step, set), 0);
	r = ckpt_upload_wait(c, -1);
	ck_assert_msg(r == 0, "upload: %s", ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_upload_status_get(c, &us), 0);
	ck_assert_uint_eq(us.step, step);
	ck_assert_int_eq(us.state, CKPT_UPLOAD_COMMITTED);
	ck_assert_int_eq(us.status, 0);
	ck_assert_uint_eq(us.pending_steps, 0);
	ck_assert_uint_eq(us.bytes_confirmed, us.bytes_total);
	ck_assert_msg(gk_same_as_local(gc, BUCKET, prefix, dir, step, 0, why,
				       sizeof(why)) == 0,
		      "%s", why);
	ck_assert_msg(gk_step_complete(gc, BUCKET, prefix, step, 1, why,
				       sizeof(why)) == 0,
		      "%s", why);
	commit = gk_object(prefix, step, "COMMIT");
	ck_assert_int_eq(gk_exists(gc, BUCKET, commit), 1);
	free(commit);
	/* the journal is gone once committed */
	commit = tu_path("%s/.upload/step-%" PRIu64 ".journal", dir, step);
	ck_assert_int_ne(access(commit, F_OK), 0);
	free(commit);
	gcs_client_free(gc);
}

static void read_back(const char *dir, uint64_t step, const tu_set *set)
{
	ckpt_reader *r = NULL;
	char why[256];

	ck_assert_int_eq(ckpt_reader_open(&r, dir, step, NULL), 0);
	ck_assert_msg(tu_check_set(r, set, why, sizeof(why)) == 0, "%s", why);
	ckpt_reader_close(r);
}

START_TEST(both_basic)
{
	char *dir = tu_path("%s/both", tu_tmpdir());
	ckpt *c = open_both(dir, "gs://" BUCKET "/basic", 64u << 20, 1u << 20);
	ckpt_sink_status ss[4];
	size_t n = 0;
	tu_set set;

	make_set(&set, 24, 1);
	save_and_check(c, dir, "basic", 1, &set);
	ck_assert_int_eq(ckpt_sink_status_get(c, ss, 4, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_str_eq(ss[1].name, "gcs");
	ck_assert_uint_gt(ss[1].chunks, 0);
	read_back(dir, 1, &set);
	read_back("gs://" BUCKET "/basic", 1, &set);
	tu_set_free(&set);
	/* a second and third step through the same handle */
	make_set(&set, 8, 50);
	save_and_check(c, dir, "basic", 2, &set);
	save_and_check(c, dir, "basic", 3, &set);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
	free(dir);
}
END_TEST

/* 8 slots of 1 MiB: the uploader may hold 2, fewer than a piece: it
 * reads every chunk from the local file once the local sink wrote it, and
 * is never detached for lagging. */
START_TEST(both_lagging)
{
	char *dir = tu_path("%s/lag", tu_tmpdir());
	ckpt *c = open_both(dir, "gs://" BUCKET "/lag", 8u << 20, 1u << 20);
	ckpt_sink_status ss[2];
	size_t n = 0;
	tu_set set;

	make_set(&set, 48, 7);
	save_and_check(c, dir, "lag", 5, &set);
	ck_assert_int_eq(ckpt_sink_status_get(c, ss, 2, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_msg(ss[1].status == 0, "sink gcs: %d %s", ss[1].status,
		      ss[1].msg);
	ck_assert_uint_le(ss[1].max_held, 2);
	read_back(dir, 5, &set);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
	free(dir);
}
END_TEST

START_TEST(both_no_bucket)
{
	char *dir = tu_path("%s/nob", tu_tmpdir());
	char *j = tu_path("%s/.upload/step-4.journal", dir);
	ckpt *c = open_both(dir, "gs://no-such-bucket/x", 16u << 20, 1u << 20);
	ckpt_upload_status us;
	ckpt_sink_status ss[2];
	ckpt_gc_report rep;
	char m4[512];
	const char *told;
	size_t n;
	tu_set set;
	int r;

	make_set(&set, 4, 3);
	/* the local save is not affected */
	ck_assert_int_eq(tu_save(c, 4, &set), 0);
	/* without ckpt_upload_wait: the status says so once it failed... */
	for (n = 0; n < 60000; n++) {
		ck_assert_int_eq(ckpt_upload_status_get(c, &us), 0);
		if (us.state == CKPT_UPLOAD_FAILED)
			break;
		usleep(1000);
	}
	ck_assert_int_eq(us.state, CKPT_UPLOAD_FAILED);
	ck_assert_int_lt(us.status, 0);
	ck_assert_ptr_nonnull(strstr(us.msg, "step 4"));
	ck_assert_int_eq(ckpt_sink_status_get(c, ss, 2, &n), 0);
	ck_assert_int_lt(ss[1].status, 0);
	/* ...and the training loop is told in the handle's message, by the
	 * end of that save (if it failed by then) or by the next one, whose
	 * own result is still 0 */
	snprintf(m4, sizeof(m4), "%s", ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_save(c, 9, NULL, 0), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	told = strstr(m4, "step 4") ? m4 : ckpt_errmsg(c);
	ck_assert_msg(strstr(told, "step 4") && strstr(told, "no-such-bucket"),
		      "%s / %s", m4, ckpt_errmsg(c));
	r = ckpt_upload_wait(c, -1);
	ck_assert_int_lt(r, 0);
	ck_assert_ptr_nonnull(strstr(ckpt_errmsg(c), "no-such-bucket"));
	ck_assert_int_eq(ckpt_upload_status_get(c, &us), 0);
	ck_assert_int_eq(us.state, CKPT_UPLOAD_FAILED);
	ck_assert_int_eq(us.status, r);
	ck_assert_int_eq(access(j, F_OK), 0);
	/* gc keeps a step whose upload is unfinished unless told */
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, &rep), 0);
	ck_assert_uint_eq(rep.steps_removed, 0);
	read_back(dir, 4, &set);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, CKPT_GC_DRY_RUN | CKPT_GC_UNUPLOADED,
				 NULL, NULL, &rep),
			 0);
	ck_assert_uint_eq(rep.steps_removed, 1);
	ck_assert_int_eq(ckpt_close(c), 0);
	read_back(dir, 4, &set);
	tu_set_free(&set);
	free(j);
	free(dir);
}
END_TEST

START_TEST(both_soak)
{
	const char *e = getenv("CKPT_GCS_SOAK_MIB");
	size_t mib = e && atoi(e) > 0 ? (size_t)atoi(e) : 256;
	const char *extra[] = { "--fault-rate", "0.1", "--fault-seed", "11",
				NULL };
	tu_server fs;
	char *dir = tu_path("%s/soak", tu_tmpdir());
	char url[192], saved[128];
	struct gcs_client *gc;
	ckpt_upload_status us;
	char *stats = NULL, *faults;
	ckpt *c;
	tu_set set;
	long n;

	gt_server_start_args(&fs, BUCKET, extra);
	/* the engine finds the faulty server through the environment */
	setenv("STORAGE_EMULATOR_HOST", fs.url, 1);
	memcpy(saved, gk_srv.url, sizeof(saved));
	snprintf(gk_srv.url, sizeof(gk_srv.url), "%s", fs.url);
	c = open_both(dir, "gs://" BUCKET "/soak", 128u << 20, 4u << 20);
	make_set(&set, mib, 99);
	save_and_check(c, dir, "soak", 1, &set);
	ck_assert_int_eq(ckpt_upload_status_get(c, &us), 0);
	snprintf(url, sizeof(url), "%s/_fake/stats", fs.url);
	ck_assert_int_eq(gt_http("GET", url, NULL, &stats), 200);
	faults = stats ? strstr(stats, "\"faults_total\"") : NULL;
	/* printed, not asserted: which requests draw a fault varies */
	printf("soak: %zu MiB through 10%% faults: %" PRIu64 " retries by "
	       "the uploader; server: %.40s\n",
	       mib, us.retries, faults ? faults : "?");
	free(stats);
	ck_assert_int_eq(ckpt_close(c), 0);
	/* no stray or duplicate objects: 4 shards, index, COMMIT, latest */
	gc = gk_client(fs.url);
	n = gk_count(gc, BUCKET, "soak/");
	ck_assert_int_eq(n, 7);
	gcs_client_free(gc);
	tu_server_stop(&fs);
	memcpy(gk_srv.url, saved, sizeof(saved));
	setenv("STORAGE_EMULATOR_HOST", gk_srv.url, 1);
	tu_set_free(&set);
	free(dir);
}
END_TEST

/* The local copy changed after the save (a bit flip on disk) while its
 * upload waited in the journal: the resumed upload reads the file, finds
 * it differs from the index's XXH3 and creates neither the object nor the
 * commit. The first attempt fails fast on a dead endpoint. */
START_TEST(both_corrupt_local)
{
	char *dir = tu_path("%s/corrupt", tu_tmpdir());
	char *shard, *o, dn[32], n1[32];
	struct gcs_client *gc = gk_client(gk_srv.url);
	ckpt *c;
	tu_set set;
	FILE *f;
	int r;

	setenv("CKPT_GCS_DEADLINE", "1", 1);
	setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9", 1);
	c = open_both(dir, "gs://" BUCKET "/corrupt", 16u << 20, 1u << 20);
	make_set(&set, 8, 5);
	ck_assert_int_eq(tu_save(c, 2, &set), 0);
	ck_assert_int_lt(ckpt_upload_wait(c, -1), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	unsetenv("CKPT_GCS_DEADLINE");
	setenv("STORAGE_EMULATOR_HOST", gk_srv.url, 1);

	fmt_step_dirname(2, dn);
	fmt_shard_name(0, 1, n1);
	shard = tu_path("%s/%s/%s", dir, dn, n1);
	f = fopen(shard, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, 10000, SEEK_SET);
	r = fgetc(f);
	fseek(f, 10000, SEEK_SET);
	fputc(r ^ 0x10, f);
	ck_assert_int_eq(fclose(f), 0);

	c = open_both(dir, "gs://" BUCKET "/corrupt", 16u << 20, 1u << 20);
	r = ckpt_upload_wait(c, -1);
	ck_assert_int_eq(r, CKPT_E_CORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_errmsg(c), n1));
	ck_assert_int_eq(ckpt_close(c), 0);
	o = gk_object("corrupt", 2, n1);
	ck_assert_int_eq(gk_exists(gc, BUCKET, o), 0);
	free(o);
	o = gk_object("corrupt", 2, "COMMIT");
	ck_assert_int_eq(gk_exists(gc, BUCKET, o), 0);
	free(o);
	gcs_client_free(gc);
	tu_set_free(&set);
	free(shard);
	free(dir);
}
END_TEST

/* The progress callback of a copy to gs:// asks the server how many
 * resumable uploads are open at that moment and keeps the most. */
struct open_seen {
	char url[256];
	long max_open;
	char seen[512]; /* the server's stats when max_open was seen */
};

static int count_open(void *arg, uint64_t done, uint64_t total)
{
	struct open_seen *o = arg;
	char *stats = NULL, *p;

	(void)done;
	(void)total;
	ck_assert_int_eq(gt_http("GET", o->url, NULL, &stats), 200);
	p = stats ? strstr(stats, "\"uploads_open\"") : NULL;
	ck_assert_ptr_nonnull(p);
	p = strchr(p, ':');
	if (p && strtol(p + 1, NULL, 10) > o->max_open) {
		o->max_open = strtol(p + 1, NULL, 10);
		snprintf(o->seen, sizeof(o->seen), "%s", p);
	}
	free(stats);
	return 0;
}

/* Copies step 6 of dir to gs://BUCKET/prefix counting the uploads open
 * at once under prefix (the server's count, so sessions other tests left
 * open do not count); the copy must be committed and complete. */
static long copy_counted(const char *dir, const char *prefix,
			 struct open_seen *o)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	ckpt_reader *r = NULL;
	char why[512], *to = tu_path("gs://%s/%s", BUCKET, prefix);

	snprintf(o->url, sizeof(o->url), "%s/_fake/stats?prefix=%s/",
		 gk_srv.url, prefix);
	o->max_open = 0;
	o->seen[0] = 0;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 6, NULL), 0);
	ck_assert_msg(ckpt_reader_copy(r, to, count_open, o) == 0, "%s",
		      ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
	ck_assert_msg(gk_step_complete(gc, BUCKET, prefix, 6, 1, why,
				       sizeof(why)) == 0,
		      "%s", why);
	gcs_client_free(gc);
	free(to);
	return o->max_open;
}

/* ckpt_reader_copy (ckptctl push) to gs:// uploads the shard files at
 * once, as many as the parallel streams allow: with 4 files of 5 blocks
 * (each may hold 4) every file needs the server before it can go on, so
 * with the default streams several sessions are open together and with
 * CKPT_GCS_STREAMS=1 never more than one. Both copies commit, verified. */
START_TEST(copy_parallel)
{
	char *dir = tu_path("%s/par", tu_tmpdir());
	struct open_seen o;
	ckpt_settings s;
	ckpt *c = NULL;
	tu_set set;

	ckpt_settings_default(&s);
	s.codec = CKPT_CODEC_NONE;
	s.threads = 2;
	s.files_per_host = 4;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	make_set(&set, 160, 31);
	ck_assert_int_eq(tu_save(c, 6, &set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_msg(copy_counted(dir, "par", &o) >= 2,
		      "uploads open at once: %ld (%s)", o.max_open, o.seen);
	read_back("gs://" BUCKET "/par", 6, &set);
	setenv("CKPT_GCS_STREAMS", "1", 1);
	ck_assert_msg(copy_counted(dir, "par1", &o) == 1,
		      "with one stream, uploads open at once: %ld (%s)",
		      o.max_open, o.seen);
	unsetenv("CKPT_GCS_STREAMS");
	tu_set_free(&set);
	free(dir);
}
END_TEST

/* gs:// alone: the upload sink decides the save; ckpt_wait() returns
 * when the step is committed in the bucket. */
START_TEST(alone)
{
	char *copy = tu_path("%s/copy", tu_tmpdir());
	struct gcs_client *gc = gk_client(gk_srv.url);
	ckpt_upload_status us;
	ckpt_sink_status ss;
	ckpt_settings s;
	ckpt *c = NULL;
	char why[512], *o;
	size_t n = 0;
	tu_set set;

	ckpt_settings_default(&s);
	s.staging_bytes = 32u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 2;
	ck_assert_msg(ckpt_open(&c, "gs://" BUCKET "/alone", &s) == 0, "%s",
		      ckpt_errmsg(NULL));
	make_set(&set, 40, 21);
	ck_assert_msg(tu_save(c, 3, &set) == 0, "%s", ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_sink_status_get(c, &ss, 1, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(ss.name, "gcs");
	ck_assert_uint_eq(ss.required, 1);
	ck_assert_int_eq(ckpt_upload_status_get(c, &us), 0);
	ck_assert_int_eq(us.state, CKPT_UPLOAD_COMMITTED);
	ck_assert_uint_eq(us.bytes_confirmed, us.bytes_total);
	o = gk_object("alone", 3, "COMMIT");
	ck_assert_int_eq(gk_exists(gc, BUCKET, o), 1);
	free(o);
	ck_assert_msg(gk_step_complete(gc, BUCKET, "alone", 3, 1, why,
				       sizeof(why)) == 0,
		      "%s", why);
	/* a second save of the same step cannot commit over it */
	ck_assert_int_eq(tu_save(c, 3, &set), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_close(c), 0);
	/* read back byte-identical: through the gs:// reader, and through
	 * a downloaded copy with the local one */
	read_back("gs://" BUCKET "/alone", 3, &set);
	ck_assert_int_eq(gk_download(gc, BUCKET, "alone", copy), 0);
	read_back(copy, 3, &set);
	/* a bucket that does not exist fails the save, loudly */
	ck_assert_int_eq(ckpt_open(&c, "gs://no-such-bucket/a", &s), 0);
	ck_assert_int_lt(tu_save(c, 1, &set), 0);
	ck_assert_msg(strstr(ckpt_errmsg(c), "no-such-bucket"), "%s",
		      ckpt_errmsg(c));
	ckpt_close(c);
	gcs_client_free(gc);
	tu_set_free(&set);
	free(copy);
}
END_TEST

/* ---- gs:// alone with a compressing codec --------------------------- */

typedef struct watch {
	ckpt *c;
	uint64_t step;
	const tu_set *set;
	int rc, done;
	pthread_mutex_t mu;
	pthread_cond_t cv;
} watch;

static void *watch_run(void *arg)
{
	watch *w = arg;
	int rc = tu_save(w->c, w->step, w->set);

	pthread_mutex_lock(&w->mu);
	w->rc = rc;
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* tu_save in a thread; fails the test if it has not returned after 300 s
 * (times $CKPT_TEST_TIMEOUT_MULT): a hang, not a slow save. */
static int save_watched(ckpt *c, uint64_t step, const tu_set *set,
			const char *ctx)
{
	const char *m = getenv("CKPT_TEST_TIMEOUT_MULT");
	int secs = 300 * (m && atoi(m) > 0 ? atoi(m) : 1), done;
	watch w = { .c = c, .step = step, .set = set };
	struct timespec dl;
	pthread_t t;

	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, watch_run, &w), 0);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += secs;
	pthread_mutex_lock(&w.mu);
	while (!w.done &&
	       pthread_cond_timedwait(&w.cv, &w.mu, &dl) != ETIMEDOUT)
		;
	done = w.done;
	pthread_mutex_unlock(&w.mu);
	ck_assert_msg(done,
		      "%s: save of step %" PRIu64 " hung (no return in %d s)",
		      ctx, step, secs);
	pthread_join(t, NULL);
	return w.rc;
}

/*
 * gs:// alone with the float and the zstd codec, default-sized chunks
 * (4 MiB) and a pool whose pieces are capped (16 MiB): bf16 weights
 * compress to more than a piece's share, so the compressed chunks are
 * staged in output buffers until their piece fills. The unfilled pieces
 * of the 4 files used to hold every output buffer while the encode
 * workers waited for one, and the save hung. Read back byte-identical.
 */
static void alone_codec(int codec, const char *prefix)
{
	char *copy = tu_path("%s/copy-%s", tu_tmpdir(), prefix);
	char *remote = tu_path("gs://%s/%s", BUCKET, prefix);
	struct gcs_client *gc = gk_client(gk_srv.url);
	ckpt_settings s;
	ckpt *c = NULL;
	char why[512];
	size_t i;
	tu_set set;

	ckpt_settings_default(&s);
	s.staging_bytes = 256u << 20;
	s.chunk_bytes = 4u << 20;
	s.files_per_host = 4;
	s.threads = 2;
	s.codec = codec;
	ck_assert_msg(ckpt_open(&c, remote, &s) == 0, "%s", ckpt_errmsg(NULL));
	tu_set_init(&set);
	for (i = 0; i < 8; i++) {
		char name[32];
		uint64_t shape[2] = { 1024 + i, 5 * 1024 };

		snprintf(name, sizeof(name), "block%zu.w", i);
		tu_set_add(&set, name, CKPT_BF16, 2, shape, 90 + i);
	}
	ck_assert_msg(save_watched(c, 1, &set, prefix) == 0, "%s: %s", prefix,
		      ckpt_errmsg(c));
	ck_assert_msg(save_watched(c, 2, &set, prefix) == 0, "%s: %s", prefix,
		      ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_msg(gk_step_complete(gc, BUCKET, prefix, 2, 1, why,
				       sizeof(why)) == 0,
		      "%s", why);
	read_back(remote, 1, &set);
	read_back(remote, 2, &set);
	ck_assert_int_eq(gk_download(gc, BUCKET, prefix, copy), 0);
	read_back(copy, 2, &set);
	gcs_client_free(gc);
	tu_set_free(&set);
	free(remote);
	free(copy);
}

START_TEST(alone_float)
{
	alone_codec(CKPT_CODEC_FLOAT, "alone-float");
}
END_TEST

START_TEST(alone_zstd)
{
	alone_codec(CKPT_CODEC_ZSTD, "alone-zstd");
}
END_TEST

/* ---- borrow mode --------------------------------------------------- */

/*
 * A borrowed save (CKPT_SAVE_BORROW) of a copy of `set`: once the engine
 * releases the copy it is overwritten and freed, before the save is
 * collected, so an upload that sent the caller's memory after the release
 * would send garbage (the sinks are to see pool buffers only). Returns
 * ckpt_wait's result.
 */
static int save_lent(ckpt *c, uint64_t step, const tu_set *set)
{
	ckpt_tensor *v = calloc(set->n, sizeof(*v));
	uint8_t **copy = calloc(set->n, sizeof(*copy));
	ckpt_save_opts o;
	size_t i;
	int rc;

	ck_assert(v && copy);
	tu_set_view(set, v);
	for (i = 0; i < set->n; i++) {
		copy[i] = malloc(set->t[i].nbytes + 3);
		ck_assert(copy[i]);
		memcpy(copy[i] + 3, set->t[i].data, set->t[i].nbytes);
		v[i].data = copy[i] + 3; /* unaligned */
	}
	ckpt_save_opts_default(&o);
	o.flags = CKPT_SAVE_BORROW;
	rc = ckpt_save_ex(c, step, v, set->n, &o);
	ck_assert_msg(rc == 0, "%s", ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_wait_released(c, -1), 0);
	for (i = 0; i < set->n; i++) {
		memset(copy[i], 0x5a, set->t[i].nbytes + 3);
		free(copy[i]);
	}
	free(copy);
	free(v);
	return ckpt_wait(c);
}

/* A directory with a remote: the upload sends what was lent. */
START_TEST(both_borrow)
{
	char *dir = tu_path("%s/both", tu_tmpdir());
	ckpt *c = open_both(dir, "gs://" BUCKET "/borrow", 8u << 20, 1u << 20);
	struct gcs_client *gc = gk_client(gk_srv.url);
	char why[512];
	tu_set set;

	make_set(&set, 24, 77);
	ck_assert_int_eq(save_lent(c, 1, &set), 0);
	ck_assert_msg(ckpt_upload_wait(c, -1) == 0, "%s", ckpt_errmsg(c));
	ck_assert_msg(gk_same_as_local(gc, BUCKET, "borrow", dir, 1, 0, why,
				       sizeof(why)) == 0,
		      "%s", why);
	ck_assert_msg(gk_step_complete(gc, BUCKET, "borrow", 1, 1, why,
				       sizeof(why)) == 0,
		      "%s", why);
	ck_assert_int_eq(ckpt_close(c), 0);
	read_back(dir, 1, &set);
	read_back("gs://" BUCKET "/borrow", 1, &set);
	gcs_client_free(gc);
	tu_set_free(&set);
	free(dir);
}
END_TEST

/* gs:// alone with the float codec: compressed chunks held in output
 * buffers until their piece fills, from a borrowed save. */
START_TEST(alone_borrow)
{
	const char *remote = "gs://" BUCKET "/alone-borrow";
	ckpt_settings s;
	ckpt *c = NULL;
	size_t i;
	tu_set set;

	ckpt_settings_default(&s);
	s.staging_bytes = 32u << 20;
	s.chunk_bytes = 1u << 20;
	s.files_per_host = 4;
	s.threads = 2;
	s.codec = CKPT_CODEC_FLOAT;
	ck_assert_msg(ckpt_open(&c, remote, &s) == 0, "%s", ckpt_errmsg(NULL));
	tu_set_init(&set);
	for (i = 0; i < 8; i++) {
		char name[32];
		uint64_t shape[2] = { 256 + i, 5 * 1024 };

		snprintf(name, sizeof(name), "block%zu.w", i);
		tu_set_add(&set, name, CKPT_BF16, 2, shape, 190 + i);
	}
	ck_assert_msg(save_lent(c, 1, &set) == 0, "%s", ckpt_errmsg(c));
	ck_assert_int_eq(ckpt_close(c), 0);
	read_back(remote, 1, &set);
	tu_set_free(&set);
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { both_basic,     both_lagging,
				       both_no_bucket, both_corrupt_local,
				       both_soak,      alone,
				       alone_float,    alone_zstd,
				       copy_parallel,  both_borrow,
				       alone_borrow };

	return gk_main(BUCKET, "gcs_save", 900, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
