/*
 * test_multihost.c - several hosts (here: several handles in one process,
 * host_index 0..n-1) each save their slices of global arrays plus private
 * tensors; a coordinator commits; readers reassemble any box.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char why[1024];

#define NH 3

static ckpt *open_host(const char *dir, uint32_t h, uint32_t n)
{
	ckpt_settings s;
	tu_settings(&s);
	s.host_index = h;
	s.host_count = n;
	s.threads = 1;
	s.files_per_host = 1 + h % 3;
	static const int codecs[3] = {CKPT_CODEC_FLOAT, CKPT_CODEC_ZSTD,
				      CKPT_CODEC_NONE};
	s.codec = codecs[h % 3];
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "open host %u: %d %s", h, rc, ckpt_errmsg(NULL));
	return c;
}

static ckpt *open_coordinator(const char *dir, uint32_t n)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	s.host_count = n;
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "open coordinator: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

/* Global arrays and how they are split over the 3 hosts. */
struct garray {
	const char *name;
	int dtype;
	uint32_t ndim;
	uint64_t shape[3];
	uint64_t off[NH][3];
	uint64_t ext[NH][3];
	uint64_t seed;
};

static const struct garray arrays[] = {
	/* along dim 0, uneven */
	{"rows", CKPT_F32, 2, {10, 6}, {{0, 0}, {4, 0}, {7, 0}},
	 {{4, 6}, {3, 6}, {3, 6}}, 11},
	/* along dim 1, several chunks per slice */
	{"cols", CKPT_BF16, 2, {8, 30000}, {{0, 0}, {0, 10000}, {0, 17000}},
	 {{8, 10000}, {8, 7000}, {8, 13000}}, 12},
	/* a grid over dims 0 and 1 */
	{"grid", CKPT_I32, 3, {6, 4, 5}, {{0, 0, 0}, {3, 0, 0}, {3, 2, 0}},
	 {{3, 4, 5}, {3, 2, 5}, {3, 2, 5}}, 13},
	/* 1-D, slices of odd byte length */
	{"vec.u8", CKPT_U8, 1, {100001}, {{0}, {33333}, {66667}},
	 {{33333}, {33334}, {33334}}, 14},
};
#define NARRAYS (sizeof(arrays) / sizeof(*arrays))

static void host_set(tu_set *set, uint32_t h, uint64_t step)
{
	tu_set_init(set);
	char name[64];
	uint64_t ps[1] = {100 + h};
	snprintf(name, sizeof(name), "host%u.private", h);
	tu_set_add(set, name, CKPT_F32, 1, ps, step * 100 + h);
	for (size_t a = 0; a < NARRAYS; a++) {
		const struct garray *g = &arrays[a];
		tu_set_add_slice(set, g->name, g->dtype, g->ndim, g->shape,
				 g->off[h], g->ext[h], g->seed + step);
	}
	if (h == 1) {
		/* one array held whole by one host */
		uint64_t sh[2] = {33, 17};
		tu_set_add(set, "whole.on.h1", CKPT_F64, 2, sh, step + 999);
	}
}

static void save_host(ckpt *c, uint32_t h, uint64_t step)
{
	tu_set set;
	host_set(&set, h, step);
	int rc = tu_save(c, step, &set);
	ck_assert_msg(rc == 0, "host %u save: %d (%s) %s", h, rc,
		      ckpt_strerror(rc), ckpt_errmsg(c));
	ckpt_progress p;
	ck_assert_int_eq(ckpt_poll(c, &p), 0);
	ck_assert_int_eq(p.state, CKPT_STATE_DONE);
	tu_set_free(&set);
}

static size_t list_count(ckpt *c)
{
	ckpt_step_info *li;
	size_t n;
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ckpt_free(li);
	return n;
}

