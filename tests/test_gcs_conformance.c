/*
 * test_gcs_conformance.c - Google's Cloud Storage retry conformance suite
 * (storage-retry-tests.json) run against the gcs client.
 *
 * For every scenario, every case (a list of fault instructions) and every
 * method among storage.objects.insert/get/list/compose/delete, it creates
 * the resources, registers a retry test on the server (POST /retry_test),
 * performs the method once through a client whose requests carry
 * x-retry-test-id (backoff compressed to milliseconds), then checks the
 * outcome against expectSuccess and that the server consumed every
 * instruction (GET /retry_test/ID: completed). Insert is a multipart
 * upload, or a resumable one (9 MiB, one chunk) in the resumable group;
 * get downloads the media (1 MiB in the download group) and checks it.
 *
 * Server: $STORAGE_EMULATOR_HOST when set (so it runs unchanged against
 * googleapis/storage-testbench), else tests/servers/fake_gcs.py started
 * here. Data: $CKPT_CONFORMANCE_JSON, default
 * $CKPT_TEST_SRCDIR/../../shared/conformance/storage-retry-tests.json;
 * skipped (77) when absent. Prints a tally per scenario.
 */
#include "test_gcs_util.h"
#include "testutil.h"

#include "gcs.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUCKET "ckpt-conformance"

static tu_server srv;
static const char *base; /* server URL */
static json_t *suite_json;

static const char *const methods[] = {
	"storage.objects.insert", "storage.objects.get",
	"storage.objects.list",   "storage.objects.compose",
	"storage.objects.delete",
};

static struct gcs_client *new_client(const char *test_id, size_t chunk)
{
	struct gcs_config cfg = { 0 };
	struct gcs_client *c;

	cfg.endpoint = base;
	cfg.retry_test_id = test_id;
	cfg.initial_backoff_s = 0.001;
	cfg.max_backoff_s = 0.02;
	cfg.deadline_s = 60;
	cfg.chunk_bytes = chunk;
	ck_assert_int_eq(gcs_client_new(&c, &cfg), 0);
	return c;
}

struct run {
	const char *method;
	int precondition;
	int resumable; /* insert in storage.resumable.upload */
	int download;  /* get in storage.objects.download */
	char name[128];
	char src[2][160];
	int64_t gen;
	unsigned char *data;
	size_t len;
};

/* Resources the method needs, made without faults. */
static void setup(struct gcs_client *plain, struct run *r)
{
	struct gcs_object o;
	int i;

	r->len = r->resumable ? (9u << 20) + 1234 :
		 r->download  ? (1u << 20) + 77 :
				1000;
	r->data = gt_pattern(r->len, (uint64_t)r->len ^ (uint64_t)getpid());
	if (strcmp(r->method, "storage.objects.insert") == 0)
		return;
	if (strcmp(r->method, "storage.objects.compose") == 0) {
		for (i = 0; i < 2; i++) {
			snprintf(r->src[i], sizeof(r->src[i]), "%s.src%d",
				 r->name, i);
			ck_assert_msg(gcs_put(plain, BUCKET, r->src[i],
					      r->data + i * 500, 500,
					      GCS_NO_COND, NULL) == 0,
				      "%s", gcs_errmsg(plain));
		}
		return;
	}
	ck_assert_msg(gcs_put(plain, BUCKET, r->name, r->data, r->len,
			      GCS_NO_COND, &o) == 0,
		      "%s", gcs_errmsg(plain));
	r->gen = o.generation;
	gcs_object_clear(&o);
}

static int upload_resumable(struct gcs_client *c, struct run *r)
{
	struct gcs_upload_opts o = { GCS_NO_COND, GCS_SIZE_UNKNOWN, 0, 0 };
	struct gcs_upload *u;
	int rc;

	if (r->precondition)
		o.cond = GCS_CREATE_ONLY;
	rc = gcs_upload_start(c, BUCKET, r->name, &o, &u);
	if (rc)
		return rc;
	rc = gcs_upload_append(u, r->data, r->len, NULL, NULL);
	if (!rc)
		rc = gcs_upload_finish(u, NULL);
	if (!rc)
		rc = gcs_op_wait(gcs_upload_op(u));
	gcs_upload_free(u);
	return rc;
}

