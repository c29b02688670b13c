#!/usr/bin/env bash
# Builds the kvlab that valgrind can run, for `kvlab bench --instructions` (issue 10, item 5):
# valgrind has no AVX-512, so this build (ggml, libllama and kvlab) targets x86-64-v3 (AVX2,
# FMA, F16C) instead of this CPU. Its instruction counts are deterministic: they show a
# regression on a noisy machine, not the native build's speed.
#   scripts/build-callgrind.sh      -> build-callgrind/kvlab (prints its path)
# Not part of CI (a second ggml build: about 6 minutes on 2 cores, once).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
march=x86-64-v3
prefix=$(KVLAB_DEPS_MARCH=$march bash "$root/scripts/deps.sh" | tail -n 1)
bash "$root/scripts/models.sh" smollm2-135m >/dev/null
build="${KVLAB_CALLGRIND_BUILD_DIR:-$root/build-callgrind}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/build.ninja" ]; then
  echo "[build-callgrind] configuring kvlab ($march) in $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLAB_DEPS_PREFIX="$prefix" \
    -DKVLAB_NATIVE=OFF -DKVLAB_MARCH=$march -DKVLAB_BUILD_TESTS=OFF "${launcher[@]}" >&2
fi
echo "[build-callgrind] building kvlab ($march)" >&2
cmake --build "$build" --target kvlab -j "$(nproc)" >&2
echo "$build/kvlab"