static void check_full(const char *dir, uint64_t step)
{
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, dir, step, NULL);
	ck_assert_msg(rc == 0, "reader_open: %d %s", rc, ckpt_reader_errmsg(NULL));
	ck_assert_uint_eq(ckpt_reader_host_count(r), NH);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), NARRAYS + NH + 1);

	/* private tensors and the whole one */
	for (uint32_t h = 0; h < NH; h++) {
		tu_set set;
		host_set(&set, h, step);
		tu_set priv;
		tu_set_init(&priv);
		for (size_t i = 0; i < set.n; i++)
			if (!set.t[i].sliced) {
				tu_tensor *t = tu_set_add(&priv, set.t[i].name,
							  set.t[i].dtype,
							  set.t[i].ndim,
							  set.t[i].shape, 0);
				memcpy(t->data, set.t[i].data, t->nbytes);
			}
		ck_assert_msg(tu_check_set(r, &priv, why, sizeof(why)) == 0,
			      "%s", why);
		/* each host's slices read back as boxes */
		ck_assert_msg(tu_check_set(r, &set, why, sizeof(why)) == 0,
			      "%s", why);
		for (size_t i = 0; i < priv.n; i++) {
			size_t ix;
			ckpt_tensor_info ti;
			ckpt_slice_info si;
			ck_assert_int_eq(ckpt_reader_find(r, priv.t[i].name, &ix), 0);
			ck_assert_int_eq(ckpt_reader_tensor(r, ix, &ti), 0);
			ck_assert_uint_eq(ti.slice_count, 1);
			ck_assert_int_eq(ckpt_reader_slice(r, ix, 0, &si), 0);
			ck_assert_uint_eq(si.host, h);
		}
		tu_set_free(&priv);
		tu_set_free(&set);
	}

	tu_rng g;
	tu_rng_seed(&g, step);
	for (size_t a = 0; a < NARRAYS; a++) {
		const struct garray *ga = &arrays[a];
		size_t es = ckpt_dtype_size(ga->dtype);
		uint64_t nb;
		uint8_t *full = tu_global_data(ga->dtype, ga->ndim, ga->shape,
					       ga->seed + step, &nb);
		size_t ix;
		ckpt_tensor_info ti;
		ck_assert_int_eq(ckpt_reader_find(r, ga->name, &ix), 0);
		ck_assert_int_eq(ckpt_reader_tensor(r, ix, &ti), 0);
		ck_assert_int_eq(ti.dtype, ga->dtype);
		ck_assert_uint_eq(ti.ndim, ga->ndim);
		ck_assert_uint_eq(ti.nbytes, nb);
		ck_assert_uint_eq(ti.slice_count, NH);
		int seen[NH] = {0};
		for (uint32_t j = 0; j < NH; j++) {
			ckpt_slice_info si;
			ck_assert_int_eq(ckpt_reader_slice(r, ix, j, &si), 0);
			ck_assert_uint_lt(si.host, NH);
			seen[si.host]++;
			for (uint32_t d = 0; d < ga->ndim; d++) {
				ck_assert_uint_eq(si.offset[d], ga->off[si.host][d]);
				ck_assert_uint_eq(si.extent[d], ga->ext[si.host][d]);
			}
			ck_assert_uint_eq(si.nbytes,
					  tu_count(ga->ndim, ga->ext[si.host]) * es);
		}
		for (uint32_t h = 0; h < NH; h++)
			ck_assert_int_eq(seen[h], 1);

		/* the whole array, through read and read_alloc */
		uint8_t *got = malloc(nb);
		int rc2 = ckpt_read(r, ga->name, got, nb);
		ck_assert_msg(rc2 == 0, "read %s: %d %s", ga->name, rc2,
			      ckpt_reader_errmsg(r));
		ck_assert_msg(!memcmp(got, full, nb), "%s differs", ga->name);
		void *p;
		uint64_t pn;
		ck_assert_int_eq(ckpt_read_alloc(r, ga->name, &p, &pn), 0);
		ck_assert_uint_eq(pn, nb);
		ck_assert(!memcmp(p, full, nb));
		ckpt_free(p);
		free(got);

		/* arbitrary boxes, most spanning several slices */
		for (int k = 0; k < 40; k++) {
			uint64_t off[3], ext[3];
			for (uint32_t d = 0; d < ga->ndim; d++) {
				off[d] = tu_rng_below(&g, ga->shape[d]);
				ext[d] = 1 + tu_rng_below(&g, ga->shape[d] - off[d]);
			}
			uint64_t bn = tu_count(ga->ndim, ext) * es;
			uint8_t *want = malloc(bn), *box = malloc(bn);
			tu_extract_box(full, ga->ndim, ga->shape, es, off, ext,
				       want);
			memset(box, 0xee, bn);
			int rc3 = ckpt_read_slice(r, ga->name, off, ext, box, bn);
			ck_assert_msg(rc3 == 0, "box of %s: %d %s", ga->name,
				      rc3, ckpt_reader_errmsg(r));
			ck_assert_msg(!memcmp(box, want, bn), "box %d of %s",
				      k, ga->name);
			/* same box through read_batch */
			ckpt_read_req rq;
			memset(&rq, 0, sizeof(rq));
			rq.name = ga->name;
			rq.offset = off;
			rq.extent = ext;
			rq.dst = box;
			rq.dst_bytes = bn;
			memset(box, 0, bn);
			ck_assert_int_eq(ckpt_read_batch(r, &rq, 1), 0);
			ck_assert_int_eq(rq.status, 0);
			ck_assert(!memcmp(box, want, bn));
			free(want);
			free(box);
		}
		free(full);
	}
	ckpt_reader_close(r);
}

