#!/usr/bin/env bash
# One evaluation spread over N local workers by GNU parallel (Debian's `parallel`), then merged:
# each worker runs `kvlab eval ... --shard i/N --no-report` (sample k goes to shard k mod N; a
# worker that dies is resumed by running the script again), and `kvlab report` merges the shards
# into the report one unsharded run writes (docs/evaluation.md, "Across machines").
# Usage: scripts/eval-parallel.sh -j N -o DIR [-t THREADS] MODEL|EXPERIMENT.json [kvlab eval options]
# The same command line per shard runs under a Slurm array (docs/evaluation.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kvlab="${KVLAB_BINARY:-${KVLAB_BUILD_DIR:-$root/build}/kvlab}"
workers="" out="" threads=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) workers=$2; shift 2 ;;
    -o|--out) out=$2; shift 2 ;;
    -t|--threads) threads=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$workers" ] || [ -z "$out" ] || [ ${#args[@]} -eq 0 ]; then
  echo "usage: $0 -j N -o DIR [-t THREADS] MODEL|EXPERIMENT.json [kvlab eval options]" >&2
  exit 2
fi
command -v parallel >/dev/null || { echo "[eval-parallel] GNU parallel is missing (apt-get install parallel)" >&2; exit 1; }
echo "[eval-parallel] $workers workers x $threads threads -> $out" >&2
# --halt now,fail=1: the first failing shard stops the others (its records stay; a rerun resumes)
seq 0 $((workers - 1)) | parallel --will-cite --halt now,fail=1 --line-buffer --tagstring "[shard {}/$workers]" \
  "$kvlab" eval "${args[@]}" -t "$threads" -o "$out" --no-report --shard "{}/$workers"
"$kvlab" report "$out"
