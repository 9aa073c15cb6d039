#!/bin/sh
# run_gcs.sh - upload of a checkpoint to the loopback fake Cloud Storage
# server (tests/servers/fake_gcs.py), same run, same bytes:
#   ckpt gs:// alone        bench_gcs --mode gcs (saved straight to gs://)
#   local only              bench_gcs --mode local
#   local + gs:// ("both")  bench_gcs --mode both: durable locally, then
#                           committed in the bucket
#   gcloud storage cp       of the local step's files (private
#                           CLOUDSDK_CONFIG, api_endpoint_overrides/storage,
#                           auth/access_token_file; as tests/test_gcs_fidelity.py)
#   raw curl                the same shard files, one media upload each, all
#                           at once: the server's own ceiling
# Prints figures; asserts nothing.
# usage: bench/run_gcs.sh [BUILD_DIR] [SIZE ...]   (default: build 1G)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
[ $# -gt 0 ] && shift
sizes=${*:-1G}
py=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/ckpt-gcsbench.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

mkdir -p "$tmp/store"
$py "$here/tests/servers/fake_gcs.py" --port-file "$tmp/port" \
	--bucket bkt --data-dir "$tmp/store" >"$tmp/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
url=http://127.0.0.1:$(cat "$tmp/port")
export STORAGE_EMULATOR_HOST=$url
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }

for size in $sizes; do
	echo "== $size checkpoint, fake_gcs at $url"
	"$build/bench/bench_gcs" --mode gcs --remote "gs://bkt/$size-gcs" \
		--size "$size"
	"$build/bench/bench_gcs" --mode local --dir "$tmp/local-$size" \
		--size "$size"
	"$build/bench/bench_gcs" --mode both --dir "$tmp/both-$size" \
		--remote "gs://bkt/$size-both" --size "$size"
	step=$(ls "$tmp/local-$size" | grep '^step-' | head -1)
	bytes=$(du -sb "$tmp/local-$size/$step" | cut -f1)

	if command -v gcloud >/dev/null 2>&1; then
		cfg=$tmp/gcloud-cfg
		mkdir -p "$cfg"
		echo dummy-access-token >"$tmp/token"
		g() {
			env -u STORAGE_EMULATOR_HOST CLOUDSDK_CONFIG="$cfg" \
				CLOUDSDK_CORE_DISABLE_PROMPTS=1 \
				HTTPS_PROXY=http://127.0.0.1:9 \
				NO_PROXY=127.0.0.1,localhost gcloud "$@"
		}
		g config set core/project ckpt-bench >/dev/null 2>&1
		g config set auth/access_token_file "$tmp/token" >/dev/null 2>&1
		g config set api_endpoint_overrides/storage \
			"$url/storage/v1/" >/dev/null 2>&1
		g config set core/disable_usage_reporting true >/dev/null 2>&1
		g config set component_manager/disable_update_check true \
			>/dev/null 2>&1
		t0=$(now)
		# the step's files to a prefix (`cp -r DIR` draws a 404 from
		# fake_gcs for a request of its own: same files, same client)
		g storage cp "$tmp/local-$size/$step"/* \
			"gs://bkt/$size-gcloud/" >"$tmp/gcloud.log" 2>&1 ||
			{ echo "gcloud failed:"; cat "$tmp/gcloud.log"; }
		t1=$(now)
		s=$(secs "$t0" "$t1")
		echo "mode=gcloud-cp bytes=$bytes secs=$s MiB/s=$(echo \
			"$bytes / 1048576 / $s" | bc)"
	else
		echo "gcloud: not installed, skipped"
	fi

	t0=$(now)
	pids=
	for f in "$tmp/local-$size/$step"/*.shard; do
		curl -sS -o /dev/null -H 'Content-Type: application/octet-stream' \
			-H 'Expect:' --data-binary "@$f" \
			"$url/upload/storage/v1/b/bkt/o?uploadType=media&name=$size-raw/$(basename "$f")" &
		pids="$pids $!"
	done
	wait $pids
	t1=$(now)
	s=$(secs "$t0" "$t1")
	echo "mode=curl-ceiling bytes=$bytes secs=$s MiB/s=$(echo \
		"$bytes / 1048576 / $s" | bc)"
done
