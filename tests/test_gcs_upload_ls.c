/*
 * test_gcs_upload_ls.c - which steps of a directory are not yet in its
 * remote location: ckpt_upload_list() and `ckptctl ls DIR` (run as a
 * program: $CKPT_CKPTCTL; those checks are skipped without it).
 *
 * States, each made for real: failed (a bucket that does not exist; the
 * reason is journaled and outlives the handle), uploading (a handle open
 * while the server, a socket that never answers, holds the upload),
 * pending (that handle closed: nobody uploads until the next open), and
 * then nothing once a reopened handle finished the upload on the fake
 * server. Bytes confirmed / total come from the journal.
 */
#include "test_gcs_ckpt.h"
#include "testutil.h"

#include "ckpt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#define BUCKET "ckpt-ls"

static tu_set set;

static ckpt *open_remote(const char *dir, const char *remote)
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

/* `ckptctl ls [--json] dir`: exit status, output in *out (malloc'd);
 * -1 without ckptctl. */
static int ls(const char *dir, int json, char **out)
{
	const char *ctl = getenv("CKPT_CKPTCTL");
	char *cmd, buf[4096];
	size_t len = 0, n;
	FILE *p;
	int st;

	*out = NULL;
	if (!ctl || access(ctl, X_OK))
		return -1;
	cmd = tu_path("'%s' ls %s'%s' 2>&1", ctl, json ? "--json " : "", dir);
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
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The upload of `step` as ckptctl ls shows it, table and JSON. */
static void ls_shows(const char *dir, uint64_t step, const char *state,
		     const char *also)
{
	char *out, want[64];
	json_t *root, *steps, *up;
	json_error_t je;
	size_t i;
	int found = 0;

	if (ls(dir, 0, &out) < 0)
		return;
	printf("ckptctl ls %s:\n%s", dir, out);
	snprintf(want, sizeof(want), "  %s ", state);
	ck_assert_msg(strstr(out, want), "no '%s' in: %s", state, out);
	ck_assert_msg(strstr(out, "1 step not yet in gs://"), "%s", out);
	ck_assert_msg(!also || strstr(out, also), "no '%s' in: %s", also, out);
	free(out);
	ck_assert_int_eq(ls(dir, 1, &out), 0);
	root = json_loads(out, 0, &je);
	ck_assert_msg(root, "not JSON: %s", out);
	steps = json_object_get(root, "steps");
	for (i = 0; i < json_array_size(steps); i++) {
		json_t *s = json_array_get(steps, i);

		if (json_integer_value(json_object_get(s, "step")) !=
		    (json_int_t)step)
			continue;
		up = json_object_get(s, "upload");
		ck_assert_str_eq(
			json_string_value(json_object_get(up, "state")), state);
		ck_assert(json_integer_value(
				  json_object_get(up, "bytes_total")) > 0);
		found = 1;
	}
	ck_assert_msg(found, "step %" PRIu64 " not in: %s", step, out);
	ck_assert_int_eq(json_array_size(json_object_get(root, "uploads")), 1);
	json_decref(root);
	free(out);
}

/* The single unfinished upload of dir. */
static ckpt_upload_step one(const char *dir, uint64_t step, int32_t state)
{
	ckpt_upload_step *v = NULL, e;
	size_t n = 0;

	ck_assert_msg(ckpt_upload_list(dir, &v, &n) == 0, "%s",
		      ckpt_errmsg(NULL));
	ck_assert_uint_eq(n, 1);
	e = v[0];
	ckpt_free(v);
	ck_assert_uint_eq(e.step, step);
	ck_assert_msg(e.state == state, "state %d, want %d (%s)", e.state,
		      state, e.msg);
	ck_assert_uint_eq(e.sizes_known, 1);
	ck_assert_uint_gt(e.bytes_total, tu_set_bytes(&set) / 2);
	ck_assert_uint_le(e.bytes_confirmed, e.bytes_total);
	return e;
}

static void none(const char *dir)
{
	ckpt_upload_step *v = NULL;
	size_t n = 7;
	char *out;

	ck_assert_int_eq(ckpt_upload_list(dir, &v, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(v);
	if (ls(dir, 0, &out) < 0)
		return;
	ck_assert_msg(!strstr(out, "UPLOAD") && !strstr(out, "not yet"), "%s",
		      out);
	free(out);
}

START_TEST(upload_states)
{
	char *dir = tu_path("%s/failed", tu_tmpdir());
	char *dir2 = tu_path("%s/hung", tu_tmpdir());
	struct sockaddr_in a = { 0 };
	socklen_t al = sizeof(a);
	ckpt_upload_step e;
	ckpt_upload_step *v;
	char host[64];
	size_t n;
	ckpt *c;
	int lfd;

	tu_set_init(&set);
	tu_set_add(&set, "w", CKPT_F32, 1, (uint64_t[]){ 3u << 20 }, 5);
	/* arguments */
	ck_assert_int_eq(ckpt_upload_list("gs://" BUCKET "/x", &v, &n),
			 -EINVAL);
	ck_assert_int_eq(ckpt_upload_list("/nonexistent/d", &v, &n), -ENOENT);

	/* failed: the journal keeps why, after the handle is gone too */
	c = open_remote(dir, "gs://no-such-bucket/x");
	none(dir);
	ck_assert_int_eq(tu_save(c, 4, &set), 0);
	ck_assert_int_lt(ckpt_upload_wait(c, -1), 0);
	e = one(dir, 4, CKPT_UPLOAD_FAILED);
	ck_assert_msg(strstr(e.msg, "no-such-bucket"), "%s", e.msg);
	ck_assert_str_eq(e.remote, "gs://no-such-bucket/x");
	ck_assert_uint_eq(e.bytes_confirmed, 0);
	ls_shows(dir, 4, "failed", "no-such-bucket");
	ck_assert_int_eq(ckpt_close(c), 0);
	one(dir, 4, CKPT_UPLOAD_FAILED);

	/* uploading: a server that takes the connection and never answers */
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(lfd, 64), 0);
	ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
	snprintf(host, sizeof(host), "127.0.0.1:%d", ntohs(a.sin_port));
	setenv("STORAGE_EMULATOR_HOST", host, 1);
	setenv("CKPT_GCS_DEADLINE", "60", 1);
	c = open_remote(dir2, "gs://" BUCKET "/run");
	ck_assert_int_eq(tu_save(c, 1, &set), 0);
	ck_assert_int_eq(ckpt_wait(c), 0);
	e = one(dir2, 1, CKPT_UPLOAD_RUNNING);
	ck_assert_uint_eq(e.bytes_confirmed, 0);
	ls_shows(dir2, 1, "uploading", NULL);
	/* pending: nobody uploads it until the next open */
	ck_assert_int_eq(ckpt_close(c), 0);
	close(lfd);
	one(dir2, 1, CKPT_UPLOAD_PENDING);
	ls_shows(dir2, 1, "pending", NULL);

	/* the next open with the remote finishes it: nothing left */
	setenv("STORAGE_EMULATOR_HOST", gk_srv.url, 1);
	unsetenv("CKPT_GCS_DEADLINE");
	c = open_remote(dir2, "gs://" BUCKET "/run");
	ck_assert_msg(ckpt_upload_wait(c, -1) == 0, "%s", ckpt_errmsg(c));
	none(dir2);
	ck_assert_int_eq(ckpt_close(c), 0);
	none(dir2);
	tu_set_free(&set);
	free(dir);
	free(dir2);
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { upload_states };

	return gk_main(BUCKET, "gcs_upload_ls", 300, tests, 1);
}
