#!/usr/bin/env bash
# One-step set-up on a fresh machine: system packages and the pinned llama.cpp build
# (scripts/deps.sh), the default model (scripts/models.sh), kvlab's venv, then kvlab itself
# (CMake + Ninja): the command-line tool `kvlab` and the Python module `import kvlab` link the same
# position-independent objects, compiled once, and the module is installed into the venv
# (scripts/python-module.sh). The default model's KVzap scorer comes from data/scorers/
# (docs/kvzap.md: the command that reproduces it bit for bit).
# Idempotent and cached: a second run only rebuilds what changed. Prints nothing on stdout.
# With --tests it also installs what the test suite needs and builds build/kvlab_tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tests=()
[ "${1:-}" = "--tests" ] && tests=(--tests)
source "$root/scripts/build-env.sh"
prepare_build "${tests[@]}"
build="${KVLAB_BUILD_DIR:-$root/build}"
module_python=$(bash "$root/scripts/python-module.sh")
options=()
if [ ${#tests[@]} -gt 0 ]; then
  options=(-DKVLAB_BUILD_TESTS=ON -DKVLAB_TEST_PYTHON="$(bash "$root/scripts/test-venv.sh")"
           -DKVLAB_MODULE_PYTHON="$module_python")
elif [ ! -f "$build/build.ninja" ]; then
  options=(-DKVLAB_BUILD_TESTS=OFF)
fi
if [ ! -f "$build/build.ninja" ] || [ ${#tests[@]} -gt 0 ] || ! grep -q '^KVLAB_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "[setup] configuring kvlab in $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLAB_DEPS_PREFIX="$prefix" \
    -DKVLAB_PYTHON=ON -DPython_EXECUTABLE="$module_python" "${options[@]}" "${launcher[@]}" >&2
fi
echo "[setup] building kvlab (the CLI, the Python module${tests:+ and the tests})" >&2
cmake --build "$build" -j "$(nproc)" >&2
bash "$root/scripts/python-module.sh" "$build" >/dev/null
bash "$root/scripts/scorers.sh" >&2
