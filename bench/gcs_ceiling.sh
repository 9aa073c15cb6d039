#!/bin/bash
# gcs_ceiling.sh - the loopback Cloud Storage test server's own ceiling.
#
#   bench/gcs_ceiling.sh [--size MiB] [--streams "1 4 8"] [--modes "md5 nomd5"]
#                        [--reps N] [--server PATH] [--dir DIR] [--json]
#
# Starts tests/servers/fake_gcs.py (or --server PATH) once per mode: "md5"
# is the default server, "nomd5" adds --no-md5 (objects carry crc32c only,
# like composite objects). For each number of parallel streams, --size MiB
# of random data (default 1024) is split into that many objects, uploaded
# by that many curl processes at once (uploadType=media, one POST each),
# then downloaded back (alt=media, to /dev/null). Prints MB/s (10^6 bytes
# per second of wall time, all streams together) per case and repetition:
# the figure a client benchmark against this server must stay well below.
# Also printed: the server's CPU seconds per GiB moved (user+system, from
# /proc), so 1/cpu_s_per_GiB is what one core of it could carry, and a
# "pagecache" line: dd of the same bytes into a new file in the same
# directory, the cost the server cannot avoid when it stores an upload
# (on a VM, first-touch of fresh page-cache memory can cap this well
# below memcpy speed; compare upload figures with it).
# A server without --no-md5 (an older copy) runs in mode md5 only.
# Needs --size x 2 free space in DIR (default $TMPDIR or /var/tmp).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
server="$here/../tests/servers/fake_gcs.py"
size=1024
streams="1 4 8"
modes="md5 nomd5"
reps=1
json=0
dir="${TMPDIR:-/var/tmp}"
while [ $# -gt 0 ]; do
	case "$1" in
	--size) size=$2; shift 2 ;;
	--streams) streams=$2; shift 2 ;;
	--modes) modes=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--server) server=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--json) json=1; shift ;;
	-h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gcs_ceiling.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
case "$size$reps" in *[!0-9]*) echo "gcs_ceiling.sh: --size/--reps take integers" >&2; exit 2 ;; esac
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v curl >/dev/null || { echo "gcs_ceiling.sh: curl not found" >&2; exit 2; }

work="$(mktemp -d "$dir/gcs-ceiling.XXXXXX")"
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

head -c "$((size << 20))" /dev/urandom >"$work/data"
total=$((size << 20))

now() { date +%s%N; }
mbps() { echo "$1 $2" | awk '{ printf "%.0f", $1 / ($2 / 1e9) / 1e6 }'; }
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
# server CPU seconds per GiB moved, from a difference of clock ticks
cpu_per_gib() {
	echo "$1 $(getconf CLK_TCK) $total" |
		awk '{ printf "%.2f", $1 / $2 / ($3 / 1073741824) }'
}

pagecache() { # the store's own floor: write the bytes into a new file
	local t0 t1
	t0=$(now)
	dd if="$work/data" of="$work/store/dd.tmp" bs=4M status=none
	t1=$(now)
	rm -f "$work/store/dd.tmp"
	if [ "$json" = 1 ]; then
		printf '{"mode":"pagecache","rep":%d,"mib":%d,"write_MBps":%s}\n' \
			"$1" "$size" "$(mbps "$total" $((t1 - t0)))"
	else
		printf '%-9s %7s %4d %12s\n' pagecache - "$1" "$(mbps "$total" $((t1 - t0)))"
	fi
}

start_server() { # $1: extra flag or empty
	rm -rf "$work/store" "$work/port"
	mkdir -p "$work/store"
	"$py" "$server" --port-file "$work/port" --bucket bench \
		--data-dir "$work/store" $1 >"$work/server.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
	[ -s "$work/port" ] || { cat "$work/server.log" >&2; exit 1; }
	base="http://127.0.0.1:$(cat "$work/port")"
}

stop_server() {
	kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

run_case() { # $1 mode, $2 streams, $3 rep
	local n=$2 i t0 t1 c0 up down upc downc fail=0 pids=()
	rm -f "$work"/part.*
	split -n "$n" -d -a 2 "$work/data" "$work/part."
	c0=$(ticks)
	t0=$(now)
	for i in $(seq -f %02g 0 $((n - 1))); do
		curl -sf -o /dev/null -H "Expect:" -X POST \
			-H "Content-Type: application/octet-stream" -T "$work/part.$i" \
			"$base/upload/storage/v1/b/bench/o?uploadType=media&name=o$i" &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || fail=1; done
	t1=$(now)
	[ "$fail" = 0 ] || { echo "gcs_ceiling.sh: upload failed" >&2; cat "$work/server.log" >&2; exit 1; }
	up=$(mbps "$total" $((t1 - t0)))
	upc=$(cpu_per_gib $(($(ticks) - c0)))
	pids=()
	c0=$(ticks)
	t0=$(now)
	for i in $(seq -f %02g 0 $((n - 1))); do
		curl -sf -o /dev/null "$base/storage/v1/b/bench/o/o$i?alt=media" &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || fail=1; done
	t1=$(now)
	[ "$fail" = 0 ] || { echo "gcs_ceiling.sh: download failed" >&2; exit 1; }
	down=$(mbps "$total" $((t1 - t0)))
	downc=$(cpu_per_gib $(($(ticks) - c0)))
	for i in $(seq -f %02g 0 $((n - 1))); do
		curl -sf -o /dev/null -X DELETE "$base/storage/v1/b/bench/o/o$i"
	done
	if [ "$json" = 1 ]; then
		printf '{"mode":"%s","streams":%d,"rep":%d,"mib":%d,"upload_MBps":%s,"upload_cpu_s_per_GiB":%s,"download_MBps":%s,"download_cpu_s_per_GiB":%s}\n' \
			"$1" "$n" "$3" "$size" "$up" "$upc" "$down" "$downc"
	else
		printf '%-9s %7d %4d %12s %9s %14s %9s\n' "$1" "$n" "$3" "$up" "$upc" "$down" "$downc"
	fi
}

[ "$json" = 1 ] || printf '%-9s %7s %4s %12s %9s %14s %9s\n' mode streams rep \
	"upload_MB/s" "cpu_s/GiB" "download_MB/s" "cpu_s/GiB"
has_nomd5=0
"$py" "$server" --help 2>/dev/null | grep -q -- --no-md5 && has_nomd5=1
for rep in $(seq "$reps"); do
	for mode in $modes; do
		flag=""
		if [ "$mode" = nomd5 ]; then
			[ "$has_nomd5" = 1 ] || continue
			flag=--no-md5
		fi
		start_server "$flag"
		pagecache "$rep"
		for n in $streams; do run_case "$mode" "$n" "$rep"; done
		stop_server
	done
done
