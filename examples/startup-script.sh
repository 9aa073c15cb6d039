#!/bin/bash
# startup-script.sh - the startup script of a Cloud TPU VM that trains with
# ckpt: restore the latest checkpoint from Cloud Storage to local disk, then
# train under `ckptctl run`, which restarts the training after a failure or
# after a stop behind a checkpoint and resumes from the newest step.
#
# Install it as the node's `startup-script` metadata, for example
#   gcloud compute tpus tpu-vm create my-tpu --zone us-central2-b \
#     --accelerator-type v4-8 --version tpu-ubuntu2204-base \
#     --metadata-from-file startup-script=startup-script.sh \
#     --metadata ckpt-remote=gs://my-bucket/run1,ckpt-train='python3 train.py'
# `ckptctl recover` recreates a node that did not come back with the same
# metadata, so the new VM runs this script and resumes where the old one
# stopped: a recreated node keeps nothing local, the bucket has it all.
#
# Settings: the environment when set, else the VM's metadata attributes
# (instance/attributes/KEY on the metadata server, GCE_METADATA_HOST):
#   CKPT_REMOTE  ckpt-remote  gs://BUCKET/PREFIX, the checkpoints' Cloud
#                             Storage copy (required)
#   CKPT_DIR     ckpt-dir     local checkpoint root (default /var/lib/ckpt)
#   CKPT_TRAIN   ckpt-train   the training command, run with sh -c
#                             (required); it gets CKPT_LOCATION,
#                             CKPT_REMOTE, CKPT_RESUME_STEP, ... from run
#   CKPT_HOST    agent-worker-number  this host's index (default 0)
#   CKPTCTL      the ckptctl binary (default: ckptctl on PATH)
#   CKPT_RUN_ARGS extra options for `ckptctl run` (word-split)
# Cloud Storage is reached as ckptctl always does (STORAGE_EMULATOR_HOST,
# CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE, the metadata server's token).
#
# Exit status: that of `ckptctl run` (it replaces this script), 1 when a
# setting is missing or the restore failed.
set -u

say() { echo "startup-script: $*"; }

CKPTCTL=${CKPTCTL:-ckptctl}
MD_HOST=${GCE_METADATA_HOST:-metadata.google.internal}

# attribute KEY of this VM, empty when absent
attr() {
	curl -fsS --max-time 10 -H 'Metadata-Flavor: Google' \
		"http://$MD_HOST/computeMetadata/v1/instance/attributes/$1" \
		2>/dev/null || true
}

REMOTE=${CKPT_REMOTE:-$(attr ckpt-remote)}
DIR=${CKPT_DIR:-$(attr ckpt-dir)}
DIR=${DIR:-/var/lib/ckpt}
TRAIN=${CKPT_TRAIN:-$(attr ckpt-train)}
HOST=${CKPT_HOST:-$(attr agent-worker-number)}
HOST=${HOST:-0}

case "$REMOTE" in
gs://?*) ;;
*) say "no gs://BUCKET/PREFIX in CKPT_REMOTE or attribute ckpt-remote"
   exit 1 ;;
esac
if [ -z "$TRAIN" ]; then
	say "no training command in CKPT_TRAIN or attribute ckpt-train"
	exit 1
fi
mkdir -p "$DIR" || exit 1

# the latest committed step at a location ('ckptctl ls' marks it with *),
# empty when it has none
latest() {
	"$CKPTCTL" ls "$1" 2>/dev/null | awk '$2 == "*" { print $1; exit }'
}

remote_step=$(latest "$REMOTE")
local_step=$(latest "$DIR")
if [ -z "$remote_step" ]; then
	say "no checkpoint in $REMOTE: training from the start"
elif [ -n "$local_step" ] && [ "$local_step" -ge "$remote_step" ]; then
	say "step $local_step is on local disk already ($REMOTE has $remote_step)"
else
	say "restoring step $remote_step from $REMOTE to $DIR"
	if ! "$CKPTCTL" restore "$REMOTE@$remote_step" --to "$DIR"; then
		say "restore of step $remote_step failed"
		exit 1
	fi
fi

say "training under ckptctl run: $TRAIN"
# shellcheck disable=SC2086 # CKPT_RUN_ARGS is a list of options
exec "$CKPTCTL" run --location "$DIR" --remote "$REMOTE" --host "$HOST" \
	${CKPT_RUN_ARGS:-} -- sh -c "$TRAIN"
