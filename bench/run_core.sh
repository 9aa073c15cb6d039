#!/bin/bash
# run_core.sh - fio baselines + bench_core in one go, on one file system.
#
#   bench/run_core.sh [--size 4G] [--dir DIR] [--build BUILDDIR] [bench_core options]
#
# Measures fio's O_DIRECT sequential write and read bandwidth (io_uring,
# 4 MiB blocks like ckpt's default chunk, depth 32, fsync at the end) for a
# file of --size bytes in DIR, then runs bench_core on the same DIR with those bandwidths, so every
# ratio it prints is against baselines of this run. Run as root for
# drop_caches. Needs --size free space x ~2 in DIR. Other options (--json,
# --threads N, --pool B, --rss-pool B, --no-rss, --strict, --keep) go to
# bench_core; see `bench_core --help`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
size=4G
dir="${TMPDIR:-/var/tmp}/ckpt-bench"
build="$here/../build"
json=0
pass=()
while [ $# -gt 0 ]; do
	case "$1" in
	--size) size=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--json) json=1; pass+=("$1"); shift ;;
	-h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) pass+=("$1"); shift ;;
	esac
done
bench="${BENCH_CORE:-$build/bench/bench_core}"
[ -x "$bench" ] || { echo "run_core.sh: $bench not found (build first, or --build DIR / BENCH_CORE=path)" >&2; exit 2; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3
say() { if [ "$json" = 1 ]; then echo "$*" >&2; else echo "$*"; fi; }

mkdir -p "$dir"
fsz="$size"
case "$fsz" in *[!0-9kKmMgGtT]*) echo "run_core.sh: --size must be an integer with optional K/M/G/T suffix" >&2; exit 2 ;; esac

drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }

bw() { # fio JSON on stdin, "read" or "write" -> bytes/s
	"$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["jobs"][0][sys.argv[1]]["bw_bytes"])' "$1"
}

fio_w=0 fio_r=0
if command -v fio >/dev/null; then
	f="$dir/fio.dat"
	common=(--filename="$f" --size="$fsz" --bs=4M --direct=1 --ioengine=io_uring --iodepth=32 --output-format=json)
	rm -f "$f"
	drop
	fio_w="$(fio --name=w --rw=write --end_fsync=1 "${common[@]}" | bw write)"
	drop
	fio_r="$(fio --name=r --rw=read "${common[@]}" | bw read)"
	rm -f "$f"
	say "fio O_DIRECT sequential ($fsz, 4 MiB, io_uring depth 32): write $((fio_w / 1048576)) MiB/s, read $((fio_r / 1048576)) MiB/s"
else
	say "fio not installed: bandwidth ratios will be n/a"
fi

"$bench" --dir "$dir" --size "$size" --fio-write-bw "$fio_w" --fio-read-bw "$fio_r" ${pass[@]+"${pass[@]}"}