/* The method once, with the client's own retry policy. */
static int perform(struct gcs_client *c, struct run *r)
{
	struct gcs_cond cond = GCS_NO_COND;
	const char *m = r->method;
	int rc;

	if (strcmp(m, "storage.objects.insert") == 0) {
		if (r->resumable)
			return upload_resumable(c, r);
		if (r->precondition)
			cond = GCS_CREATE_ONLY;
		return gcs_put(c, BUCKET, r->name, r->data, r->len, cond, NULL);
	}
	if (strcmp(m, "storage.objects.get") == 0) {
		void *d;
		size_t n;

		rc = gcs_get(c, BUCKET, r->name, 0, &d, &n, NULL);
		if (rc == 0) {
			ck_assert_uint_eq(n, r->len);
			ck_assert_msg(memcmp(d, r->data, n) == 0,
				      "%s: bytes differ", r->name);
			free(d);
		}
		return rc;
	}
	if (strcmp(m, "storage.objects.list") == 0) {
		struct gcs_list l;

		rc = gcs_list(c, BUCKET, r->name, NULL, &l);
		if (rc == 0) {
			ck_assert_uint_eq(l.n_items, 1);
			gcs_list_free(&l);
		}
		return rc;
	}
	if (strcmp(m, "storage.objects.compose") == 0) {
		const char *srcs[2] = { r->src[0], r->src[1] };

		if (r->precondition)
			cond = GCS_CREATE_ONLY;
		return gcs_compose(c, BUCKET, r->name, srcs, NULL, 2, cond,
				   NULL);
	}
	if (r->precondition)
		cond.if_generation_match = r->gen;
	return gcs_delete(c, BUCKET, r->name, 0, cond);
}

static const char *instr_list(json_t *instr, char *out, size_t n)
{
	size_t i, len = 0;
	json_t *v;

	out[0] = 0;
	json_array_foreach (instr, i, v) {
		len += (size_t)snprintf(out + len, n > len ? n - len : 0,
					"%s%s", i ? "," : "",
					json_string_value(v));
	}
	return out;
}

