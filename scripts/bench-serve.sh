#!/usr/bin/env bash
# Load benchmark of `kvlab serve` beside llama.cpp's `llama-server` (issue 11): TTFT of a
# question on a stored ~4k-token context vs a fresh prefill, K concurrent clients for a
# bounded time (p50/p99 TTFT, requests/s, errors, RSS over time), resident KV bytes.
#   scripts/bench-serve.sh [MODEL] [--clients 2] [--seconds 60] [--threads 2] [--method snapkv] [--ratio 0.5] [--out F]
# With --replicas (issue 33): two replicas sharing a real redis-server instead, under 4 clients:
# a context made once serves both; TTFT on a context the other replica holds vs a resident one
# vs a fresh prefill; errors; each replica's RSS (scripts/serve/replicas.py --help).
#   scripts/bench-serve.sh [MODEL] --replicas [--clients 4] [--seconds 60] [--threads 2] [--contexts 5] [--out F]
# Not part of CI. Builds llama-server once in the pinned llama.cpp tree of scripts/deps.sh
# (same sources and flags as libllama; its web UI left out) into the dependency prefix.
# Never run it beside other work: check `uptime` first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=smollm2-135m
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
replicas=0
args=()
for a in "$@"; do if [ "$a" = "--replicas" ]; then replicas=1; else args+=("$a"); fi; done
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
  cmake -S "$deps/src" -B "$deps/build" -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
  cmake --build "$deps/build" --target llama-server -j "$(nproc)" >&2
  install -D -m 755 "$deps/build/bin/llama-server" "$prefix/bin/llama-server"
fi
bash "$root/scripts/setup.sh"
gguf=$(bash "$root/scripts/models.sh" "$model")
exec python3 "$root/scripts/serve/load.py" --kvlab "${KVLAB_BUILD_DIR:-$root/build}/kvlab" \
  --llama-server "$prefix/bin/llama-server" --model "$gguf" "$@"