/* Per-save reasons: each host's index keeps its own, the commit record
 * (built by a coordinator) takes the lowest host's that has one, and
 * ckpt_list / ckpt_reader_stats report it; a step saved without reasons
 * reports unspecified. */
START_TEST(test_reasons)
{
	static const int32_t why1[NH] = {CKPT_REASON_UNSPECIFIED,
					 CKPT_REASON_MAINTENANCE,
					 CKPT_REASON_PREEMPTED};
	const char *dir = tu_tmpdir();
	ckpt *c[NH];
	for (uint32_t h = 0; h < NH; h++) {
		c[h] = open_host(dir, h, NH);
		tu_set set;
		host_set(&set, h, 1);
		ckpt_tensor *v = calloc(set.n, sizeof(*v));
		ck_assert_ptr_nonnull(v);
		tu_set_view(&set, v);
		ckpt_save_opts o;
		ckpt_save_opts_default(&o);
		o.reason = why1[h];
		ck_assert_int_eq(ckpt_save_ex(c[h], 1, v, set.n, &o), 0);
		ck_assert_int_eq(ckpt_wait(c[h]), 0);
		free(v);
		tu_set_free(&set);
		save_host(c[h], h, 2); /* no reason */
	}
	static const char *const in_index[NH] = {NULL, "\"maintenance\"",
						 "\"preempted\""};
	for (uint32_t h = 0; h < NH; h++) {
		char *p = tu_path("%s/step-%020d/h%05u.index", dir, 1, h);
		uint8_t *b;
		size_t len;
		ck_assert_int_eq(tu_read_file(p, &b, &len), 0);
		void *at = memmem(b, len, "\"reason\"", 8);
		if (in_index[h])
			ck_assert_msg(at && memmem(b, len, in_index[h],
						   strlen(in_index[h])),
				      "host %u's index lacks %s", h,
				      in_index[h]);
		else
			ck_assert_msg(!at, "host %u's index has a reason", h);
		free(b);
		free(p);
	}
	ckpt *co = open_coordinator(dir, NH);
	ck_assert_int_eq(ckpt_commit(co, 1), 0);
	ck_assert_int_eq(ckpt_commit(co, 2), 0);
	ckpt_step_info *li;
	size_t n;
	ck_assert_int_eq(ckpt_list(co, &li, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(li[0].reason, CKPT_REASON_MAINTENANCE);
	ck_assert_int_eq(li[1].reason, CKPT_REASON_UNSPECIFIED);
	ckpt_free(li);
	ckpt_reader *r = NULL;
	ckpt_stats st;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), 0);
	ck_assert_int_eq(ckpt_reader_stats(r, &st), 0);
	ck_assert_int_eq(st.reason, CKPT_REASON_MAINTENANCE);
	ckpt_reader_close(r);
	for (uint32_t h = 0; h < NH; h++)
		ck_assert_int_eq(ckpt_close(c[h]), 0);
	ck_assert_int_eq(ckpt_close(co), 0);
}
END_TEST

