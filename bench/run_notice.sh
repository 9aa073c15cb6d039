#!/bin/sh
# run_notice.sh - a maintenance notice to a durable checkpoint, end to end
# against the loopback fakes (tests/servers/fake_metadata.py for the
# notice, tests/servers/fake_gcs.py for Cloud Storage): bench_notice
# trains a synthetic model under the watcher; once it is ready the script
# sets instance/maintenance-event to TERMINATE_ON_HOST_MAINTENANCE; the
# engine plans and saves; bench_notice prints notice -> durable local
# checkpoint, notice -> committed in Cloud Storage, the margin left in
# the window and the largest state fitting 30 s, 60 s and 5 minutes here.
# Two runs: a directory with a gs:// remote (local first), and gs:// alone.
# Prints figures; asserts nothing (a failed save fails the script).
# --warmup N (default 1): periodic saves before the notice, so the plan
# uses throughputs measured by saves. gs:// alone runs with codec none: a
# compressed save to gs:// alone stalls on this tree (see the report of
# the issue 7 work), which is not what this measures.
# usage: bench/run_notice.sh [--build DIR] [--size 4G] [--window 60]
#                            [--dir DIR] [--codec float] [--warmup 1]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build
size=4G
window=60
codec=float
warmup=1
dir=
while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2 ;;
	--size) size=$2 ;;
	--window) window=$2 ;;
	--dir) dir=$2 ;;
	--codec) codec=$2 ;;
	--warmup) warmup=$2 ;;
	*) echo "usage: $0 [--build DIR] [--size 4G] [--window 60]" \
		"[--dir DIR] [--codec float] [--warmup 1]" >&2; exit 2 ;;
	esac
	shift 2
done
py=/usr/bin/python3
bench=${BENCH_NOTICE:-$build/bench/bench_notice}
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/ckpt-notice.XXXXXX")
[ -n "$dir" ] || dir=$tmp/ckpt
md=
gs=
cleanup() {
	for p in $md $gs; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
	done
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

wait_port() {
	for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
	echo "server did not start: $1" >&2
	exit 1
}

mkdir -p "$tmp/store"
$py "$here/tests/servers/fake_metadata.py" --port-file "$tmp/md-port" \
	>"$tmp/md.log" 2>&1 &
md=$!
$py "$here/tests/servers/fake_gcs.py" --port-file "$tmp/gs-port" \
	--bucket bkt --data-dir "$tmp/store" >"$tmp/gs.log" 2>&1 &
gs=$!
wait_port "$tmp/md-port"
wait_port "$tmp/gs-port"
mdurl=http://127.0.0.1:$(cat "$tmp/md-port")
export GCE_METADATA_HOST=127.0.0.1:$(cat "$tmp/md-port")
export STORAGE_EMULATOR_HOST=http://127.0.0.1:$(cat "$tmp/gs-port")

# the fake's test-only control (python3: no curl needed)
setval() {
	$py -c 'import json, sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1] + "/_fake/set", method="POST",
    data=json.dumps({"key": "instance/maintenance-event",
                     "value": sys.argv[2]}).encode()), timeout=10).read()' \
		"$mdurl" "$1"
}

# one run: bench_notice ARGS...; announces the notice once it is ready
run() {
	rm -f "$tmp/ready"
	setval NONE
	"$bench" --size "$size" --window "$window" --warmup "$warmup" \
		--ready "$tmp/ready" "$@" &
	b=$!
	while [ ! -e "$tmp/ready" ]; do
		kill -0 "$b" 2>/dev/null || break
		sleep 0.1
	done
	sleep 1 # a few steps of "training" first
	setval TERMINATE_ON_HOST_MAINTENANCE
	wait "$b"
}

echo "== $size state, $window s window, $(nproc) CPUs, directory $dir"
run --loc "$dir/local" --remote gs://bkt/both --codec "$codec"
rm -rf "$dir/local"
echo "== gs:// alone"
run --loc gs://bkt/alone --codec none
