/*
 * test_gcs_pod.c - four processes as the four hosts of a pod, each with
 * its own local directory, all saving the same steps to one bucket
 * (settings.remote): every host uploads its shard objects and its index,
 * and the step's COMMIT is created exactly once, by whichever host sees
 * every index after uploading its own (create-only, no coordinator).
 *
 * Checked per step: every host's upload ends committed or "uploaded,
 * another host commits"; at least one reports the commit; the bucket
 * holds exactly one COMMIT for the step and the step is complete by all
 * four indexes; each host's objects equal its local files.
 */
#include "test_gcs_ckpt.h"
#include "test_gcs_util.h"
#include "testutil.h"

#include "ckpt.h"
#include "gcs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUCKET "ckpt-pod"
#define HOSTS 4
#define STEPS 3

/* Exit status: 10 + the final ckpt_upload_state, or 1..5 on failure. */
static void host_main(const char *dir, uint32_t h)
{
	ckpt_settings s;
	ckpt_upload_status us;
	ckpt *c = NULL;
	uint64_t step;

	ckpt_settings_default(&s);
	s.staging_bytes = 32u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 1;
	s.files_per_host = 2;
	s.codec = CKPT_CODEC_NONE;
	s.host_index = h;
	s.host_count = HOSTS;
	s.remote = "gs://" BUCKET "/pod";
	if (ckpt_open(&c, dir, &s) < 0)
		_exit(1);
	for (step = 1; step <= STEPS; step++) {
		uint64_t shape[1] = { (3u << 20) / 4 + h * 1000 + step };
		char name[32];
		tu_set set;

		tu_set_init(&set);
		snprintf(name, sizeof(name), "host%u.w", h);
		tu_set_add(&set, name, CKPT_F32, 1, shape, h * 100 + step);
		if (tu_save(c, step, &set) < 0)
			_exit(2);
		tu_set_free(&set);
		if (ckpt_upload_wait(c, -1) < 0) {
			fprintf(stderr, "host %u: %s\n", h, ckpt_errmsg(c));
			_exit(3);
		}
	}
	if (ckpt_upload_status_get(c, &us) < 0)
		_exit(4);
	ckpt_close(c);
	_exit(10 + us.state);
}

START_TEST(pod_commit)
{
	struct gcs_client *gc = gk_client(gk_srv.url);
	char *dirs[HOSTS], why[512];
	pid_t pid[HOSTS];
	uint32_t h;
	uint64_t step;
	int committers = 0;

	for (h = 0; h < HOSTS; h++) {
		dirs[h] = tu_path("%s/host%u", tu_tmpdir(), h);
		pid[h] = fork();
		ck_assert_int_ge(pid[h], 0);
		if (pid[h] == 0)
			host_main(dirs[h], h);
	}
	for (h = 0; h < HOSTS; h++) {
		int st = 0;

		ck_assert_int_eq(waitpid(pid[h], &st, 0), pid[h]);
		ck_assert_msg(WIFEXITED(st) &&
				      (WEXITSTATUS(st) ==
					       10 + CKPT_UPLOAD_COMMITTED ||
				       WEXITSTATUS(st) ==
					       10 + CKPT_UPLOAD_UPLOADED),
			      "host %u: status %d", h, st);
		committers += WEXITSTATUS(st) == 10 + CKPT_UPLOAD_COMMITTED;
	}
	/* the last step's commit was made (or found) by at least one */
	ck_assert_int_ge(committers, 1);
	for (step = 1; step <= STEPS; step++) {
		char *o = gk_object("pod", step, "COMMIT");

		ck_assert_int_eq(gk_count(gc, BUCKET, o), 1);
		ck_assert_msg(gk_step_complete(gc, BUCKET, "pod", step, HOSTS,
					       why, sizeof(why)) == 0,
			      "step %" PRIu64 ": %s", step, why);
		for (h = 0; h < HOSTS; h++)
			ck_assert_msg(gk_same_as_local(gc, BUCKET, "pod",
						       dirs[h], step, h, why,
						       sizeof(why)) == 0,
				      "host %u: %s", h, why);
		free(o);
	}
	printf("pod: %d of %d hosts found the last step committed\n",
	       committers, HOSTS);
	for (h = 0; h < HOSTS; h++)
		free(dirs[h]);
	gcs_client_free(gc);
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { pod_commit };

	return gk_main(BUCKET, "gcs_pod", 600, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
