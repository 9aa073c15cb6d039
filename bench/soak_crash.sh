#!/bin/bash
# soak_crash.sh - long crash-consistency soak: a child saves in a loop and
# is killed with SIGKILL at random moments, N times; after every kill the
# newest committed step must open, verify and hold exactly its data, and
# no debris may be listed (tests/test_crash.c does the checking).
#
#   bench/soak_crash.sh [TRIALS] [BUILDDIR]     (defaults: 2000, build)
#
# CI runs the same test with 120-200 kills; this is the long version.
# The seed is printed; CKPT_CRASH_SEED=S reproduces a run.
set -euo pipefail
trials="${1:-2000}"
build="${2:-build}"
exe="$build/tests/test_crash"
if [ ! -x "$exe" ]; then
	echo "soak_crash.sh: $exe not found; build first (meson setup $build && ninja -C $build)" >&2
	exit 2
fi
export CKPT_TEST_SRCDIR="${CKPT_TEST_SRCDIR:-$(cd "$(dirname "$0")/../tests" && pwd)}"
start=$(date +%s)
CKPT_CRASH_TRIALS="$trials" "$exe"
echo "soak_crash.sh: $trials kills survived in $(( $(date +%s) - start )) s"
