#!/usr/bin/env bash
# One-step set-up on a fresh machine: system packages and the pinned llama.cpp build
# (scripts/deps.sh), the default model (scripts/models.sh), the Python module into kvlab's venv
# (scripts/python-module.sh), then kvlab itself (CMake + Ninja).
# Idempotent and cached: a second run only rebuilds what changed. Prints nothing on stdout.
# With --tests it also installs what the test suite needs and builds build/kvlab_tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tests=()
[ "${1:-}" = "--tests" ] && tests=(--tests)
source "$root/scripts/build-env.sh"
prepare_build "${tests[@]}"
build="${KVLAB_BUILD_DIR:-$root/build}"
# The Python module (`import kvlab`, docs/python.md) into kvlab's venv.
module_python=$(bash "$root/scripts/python-module.sh")
options=()
if [ ${#tests[@]} -gt 0 ]; then
  options=(-DKVLAB_BUILD_TESTS=ON -DKVLAB_TEST_PYTHON="$(bash "$root/scripts/test-venv.sh")"
           -DKVLAB_MODULE_PYTHON="$module_python")
elif [ ! -f "$build/build.ninja" ]; then
  options=(-DKVLAB_BUILD_TESTS=OFF)
fi
if [ ! -f "$build/build.ninja" ] || [ ${#tests[@]} -gt 0 ]; then
  echo "[setup] configuring kvlab in $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLAB_DEPS_PREFIX="$prefix" "${options[@]}" \
    "${launcher[@]}" >&2
fi
echo "[setup] building kvlab" >&2
cmake --build "$build" -j "$(nproc)" >&2
# KVzap's scorer for the default model (kvlab train-scorer, docs/kvzap.md): trained once into
# kvlab's cache, so that `kvlab demo` and the kvzap method need no extra step.
if [ ${#tests[@]} -eq 0 ]; then
  "$build/kvlab" train-scorer smollm2-135m >&2
fi
