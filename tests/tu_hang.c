/*
 * tu_hang.c - what a hung test was doing.
 *
 * A test that hangs is killed by meson's timeout with nothing to show for
 * it, and the rare ones (a race on a loaded CI machine) do not hang again
 * when rerun. tu_watchdog_arm starts a small shell, in its own process
 * group, that sleeps for the budget and then prints every thread's stack
 * of this process and of its descendants (gdb -batch, if installed) to
 * stderr, then aborts the process (the test fails at once instead of
 * waiting for meson's timeout); tu_watchdog_disarm stops it.
 * tu_dump_stacks does the printing at once (a wait that gave up). Plain
 * POSIX + /proc; nothing here touches the engine.
 */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Prints the stacks of process $1 and its descendants but this shell
 * ($$); gdb per process, each bounded by timeout so a stuck ptrace cannot
 * hang the dump. */
static const char dump_sh[] =
	"dump() {\n"
	"  echo \"=== stacks of pid $1: $(tr '\\0' ' ' </proc/$1/cmdline "
	"2>/dev/null)\"\n"
	"  if command -v gdb >/dev/null; then\n"
	"    timeout 60 gdb -nx -batch -p \"$1\" -ex 'thread apply all bt' "
	"2>&1 | grep -E '^(Thread|#)'\n"
	"  else echo '(gdb is not installed)'; fi\n"
	"  for c in $(cat /proc/$1/task/*/children 2>/dev/null); do\n"
	"    [ \"$c\" = $$ ] || dump $c; done\n"
	"}\n";

static pid_t dog = -1;

static void run_sh(const char *script, const char *a1, const char *a2,
		   const char *a3, int own_group)
{
	pid_t pid = fork();

	if (pid == 0) {
		if (own_group) {
			setpgid(0, 0);
			/* dies with the test, and holds its stderr alone */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
		}
		dup2(2, 1);
		execl("/bin/sh", "sh", "-c", script, "sh", a1, a2, a3,
		      (char *)NULL);
		_exit(127);
	}
	if (own_group && pid > 0)
		setpgid(pid, pid); /* before any kill(-pid): no race */
	if (!own_group && pid > 0)
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
	if (own_group)
		dog = pid;
}

void tu_dump_stacks(pid_t pid, const char *why)
{
	char script[2048], p[32];

	snprintf(script, sizeof(script), "%secho \"=== %s\" >&2; dump \"$1\" "
		 ">&2", dump_sh, "$2");
	snprintf(p, sizeof(p), "%ld", (long)pid);
	run_sh(script, p, why, "", 0);
}

void tu_watchdog_arm(double seconds, const char *what)
{
	char script[2048], p[32], s[32];

	tu_watchdog_disarm();
	snprintf(script, sizeof(script),
		 "%ssleep \"$2\" </dev/null >/dev/null 2>&1 || exit 0\n"
		 "kill -0 \"$1\" 2>/dev/null || exit 0\n"
		 "echo \"=== watchdog: $3 still running after $2 s\" >&2\n"
		 "dump \"$1\" >&2\n"
		 "echo \"=== watchdog: aborting pid $1\" >&2\n"
		 "kill -ABRT \"$1\"\n",
		 dump_sh);
	snprintf(p, sizeof(p), "%ld", (long)getpid());
	snprintf(s, sizeof(s), "%.0f", seconds < 1 ? 1 : seconds);
	run_sh(script, p, s, what, 1);
}

void tu_watchdog_disarm(void)
{
	if (dog <= 0)
		return;
	kill(-dog, SIGKILL);
	while (waitpid(dog, NULL, 0) < 0 && errno == EINTR)
		;
	dog = -1;
}
