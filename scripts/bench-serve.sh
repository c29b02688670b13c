#!/usr/bin/env bash
# Load benchmark of `kvlab serve` beside llama.cpp's `llama-server` (issue 11): TTFT of a
# question on a stored ~4k-token context vs a fresh prefill, K concurrent clients for a
# bounded time (p50/p99 TTFT, requests/s, errors, RSS over time), resident KV bytes.
#   scripts/bench-serve.sh [MODEL] [--clients 2] [--seconds 60] [--threads 2] [--method snapkv] [--ratio 0.5] [--out F]
# With --replicas (issue 33): two replicas sharing a real redis-server instead, under 4 clients:
# a context made once serves both; TTFT on a context the other replica holds vs a resident one
# vs a fresh prefill; errors; each replica's RSS (scripts/serve/replicas.py --help).
#   scripts/bench-serve.sh [MODEL] --replicas [--clients 4] [--seconds 60] [--threads 2] [--contexts 5] [--out F]
# With --concurrency 1,4,16 (issue 46): N clients at once on one stored ~2k-token document, kvlab
# with continuous batching, kvlab with --no-batching (slots) and llama-server -np N -cb (the
# document as each client's cached prompt prefix) side by side: aggregate decode tokens/s, request
# time and TTFT p50 / p90, errors, peak RSS (scripts/serve/concurrency.py --help).
#   scripts/bench-serve.sh [MODEL] --concurrency 1,4,16 [--threads 2] [--answer 96] [--no-stream] [--out F]
# Not part of CI. Builds llama-server once in the pinned llama.cpp tree of scripts/deps.sh
# (same sources and flags as libllama; its web UI left out) into the dependency prefix.
# Never run it beside other work: check `uptime` first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=smollm2-135m
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
replicas=0
concurrency=0
args=()
for a in "$@"; do
  if [ "$a" = "--replicas" ]; then replicas=1; else args+=("$a"); fi
  case "$a" in --concurrency*) concurrency=1 ;; esac
done
if [ "$replicas" = 1 ]; then
  bash "$root/scripts/deps.sh" --tests >/dev/null  # redis-server
  bash "$root/scripts/setup.sh"
  exec python3 "$root/scripts/serve/replicas.py" --kvlab "${KVLAB_BUILD_DIR:-$root/build}/kvlab" \
    --model "$(bash "$root/scripts/models.sh" "$model")" ${args[@]+"${args[@]}"}
fi
prefix=$(bash "$root/scripts/deps.sh" | tail -n 1)
deps=$(dirname "$prefix")
if [ ! -x "$prefix/bin/llama-server" ]; then
  echo "[bench-serve] building llama-server (once, a few minutes)" >&2
  cmake -S "$deps/src" -B "$deps/build" -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
  cmake --build "$deps/build" --target llama-server -j "$(nproc)" >&2
  install -D -m 755 "$deps/build/bin/llama-server" "$prefix/bin/llama-server"
fi
bash "$root/scripts/setup.sh"
gguf=$(bash "$root/scripts/models.sh" "$model")
if [ "$concurrency" = 1 ]; then  # many users at once (issue 46): batching, slots and llama-server side by side
  exec python3 "$root/scripts/serve/concurrency.py" --kvlab "${KVLAB_BUILD_DIR:-$root/build}/kvlab" \
    --llama-server "$prefix/bin/llama-server" --model "$gguf" --config batching= --config slots=--no-batching "$@"
fi
exec python3 "$root/scripts/serve/load.py" --kvlab "${KVLAB_BUILD_DIR:-$root/build}/kvlab" \
  --llama-server "$prefix/bin/llama-server" --model "$gguf" "$@"
