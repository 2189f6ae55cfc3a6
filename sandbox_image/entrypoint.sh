#!/bin/sh
# Init container of a Knative sandbox: copy the runtime bundle into the emptyDir that the task
# container mounts at /.grove, so the task image itself needs no Python.
# Usage: entrypoint.sh [DEST]   (DEST defaults to /mnt/grove, where the emptyDir is mounted here)
set -eu

src=${GROVE_RUNTIME_DIR:-/grove-runtime}
dest=${1:-/mnt/grove}

if [ ! -f "$src/grove-bundle.json" ]; then
    echo "grove: no runtime bundle at $src" >&2
    exit 1
fi
mkdir -p "$dest"
# -a keeps modes (the loader and interpreter must stay executable) and mtimes: each .pyc records
# its source's mtime, and a copy with fresh mtimes would make Python recompile every module, in
# memory, on every start of the executor.
cp -a "$src/." "$dest/"
exit 0