START_TEST(test_three_hosts)
{
	const char *dir = tu_tmpdir();
	ckpt *c[NH];
	for (uint32_t h = 0; h < NH; h++)
		c[h] = open_host(dir, h, NH);
	save_host(c[0], 0, 1);
	save_host(c[1], 1, 1);
	/* nothing committed yet: host_count > 1 never commits in save */
	ck_assert_uint_eq(list_count(c[0]), 0);
	int rc = ckpt_commit(c[0], 1);
	ck_assert_msg(rc == CKPT_E_INCOMPLETE, "early commit: %d (%s)", rc,
		      ckpt_strerror(rc));
	const char *m = ckpt_errmsg(c[0]);
	ck_assert_msg(strstr(m, "2"), "message \"%s\" does not name host 2", m);
	ck_assert_uint_eq(list_count(c[0]), 0);
	uint64_t l;
	ck_assert_int_eq(ckpt_latest(c[1], &l), CKPT_E_NOTFOUND);
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL),
			 CKPT_E_NOTFOUND);
	char *commit = tu_path("%s/step-%020d/COMMIT", dir, 1);
	ck_assert(!tu_exists(commit));

	save_host(c[2], 2, 1);
	ck_assert_uint_eq(list_count(c[0]), 0);
	/* any process may commit: a handle that cannot save */
	ckpt *co = open_coordinator(dir, NH);
	rc = ckpt_commit(co, 1);
	ck_assert_msg(rc == 0, "commit: %d %s", rc, ckpt_errmsg(co));
	ck_assert(tu_exists(commit));
	ck_assert_int_eq(ckpt_commit(co, 1), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_commit(c[1], 1), CKPT_E_EXISTS);
	ck_assert_int_eq(ckpt_latest(c[2], &l), 0);
	ck_assert_uint_eq(l, 1);

	ckpt_step_info *li;
	size_t n;
	ck_assert_int_eq(ckpt_list(co, &li, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(li[0].host_count, NH);
	ck_assert_uint_eq(li[0].tensor_count, NARRAYS + NH + 1);
	ck_assert_uint_le(li[0].file_count, 1 + 2 + 3 + NH);
	ck_assert_uint_ge(li[0].file_count, 2 * NH);
	ckpt_free(li);
	check_full(dir, 1);

	/* step 2: hosts save while the other hosts' handles are busy too */
	for (uint32_t h = 0; h < NH; h++) {
		tu_set set;
		host_set(&set, h, 2);
		ck_assert_int_eq(tu_save_async(c[h], 2, &set), 0);
		tu_set_free(&set);
	}
	for (uint32_t h = 0; h < NH; h++)
		ck_assert_int_eq(ckpt_wait(c[h]), 0);
	ck_assert_int_eq(ckpt_commit(c[2], 2), 0);
	check_full(dir, 2);
	check_full(dir, 1);
	r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_step(r), 2);
	ckpt_reader_close(r);

	for (uint32_t h = 0; h < NH; h++)
		ck_assert_int_eq(ckpt_close(c[h]), 0);
	ck_assert_int_eq(ckpt_close(co), 0);
	free(commit);
}
END_TEST

struct host_arg {
	const char *dir;
	uint32_t h;
	int rc;
};

static void *host_thread(void *p)
{
	struct host_arg *a = p;
	ckpt_settings s;
	tu_settings(&s);
	s.host_index = a->h;
	s.host_count = NH;
	s.threads = 1;
	ckpt *c = NULL;
	a->rc = ckpt_open(&c, a->dir, &s);
	if (a->rc)
		return NULL;
	tu_set set;
	host_set(&set, a->h, 7);
	a->rc = tu_save(c, 7, &set);
	tu_set_free(&set);
	int rc = ckpt_close(c);
	if (!a->rc)
		a->rc = rc;
	return NULL;
}

/* Hosts open, save and close concurrently from their own threads. */
START_TEST(test_concurrent_hosts)
{
	const char *dir = tu_tmpdir();
	pthread_t th[NH];
	struct host_arg a[NH];
	for (uint32_t h = 0; h < NH; h++) {
		a[h] = (struct host_arg){dir, h, -1};
		pthread_create(&th[h], NULL, host_thread, &a[h]);
	}
	for (uint32_t h = 0; h < NH; h++) {
		pthread_join(th[h], NULL);
		ck_assert_msg(a[h].rc == 0, "host %u: %d", h, a[h].rc);
	}
	ckpt *co = open_coordinator(dir, NH);
	ck_assert_int_eq(ckpt_commit(co, 7), 0);
	ck_assert_int_eq(ckpt_close(co), 0);
	check_full(dir, 7);
}
END_TEST

struct coord_arg {
	const char *dir;
	pthread_barrier_t *bar;
	int rc;
};

static void *coord_thread(void *arg)
{
	struct coord_arg *a = arg;
	ckpt *co = open_coordinator(a->dir, NH);
	pthread_barrier_wait(a->bar);
	a->rc = ckpt_commit(co, 7);
	ck_assert_int_eq(ckpt_close(co), 0);
	return NULL;
}

/* Two coordinators commit the same multi-host step at once (a retry
 * racing the first attempt): exactly one succeeds, the other is told the
 * step exists, and the step is whole. */
