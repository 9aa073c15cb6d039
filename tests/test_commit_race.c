/*
 * test_commit_race.c - two processes committing at once.
 *
 * 1. Same step: a step is saved (manual commit), then two forked
 *    processes, released together by closing a pipe, both call
 *    ckpt_commit on it. Exactly one gets 0 and the other CKPT_E_EXISTS,
 *    every round (200); the step verifies; no temporary is left in the
 *    step directory or the root.
 * 2. `latest`: two processes commit different steps (N, N+1) at once, 200
 *    rounds; both succeed, `latest` names N+1 (the newer never loses to
 *    the older), no temporary is left.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define ROUNDS 200

static char why[1024];

static ckpt *open_saver(const char *dir)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 1u << 20;
	s.threads = 1;
	s.files_per_host = 1;
	s.flags |= CKPT_F_MANUAL_COMMIT;
	ckpt *c = NULL;
	int rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

static void step_set(tu_set *set, uint64_t step)
{
	uint64_t shape[1] = { 4096 + step % 7 };
	tu_set_init(set);
	tu_set_add(set, "w", CKPT_F32, 1, shape, step);
}

/* Child: opens a coordinator handle, waits for the pipe to close, commits
 * `step`; exit 0 committed, 1 CKPT_E_EXISTS, 2+ anything else. */
static void committer(const char *dir, uint64_t step, int gate)
	__attribute__((noreturn));
static void committer(const char *dir, uint64_t step, int gate)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ckpt *c = NULL;
	if (ckpt_open(&c, dir, &s))
		_exit(3);
	char b;
	if (read(gate, &b, 1) != 0)
		_exit(4);
	int rc = ckpt_commit(c, step);
	if (rc && rc != CKPT_E_EXISTS)
		fprintf(stderr, "commit %llu: %d %s\n",
			(unsigned long long)step, rc, ckpt_errmsg(c));
	ckpt_close(c);
	_exit(rc == 0 ? 0 : rc == CKPT_E_EXISTS ? 1 : 2);
}

/* Forks one committer per step in steps[0..2), releases them together,
 * returns their exit codes. */
static void race(const char *dir, const uint64_t steps[2], int st[2])
{
	int gate[2];
	pid_t pid[2];
	ck_assert_int_eq(pipe(gate), 0);
	for (int k = 0; k < 2; k++) {
		pid[k] = fork();
		ck_assert_int_ge(pid[k], 0);
		if (pid[k] == 0) {
			close(gate[1]);
			committer(dir, steps[k], gate[0]);
		}
	}
	close(gate[0]);
	close(gate[1]); /* both readers see EOF at once */
	for (int k = 0; k < 2; k++) {
		int status;
		ck_assert_int_eq(waitpid(pid[k], &status, 0), pid[k]);
		ck_assert_msg(WIFEXITED(status), "committer killed");
		st[k] = WEXITSTATUS(status);
	}
}

static int count_tmp(const char *dir)
{
	int n = tu_count_suffix(dir, ".tmp");
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "step-", 5))
			continue;
		char *p = tu_path("%s/%s", dir, e->d_name);
		n += tu_count_suffix(p, ".tmp");
		free(p);
	}
	if (d)
		closedir(d);
	return n;
}

static void check_step(const char *dir, uint64_t step, const char *ctx)
{
	tu_set set;
	step_set(&set, step);
	int rc = tu_check_root(dir, step, &set, why, sizeof(why));
	tu_set_free(&set);
	ck_assert_msg(rc == 0, "%s: step %llu: %s", ctx,
		      (unsigned long long)step, why);
	ckpt_reader *r = NULL;
	rc = ckpt_reader_open(&r, dir, step, NULL);
	ck_assert_int_eq(rc, 0);
	rc = ckpt_reader_verify(r, NULL, NULL);
	ck_assert_msg(rc == 0, "%s: verify %llu: %s", ctx,
		      (unsigned long long)step, ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
}

START_TEST(test_same_step)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_saver(dir);
	int wins[2] = { 0, 0 };
	for (uint64_t step = 1; step <= ROUNDS; step++) {
		tu_set set;
		step_set(&set, step);
		ck_assert_int_eq(tu_save(c, step, &set), 0);
		tu_set_free(&set);
		uint64_t steps[2] = { step, step };
		int st[2];
		race(dir, steps, st);
		char ctx[64];
		snprintf(ctx, sizeof(ctx), "round %llu",
			 (unsigned long long)step);
		ck_assert_msg((st[0] == 0 && st[1] == 1) ||
				      (st[0] == 1 && st[1] == 0),
			      "%s: exits %d and %d (want one 0, one EXISTS)",
			      ctx, st[0], st[1]);
		wins[st[0] == 0 ? 0 : 1]++;
		check_step(dir, step, ctx);
		ck_assert_msg(count_tmp(dir) == 0, "%s: temporaries left", ctx);
		uint64_t latest = 0;
		ck_assert_int_eq(ckpt_latest(c, &latest), 0);
		ck_assert_uint_eq(latest, step);
	}
	ck_assert_int_eq(ckpt_close(c), 0);
	fprintf(stderr, "same-step race: first child won %d, second %d of %d\n",
		wins[0], wins[1], ROUNDS);
}
END_TEST

START_TEST(test_latest_race)
{
	const char *dir = tu_tmpdir();
	ckpt *c = open_saver(dir);
	char *lp = tu_path("%s/latest", dir);
	for (uint64_t n = 1; n <= 2 * ROUNDS; n += 2) {
		for (uint64_t step = n; step <= n + 1; step++) {
			tu_set set;
			step_set(&set, step);
			ck_assert_int_eq(tu_save(c, step, &set), 0);
			tu_set_free(&set);
		}
		uint64_t steps[2] = { n, n + 1 };
		int st[2];
		race(dir, steps, st);
		ck_assert_msg(st[0] == 0 && st[1] == 0,
			      "round %llu: exits %d and %d",
			      (unsigned long long)n, st[0], st[1]);
		uint8_t *b = NULL;
		size_t len = 0;
		char want[40];
		snprintf(want, sizeof(want), "step-%020llu\n",
			 (unsigned long long)(n + 1));
		ck_assert_int_eq(tu_read_file(lp, &b, &len), 0);
		ck_assert_msg(len == strlen(want) && !memcmp(b, want, len),
			      "round %llu: latest is \"%.*s\", want %s",
			      (unsigned long long)n, (int)len, (char *)b, want);
		free(b);
		ck_assert_msg(count_tmp(dir) == 0, "round %llu: temporaries",
			      (unsigned long long)n);
	}
	check_step(dir, 2 * ROUNDS, "last");
	free(lp);
	ck_assert_int_eq(ckpt_close(c), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("commit_race");
	TCase *tc = tu_tcase("race", 240);
	tcase_add_test(tc, test_same_step);
	tcase_add_test(tc, test_latest_race);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
