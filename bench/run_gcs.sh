#!/bin/sh
# run_gcs.sh - upload of a checkpoint to the loopback fake Cloud Storage
# server (tests/servers/fake_gcs.py), same run, same bytes:
#   ckpt gs:// alone        bench_gcs --mode gcs (saved straight to gs://)
#   local only              bench_gcs --mode local
#   local + gs:// ("both")  bench_gcs --mode both: durable locally, then
#                           committed in the bucket
#   gcloud storage cp -r    of the local step directory (private
#                           CLOUDSDK_CONFIG, api_endpoint_overrides/storage,
#                           auth/access_token_file; as tests/test_gcs_fidelity.py)
#   raw curl                the same shard files, one media upload each, all
#                           at once (a rough figure of the server, see
#                           gcs_ceiling.sh for its ceiling)
# Prints figures; asserts nothing.
#
# usage: bench/run_gcs.sh [--full] [BUILD_DIR] [SIZE ...]   (default: build 1G)
# environment:
#   REPS=N        repeat everything N times, a fresh server each (default 1)
#   BENCH_DIR=D   where the files and the server's objects go (default
#                 $TMPDIR or /var/tmp; needs about 6 x SIZE per repetition)
#   GCS_SERVER_ARGS="--no-md5"  extra fake_gcs.py options. --no-md5 lifts
#                 the server's own ceiling (no MD5 of every upload) for
#                 ckpt's figures; gcloud then refuses its uploads (it
#                 checks the md5Hash a simple object has on the service)
#   BASE_BUILD=B  a second build (e.g. of main): its bench_gcs runs the gcs
#                 and both modes in the same repetition, for before/after
# --full: then, for each SIZE, bench/run_gcs_restore.sh (restore from gs://
# vs gcloud cp -r down) and bench/gcs_ceiling.sh (the server's ceiling) at
# that size with REPS repetitions. The 4 GiB case of the closing note:
#   REPS=3 bench/run_gcs.sh --full build 4G
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
full=0
if [ "${1:-}" = --full ]; then
	full=1
	shift
fi
build=${1:-$here/build}
[ $# -gt 0 ] && shift
sizes=${*:-1G}
reps=${REPS:-1}
base=${BASE_BUILD:-}
dir=${BENCH_DIR:-${TMPDIR:-/var/tmp}}
py=/usr/bin/python3
tmp=
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	[ -n "$tmp" ] && rm -rf "$tmp"
	pid=
	tmp=
}
trap cleanup EXIT INT TERM
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }
mib() { echo "$1 / 1048576 / $2" | bc; }

for size in $sizes; do
for rep in $(seq "$reps"); do
	tmp=$(mktemp -d "$dir/ckpt-gcsbench.XXXXXX")
	mkdir -p "$tmp/store"
	# shellcheck disable=SC2086 # GCS_SERVER_ARGS: words on purpose
	$py "$here/tests/servers/fake_gcs.py" --port-file "$tmp/port" \
		--bucket bkt --data-dir "$tmp/store" ${GCS_SERVER_ARGS:-} \
		>"$tmp/server.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
	url=http://127.0.0.1:$(cat "$tmp/port")
	export STORAGE_EMULATOR_HOST=$url
	echo "== $size checkpoint, rep $rep/$reps, fake_gcs at $url," \
		"files under $tmp, load $(cut -d' ' -f1-3 /proc/loadavg)"
	"$build/bench/bench_gcs" --mode gcs --remote "gs://bkt/$size-gcs" \
		--size "$size"
	"$build/bench/bench_gcs" --mode local --dir "$tmp/local-$size" \
		--size "$size"
	"$build/bench/bench_gcs" --mode both --dir "$tmp/both-$size" \
		--remote "gs://bkt/$size-both" --size "$size"
	if [ -n "$base" ]; then
		printf 'base: '
		"$base/bench/bench_gcs" --mode gcs \
			--remote "gs://bkt/$size-base-gcs" --size "$size"
		printf 'base: '
		"$base/bench/bench_gcs" --mode both --dir "$tmp/base-both" \
			--remote "gs://bkt/$size-base-both" --size "$size"
		rm -rf "$tmp/base-both"
	fi
	rm -rf "$tmp/both-$size"
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
		g storage cp -r "$tmp/local-$size/$step" \
			"gs://bkt/$size-gcloud/" >"$tmp/gcloud.log" 2>&1 ||
			{ echo "gcloud failed:"; cat "$tmp/gcloud.log"; }
		t1=$(now)
		s=$(secs "$t0" "$t1")
		echo "mode=gcloud-cp-r bytes=$bytes secs=$s MiB/s=$(mib "$bytes" "$s")"
	else
		echo "gcloud: not installed, skipped"
	fi

	t0=$(now)
	pids=
	for f in "$tmp/local-$size/$step"/*.shard; do
		curl -sS -o /dev/null -X POST -T "$f" \
			-H 'Content-Type: application/octet-stream' \
			-H 'Expect:' \
			"$url/upload/storage/v1/b/bkt/o?uploadType=media&name=$size-raw/$(basename "$f")" &
		pids="$pids $!"
	done
	wait $pids
	t1=$(now)
	s=$(secs "$t0" "$t1")
	echo "mode=curl-media bytes=$bytes secs=$s MiB/s=$(mib "$bytes" "$s")"
	cleanup
done
if [ "$full" = 1 ]; then
	n=$(echo "$size" | sed 's/[GgMm]$//')
	case "$size" in
	*[Gg]) n=$((n * 1024)) ;;
	esac
	echo "== restore from gs:// vs gcloud cp -r down, $n MiB"
	"$here/bench/run_gcs_restore.sh" --size-mib "$n" --reps "$reps" \
		--build "$build" --dir "$dir/ckpt-gcs-restore.$$"
	echo "== the server's ceiling, $n MiB"
	"$here/bench/gcs_ceiling.sh" --size "$n" --reps "$reps" --dir "$dir"
fi
done
