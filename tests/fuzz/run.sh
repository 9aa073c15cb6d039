#!/bin/bash
# tests/fuzz/run.sh [SECONDS] [BUILDDIR] - build the libFuzzer targets with
# clang + ASan/UBSan and run each for SECONDS (default 60) on a scratch copy
# of its seed corpus (tests/fuzz/corpus/<target>, never modified). Exits
# non-zero on any crash, sanitizer report, round-trip abort, leak or
# timeout; the reproducer (crash-*, leak-*, timeout-*) is kept in
# BUILDDIR/fuzz-out/<target>/ and printed as hex.
#
# BUILDDIR defaults to /var/tmp/ckpt-fuzz. Environment: CC (default clang),
# FUZZ_TARGETS (subset, default all three), FUZZ_JOBS (parallel fuzzing
# processes per target, default 1), FUZZ_PREFIX (command prefix for the
# fuzzers, e.g. "setarch x86_64 -R"; .ci/run sets it for its ASLR fix).
set -euo pipefail

SECS="${1:-60}"
BUILD="${2:-/var/tmp/ckpt-fuzz}"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGETS="${FUZZ_TARGETS:-fuzz_meta fuzz_chunk fuzz_headers}"
JOBS="${FUZZ_JOBS:-1}"
read -r -a PREFIX <<<"${FUZZ_PREFIX:-}"
PAR=()
[ "$JOBS" -gt 1 ] && PAR=(-jobs="$JOBS" -workers="$JOBS")

case "$SECS" in ''|*[!0-9]*) echo "usage: $0 [SECONDS] [BUILDDIR]" >&2; exit 2 ;; esac

if [ ! -f "$BUILD/build.ninja" ]; then
	CC="${CC:-clang}" meson setup "$BUILD" "$SRC" -Dfuzzing=true \
		-Dtests=false -Dtools=false --buildtype=debugoptimized \
		-Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C "$BUILD" tests/fuzz/fuzz_meta tests/fuzz/fuzz_chunk tests/fuzz/fuzz_headers

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

fail=0
for t in $TARGETS; do
	out="$BUILD/fuzz-out/$t"
	rm -rf "$out"
	mkdir -p "$out/corpus"
	cp "$SRC/tests/fuzz/corpus/$t/"* "$out/corpus/"
	echo "==== $t: ${SECS}s"
	set +e
	(cd "$out" && "${PREFIX[@]}" "$BUILD/tests/fuzz/$t" \
		-max_total_time="$SECS" -timeout=25 -rss_limit_mb=2048 \
		-max_len=70000 -print_final_stats=1 "${PAR[@]}" corpus) >"$out/log" 2>&1
	rc=$?
	set -e
	# with -jobs > 1 the output of each job is in fuzz-<n>.log
	cat "$out/log" "$out"/fuzz-*.log 2>/dev/null |
		grep -E '^(#[0-9]+ +DONE|stat::|Done )|ERROR|SUMMARY|round trip|==[0-9]+==' |
		grep -v '^==[0-9]*== *$' | head -n 40 || true
	crashes=$(find "$out" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 \
		-name 'leak-*' -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 \
		-name 'oom-*')
	if [ "$rc" -ne 0 ] || [ -n "$crashes" ]; then
		echo "---- $t FAILED (exit $rc); full log: $out/log"
		tail -n 60 "$out/log"
		for f in $crashes; do
			echo "reproducer $f ($(stat -c %s "$f") bytes):"
			xxd "$f" | head -n 64
		done
		fail=1
	else
		echo "---- $t ok: $(find "$out/corpus" -type f | wc -l) corpus entries"
	fi
done
exit "$fail"
