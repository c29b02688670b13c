#!/usr/bin/env bash
# One-step set-up on a fresh machine: system packages and the pinned llama.cpp build
# (scripts/deps.sh), the default model (scripts/models.sh), then kvlab itself (CMake + Ninja).
# Idempotent and cached: a second run only rebuilds what changed. Prints nothing on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(bash "$root/scripts/deps.sh" | tail -n 1)
bash "$root/scripts/models.sh" smollm2-135m >/dev/null
build="${KVLAB_BUILD_DIR:-$root/build}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/build.ninja" ]; then
  echo "[setup] configuring kvlab in $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLAB_DEPS_PREFIX="$prefix" "${launcher[@]}" >&2
fi
echo "[setup] building kvlab" >&2
cmake --build "$build" -j "$(nproc)" >&2