START_TEST(test_two_coordinators)
{
	const char *dir = tu_tmpdir();
	for (uint32_t h = 0; h < NH; h++) {
		ckpt *c = open_host(dir, h, NH);
		save_host(c, h, 7);
		ck_assert_int_eq(ckpt_close(c), 0);
	}
	char *sd = tu_step_dir(dir, 7);
	char *cm = tu_path("%s/COMMIT", sd);
	for (int round = 0; round < 20; round++) {
		pthread_barrier_t bar;
		pthread_t th[2];
		struct coord_arg a[2] = {{dir, &bar, -1}, {dir, &bar, -1}};
		unlink(cm); /* commit the same files again */
		pthread_barrier_init(&bar, NULL, 2);
		for (int k = 0; k < 2; k++)
			pthread_create(&th[k], NULL, coord_thread, &a[k]);
		for (int k = 0; k < 2; k++)
			pthread_join(th[k], NULL);
		pthread_barrier_destroy(&bar);
		ck_assert_msg((a[0].rc == 0 && a[1].rc == CKPT_E_EXISTS) ||
				      (a[1].rc == 0 && a[0].rc == CKPT_E_EXISTS),
			      "round %d: %d and %d", round, a[0].rc, a[1].rc);
		ck_assert_int_eq(tu_count_suffix(sd, ".tmp"), 0);
	}
	free(cm);
	free(sd);
	check_full(dir, 7);
}
END_TEST

START_TEST(test_manual_commit)
{
	const char *dir = tu_tmpdir();
	ckpt_settings s;
	tu_settings(&s);
	s.flags = CKPT_F_MANUAL_COMMIT;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	tu_set set;
	tu_set_init(&set);
	uint64_t sh[2] = {300, 300};
	tu_set_add(&set, "w", CKPT_BF16, 2, sh, 5);
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	ck_assert_uint_eq(list_count(c), 0);
	uint64_t l;
	ck_assert_int_eq(ckpt_latest(c, &l), CKPT_E_NOTFOUND);
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_commit(c, 2), CKPT_E_INCOMPLETE);
	ck_assert_int_eq(ckpt_commit(c, 1), 0);
	ck_assert_uint_eq(list_count(c), 1);
	ck_assert_int_eq(ckpt_latest(c, &l), 0);
	ck_assert_uint_eq(l, 1);
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert_msg(tu_check_root(dir, 1, &set, why, sizeof(why)) == 0, "%s",
		      why);
	tu_set_free(&set);
}
END_TEST

/* Two hosts whose slices leave a gap: the covered parts read, the rest is
 * CKPT_E_NOTFOUND. */
START_TEST(test_gap)
{
	const char *dir = tu_tmpdir();
	ckpt *c0 = open_host(dir, 0, 2), *c1 = open_host(dir, 1, 2);
	uint64_t shape[2] = {10, 4}, o0[2] = {0, 0}, e0[2] = {4, 4},
		 o1[2] = {6, 0}, e1[2] = {4, 4};
	tu_set s0, s1;
	tu_set_init(&s0);
	tu_set_init(&s1);
	tu_set_add_slice(&s0, "g", CKPT_F32, 2, shape, o0, e0, 3);
	tu_set_add_slice(&s1, "g", CKPT_F32, 2, shape, o1, e1, 3);
	ck_assert_int_eq(tu_save(c0, 1, &s0), 0);
	ck_assert_int_eq(tu_save(c1, 1, &s1), 0);
	int rc = ckpt_commit(c0, 1);
	ck_assert_msg(rc == 0, "commit: %d %s", rc, ckpt_errmsg(c0));
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, dir, 1, NULL), 0);
	float buf[40];
	ck_assert_int_eq(ckpt_read(r, "g", buf, sizeof(buf)), CKPT_E_NOTFOUND);
	uint64_t bo[2] = {3, 1}, be[2] = {2, 2};
	ck_assert_int_eq(ckpt_read_slice(r, "g", bo, be, buf, 16),
			 CKPT_E_NOTFOUND);
	ck_assert_int_eq(tu_check_set(r, &s0, why, sizeof(why)), 0);
	ck_assert_int_eq(tu_check_set(r, &s1, why, sizeof(why)), 0);
	ckpt_reader_close(r);
	ckpt_close(c0);
	ckpt_close(c1);
	tu_set_free(&s0);
	tu_set_free(&s1);
}
END_TEST

/* Slices of one name that disagree: CKPT_E_MISMATCH from the commit, or
 * (if the commit does not look inside tensors) from opening the step. */
