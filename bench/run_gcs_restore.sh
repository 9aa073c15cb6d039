#!/bin/bash
# run_gcs_restore.sh - restore from gs:// (ckptctl restore) vs
# `gcloud storage cp -r` down of the same objects, from the same loopback
# fake Cloud Storage server (tests/servers/fake_gcs.py), same run.
#
#   bench/run_gcs_restore.sh [--size-mib 1024] [--reps 2] [--streams N]
#                            [--dir DIR] [--out DIR2] [--build BUILDDIR]
#                            [--keep]
#
# Makes a checkpoint of --size-mib MiB of bf16-like random data with
# `ckptctl import --codec none` (stored bytes = raw bytes), starts the fake
# server with its data on disk under DIR, pushes the step with
# `ckptctl push`, then alternates --reps times: `ckptctl restore gs://...
# --to DIR/r` (parallel ranged reads, XXH3 of every file checked, fsync,
# committed) and `gcloud storage cp -r gs://.../step-N DIR/g` (gcloud
# pointed at the fake through a private CLOUDSDK_CONFIG, as
# tests/test_gcs_fidelity.py does; skipped if gcloud is missing). Also
# `ckptctl verify gs://...` (the reader pipeline: merged ranged reads,
# chunk decode and XXH3 on all cores, nothing written). Prints times and
# MiB/s; asserts nothing. CKPT_GCS_STREAMS (--streams) sets ckpt's
# parallel transfers. --out puts both downloads elsewhere (e.g. /dev/shm,
# to take the disk out of the comparison; ckpt still fsyncs there).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/.."
size_mib=1024
reps=2
dir="${TMPDIR:-/var/tmp}/ckpt-gcs-restore"
build="$src/build"
keep=0
out=
while [ $# -gt 0 ]; do
	case "$1" in
	--size-mib) size_mib=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--streams) export CKPT_GCS_STREAMS=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	-h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "run_gcs_restore.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
ctl="$build/tools/ckptctl"
py=/usr/bin/python3
[ -x "$ctl" ] || { echo "run_gcs_restore.sh: $ctl not found (build first or --build DIR)" >&2; exit 2; }
[ -x "$py" ] || { echo "run_gcs_restore.sh: $py is missing" >&2; exit 2; }

rm -rf "$dir"
mkdir -p "$dir"
out="${out:-$dir}/ckpt-gcs-restore-out.$$"
mkdir -p "$out"
srv_pid=
cleanup() {
	[ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null
	rm -rf "$out"
	[ "$keep" = 1 ] || rm -rf "$dir"
}
trap cleanup EXIT

now() { date +%s.%N; }
rate() { "$py" -c 'import sys; b,t=float(sys.argv[1]),float(sys.argv[2]); print("%.2f s, %.0f MiB/s" % (t, b/t/1048576))' "$1" "$2"; }

# 1. the checkpoint
"$py" - "$dir/model.safetensors" "$size_mib" <<'EOF'
import json, os, struct, sys
path, mib = sys.argv[1], int(sys.argv[2])
n = 16
per = (mib << 20) // n // 2 * 2
hdr, off = {}, 0
for i in range(n):
    hdr["layer%02d/w" % i] = {"dtype": "BF16", "shape": [per // 2],
                              "data_offsets": [off, off + per]}
    off += per
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):
        left = per
        while left:
            k = min(left, 64 << 20)
            f.write(os.urandom(k))
            left -= k
EOF
"$ctl" import --codec none "$dir/model.safetensors" "$dir/local@1" >/dev/null
rm -f "$dir/model.safetensors"
fbytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'; }
bytes=$(fbytes "$dir/local/step-00000000000000000001")
echo "checkpoint: $((bytes / 1048576)) MiB in $(ls "$dir/local/step-00000000000000000001" | wc -l) files"

# 2. the server, data on disk
"$py" "$src/tests/servers/fake_gcs.py" --port-file "$dir/port" --bucket bench \
	--data-dir "$dir/srv" >/dev/null &
srv_pid=$!
for _ in $(seq 3000); do [ -s "$dir/port" ] && break; sleep 0.01; done
url="http://127.0.0.1:$(cat "$dir/port")"
export STORAGE_EMULATOR_HOST="$url"
gs="gs://bench/run"
echo "server: $url (fake_gcs.py), ckpt streams: ${CKPT_GCS_STREAMS:-8 (default)}"

t0=$(now)
"$ctl" push "$dir/local@1" "$gs" >/dev/null
t1=$(now)
echo "ckptctl push (upload, for reference):  $(rate "$bytes" "$(echo "$t1 - $t0" | bc)")"

# 3. gcloud config, private
gcloud_bin=$(command -v gcloud || true)
if [ -n "$gcloud_bin" ]; then
	cfg="$dir/gcloud-cfg"
	mkdir -p "$cfg"
	echo dummy-token >"$dir/token"
	g() {
		env -u STORAGE_EMULATOR_HOST CLOUDSDK_CONFIG="$cfg" \
			CLOUDSDK_CORE_DISABLE_PROMPTS=1 \
			HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
			NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost \
			"$gcloud_bin" "$@"
	}
	g config set core/project ckpt-bench >/dev/null 2>&1
	g config set auth/access_token_file "$dir/token" >/dev/null 2>&1
	g config set api_endpoint_overrides/storage "$url/storage/v1/" >/dev/null 2>&1
	g config set core/disable_usage_reporting true >/dev/null 2>&1
	g config set component_manager/disable_update_check true >/dev/null 2>&1
	echo "gcloud: $(g --version 2>/dev/null | head -1)"
else
	echo "gcloud not installed: its runs are skipped"
fi

# 4. alternate the two, --reps times
for rep in $(seq "$reps"); do
	rm -rf "$out/r" "$out/g"
	sync
	t0=$(now)
	"$ctl" restore "$gs" --to "$out/r" >/dev/null
	t1=$(now)
	echo "rep $rep: ckptctl restore gs:// -> DIR (verified, fsynced): $(rate "$bytes" "$(echo "$t1 - $t0" | bc)")"
	if [ -n "$gcloud_bin" ]; then
		mkdir -p "$out/g"
		sync
		t0=$(now)
		g storage cp -r "$gs/step-00000000000000000001" "$out/g" >/dev/null 2>&1
		t1=$(now)
		got=$(fbytes "$out/g")
		[ "$got" -ge "$bytes" ] || echo "  (gcloud copied only $got bytes)"
		echo "rep $rep: gcloud storage cp -r down:                    $(rate "$bytes" "$(echo "$t1 - $t0" | bc)")"
		cmp -s "$out/g/step-00000000000000000001/h00000-f000.shard" \
			"$dir/local/step-00000000000000000001/h00000-f000.shard" ||
			echo "  (gcloud's copy differs from the original!)"
	fi
	t0=$(now)
	"$ctl" verify "$gs" >/dev/null
	t1=$(now)
	echo "rep $rep: ckptctl verify gs:// (read + check, no write):  $(rate "$bytes" "$(echo "$t1 - $t0" | bc)")"
done