START_TEST(retry_conformance)
{
	struct gcs_client *plain = new_client(NULL, 0);
	json_t *tests = json_object_get(suite_json, "retryTests"), *sc;
	size_t si;
	int total = 0, failed = 0;
	char failures[4096] = "";

	ck_assert_msg(json_is_array(tests), "no retryTests array");
	json_array_foreach (tests, si, sc) {
		json_t *cases = json_object_get(sc, "cases");
		json_t *ms = json_object_get(sc, "methods"), *mj, *cj;
		int expect = json_is_true(json_object_get(sc, "expectSuccess"));
		int pre = json_is_true(
			json_object_get(sc, "preconditionProvided"));
		int sc_total = 0, sc_ok = 0;
		size_t mi, ci;

		json_array_foreach (ms, mi, mj) {
			const char *mname =
				json_string_value(json_object_get(mj, "name"));
			const char *group =
				json_string_value(json_object_get(mj, "group"));
			size_t k;
			int ours = 0;

			for (k = 0; k < sizeof(methods) / sizeof(*methods); k++)
				ours |= mname && strcmp(mname, methods[k]) == 0;
			if (!ours)
				continue;
			json_array_foreach (cases, ci, cj) {
				json_t *ins =
					json_object_get(cj, "instructions");
				const char *list[16];
				struct run r = { 0 };
				struct gcs_client *c;
				const char *id;
				char il[256], why[512] = "";
				int rc, done, ok;
				size_t ii;
				json_t *iv;

				json_array_foreach (ins, ii, iv) {
					if (ii < 16)
						list[ii] =
							json_string_value(iv);
				}
				r.method = mname;
				r.precondition = pre;
				r.resumable =
					group &&
					strcmp(group,
					       "storage.resumable.upload") == 0;
				r.download =
					group &&
					strcmp(group,
					       "storage.objects.download") == 0;
				snprintf(r.name, sizeof(r.name),
					 "conf-%d/s%zu-c%zu-%s", (int)getpid(),
					 si, ci,
					 mname + strlen("storage.objects."));
				setup(plain, &r);
				id = gt_retry_test(
					base, mname, list,
					json_array_size(ins) < 16 ?
						json_array_size(ins) :
						16);
				ck_assert_ptr_nonnull(id);
				c = new_client(id, r.resumable ? 16u << 20 : 0);
				rc = perform(c, &r);
				done = gt_retry_test_completed(base, id);
				ok = (rc == 0) == expect && done == 1;
				if (!ok)
					snprintf(why, sizeof(why),
						 "scenario %zu %s [%s]: rc %d "
						 "(expected %s), completed %d: "
						 "%s\n",
						 si + 1, mname,
						 instr_list(ins, il,
							    sizeof(il)),
						 rc,
						 expect ? "success" : "failure",
						 done, rc ? gcs_errmsg(c) : "");
				gcs_client_free(c);
				free(r.data);
				sc_total++;
				sc_ok += ok;
				if (!ok) {
					fputs(why, stdout);
					strncat(failures, why,
						sizeof(failures) -
							strlen(failures) - 1);
				}
			}
		}
		printf("scenario %zu %-58s %d/%d passed\n", si + 1,
		       json_string_value(json_object_get(sc, "description")),
		       sc_ok, sc_total);
		total += sc_total;
		failed += sc_total - sc_ok;
	}
	printf("retry conformance: %d/%d passed\n", total - failed, total);
	fflush(stdout);
	gcs_client_free(plain);
	ck_assert_int_gt(total, 0);
	ck_assert_msg(failed == 0, "%d of %d failed:\n%s", failed, total,
		      failures);
}
END_TEST

static void create_bucket(void)
{
	char url[640], body[128], *resp = NULL;
	long st;

	snprintf(url, sizeof(url), "%s/storage/v1/b?project=ckpt-test", base);
	snprintf(body, sizeof(body), "{\"name\": \"%s\"}", BUCKET);
	st = gt_http("POST", url, body, &resp);
	if (st != 200 && st != 409) {
		fprintf(stderr, "cannot create bucket %s on %s: HTTP %ld %s\n",
			BUCKET, base, st, resp ? resp : "");
		exit(1);
	}
	free(resp);
}

int main(void)
{
	const char *path = getenv("CKPT_CONFORMANCE_JSON");
	const char *emu = getenv("STORAGE_EMULATOR_HOST");
	const char *src = getenv("CKPT_TEST_SRCDIR");
	char def[1024], emu_url[512];
	Suite *s;
	TCase *tc;
	int rc;

	if (!path || !*path) {
		snprintf(def, sizeof(def),
			 "%s/../../shared/conformance/storage-retry-tests.json",
			 src ? src : "tests");
		path = def;
	}
	suite_json = json_load_file(path, 0, NULL);
	if (!suite_json) {
		printf("SKIP: conformance data %s is missing "
		       "(set CKPT_CONFORMANCE_JSON)\n",
		       path);
		return 77;
	}
	if (emu && *emu) {
		snprintf(emu_url, sizeof(emu_url), "%s%s",
			 strstr(emu, "://") ? "" : "http://", emu);
		base = emu_url;
	} else {
		gt_server_start(&srv, BUCKET);
		base = srv.url;
	}
	create_bucket();
	s = suite_create("gcs_conformance");
	tc = tu_tcase("conformance", 600);
	tcase_add_test(tc, retry_conformance);
	suite_add_tcase(s, tc);
	rc = tu_main(s);
	if (srv.pid)
		tu_server_stop(&srv);
	json_decref(suite_json);
	return rc;
}