START_TEST(test_mismatch)
{
	const char *dir = tu_tmpdir();
	ckpt *c0 = open_host(dir, 0, 2), *c1 = open_host(dir, 1, 2);
	uint64_t shape[2] = {4, 4}, shape_b[2] = {5, 4}, shape3[3] = {4, 4, 1};
	uint64_t o0[2] = {0, 0}, e0[2] = {2, 4}, o1[2] = {2, 0}, e1[2] = {2, 4};
	uint64_t ov[2] = {1, 0}, ev[2] = {3, 4};
	uint64_t o3[3] = {2, 0, 0}, e3[3] = {2, 4, 1};
	const char *what[] = {"dtype", "global shape", "overlap", "ndim"};
	for (int k = 0; k < 4; k++) {
		uint64_t step = (uint64_t)k + 1;
		tu_set s0, s1;
		tu_set_init(&s0);
		tu_set_init(&s1);
		tu_set_add_slice(&s0, "x", CKPT_F32, 2, shape, o0, e0, 1);
		uint64_t ok[1] = {5};
		tu_set_add(&s0, "fine", CKPT_F32, 1, ok, 2);
		switch (k) {
		case 0:
			tu_set_add_slice(&s1, "x", CKPT_I32, 2, shape, o1, e1, 1);
			break;
		case 1:
			tu_set_add_slice(&s1, "x", CKPT_F32, 2, shape_b, o1, e1, 1);
			break;
		case 2:
			tu_set_add_slice(&s1, "x", CKPT_F32, 2, shape, ov, ev, 1);
			break;
		case 3:
			tu_set_add_slice(&s1, "x", CKPT_F32, 3, shape3, o3, e3, 1);
			break;
		}
		ck_assert_int_eq(tu_save(c0, step, &s0), 0);
		ck_assert_int_eq(tu_save(c1, step, &s1), 0);
		int rc = ckpt_commit(c0, step);
		if (rc == 0) {
			ckpt_reader *r = NULL;
			rc = ckpt_reader_open(&r, dir, step, NULL);
			ck_assert_msg(rc == CKPT_E_MISMATCH,
				      "%s: commit ok, reader_open %d", what[k], rc);
			ck_assert_ptr_null(r);
			const char *m = ckpt_reader_errmsg(NULL);
			ck_assert_msg(strstr(m, "\"x\""), "%s: message \"%s\"",
				      what[k], m);
		} else {
			ck_assert_msg(rc == CKPT_E_MISMATCH, "%s: commit %d (%s)",
				      what[k], rc, ckpt_strerror(rc));
			const char *m = ckpt_errmsg(c0);
			ck_assert_msg(strstr(m, "\"x\""), "%s: message \"%s\"",
				      what[k], m);
			ck_assert_uint_eq(list_count(c0), 0);
		}
		tu_set_free(&s0);
		tu_set_free(&s1);
	}
	ckpt_close(c0);
	ckpt_close(c1);
}
END_TEST

/* A host index written for a different host_count cannot be committed
 * together with the others. */
START_TEST(test_host_count_disagree)
{
	const char *dir = tu_tmpdir();
	ckpt *c0 = open_host(dir, 0, 2), *c1 = open_host(dir, 1, 3);
	tu_set s0, s1;
	host_set(&s0, 0, 1);
	host_set(&s1, 1, 1);
	ck_assert_int_eq(tu_save(c0, 1, &s0), 0);
	ck_assert_int_eq(tu_save(c1, 1, &s1), 0);
	int rc = ckpt_commit(c0, 1);
	ck_assert_msg(rc == CKPT_E_MISMATCH || rc == CKPT_E_CORRUPT ||
			      rc == CKPT_E_INCOMPLETE,
		      "commit of disagreeing host counts: %d", rc);
	ck_assert_uint_eq(list_count(c0), 0);
	ckpt_close(c0);
	ckpt_close(c1);
	tu_set_free(&s0);
	tu_set_free(&s1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("multihost");
	TCase *tc = tu_tcase("multihost", 120);
	tcase_add_test(tc, test_three_hosts);
	tcase_add_test(tc, test_reasons);
	tcase_add_test(tc, test_concurrent_hosts);
	tcase_add_test(tc, test_two_coordinators);
	tcase_add_test(tc, test_manual_commit);
	tcase_add_test(tc, test_gap);
	tcase_add_test(tc, test_mismatch);
	tcase_add_test(tc, test_host_count_disagree);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
