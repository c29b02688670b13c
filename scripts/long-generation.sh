#!/usr/bin/env bash
# Compression while decoding over a long generation (docs/methods.md "Compression during
# decoding"): `kvlab eval --tasks long_continuation` once per decoding policy, each applied to
# the full cache (rows "full decode ..."), merged into one report: the answers' KV bytes at their
# largest, and KL and top-1 along the full cache's own continuation.
# Usage: scripts/long-generation.sh [MODEL] [--out DIR] [--tokens N] [--context N] [--target N]
#        [--interval N] [--samples N] [--threshold T] [--policies "knorm tova ..."] [-t N]
# kvzap runs where the model has its scorer (kvlab train-scorer), with --decode-param threshold=T.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kvlab="${KVLAB_BUILD_DIR:-$root/build}/kvlab"
model=smollm2-135m
out=kvlab-long-generation tokens=2000 context=1024 target=512 interval=64 samples=2 threshold=-4 threads=0
policies="knorm keydiff streaming_llm tova kvzap"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then model=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2 ;;
    --tokens) tokens=$2 ;;
    --context) context=$2 ;;
    --target) target=$2 ;;
    --interval) interval=$2 ;;
    --samples) samples=$2 ;;
    --threshold) threshold=$2 ;;
    --policies) policies=$2 ;;
    -t) threads=$2 ;;
    *) echo "unknown option $1 (see the head of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
echo "[long-generation] $(uptime)" >&2
lscpu | grep 'Model name' >&2
files=()
for p in $policies; do
  extra=()
  [ "$p" = kvzap ] && extra=(--decode-param "threshold=$threshold")
  echo "[long-generation] $p" >&2
  if ! "$kvlab" eval "$model" --tasks long_continuation --lengths "$context" --long-tokens "$tokens" \
      --samples "$samples" --decode-policy "$p" --decode-target "$target" --decode-interval "$interval" \
      "${extra[@]}" -t "$threads" -o "$out/$p" --no-report; then
    echo "[long-generation] $p failed; left out of the report" >&2
    continue
  fi
  files+=("$out/$p/records-0-of-1.jsonl")
done
"$kvlab" report "${files[@]}" --out "$out"
