#!/usr/bin/env bash
# The whole test suite again in an AddressSanitizer + UndefinedBehaviorSanitizer build of kvlab
# (build-sanitize/, KVLAB_SANITIZE=ON; ggml and libllama stay as scripts/deps.sh built them).
# Every sanitizer report aborts the process that made it, so the test that ran it fails.
# Extra arguments go to ctest (e.g. -R BadInput).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/build-env.sh"
prepare_build --tests
build="${KVLAB_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
if [ ! -f "$build/build.ninja" ]; then
  echo "[sanitize] configuring kvlab in $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLAB_DEPS_PREFIX="$prefix" \
    -DKVLAB_SANITIZE=ON -DKVLAB_BUILD_TESTS=ON -DKVLAB_TEST_PYTHON="$(bash "$root/scripts/test-venv.sh")" \
    "${launcher[@]}" >&2
fi
echo "[sanitize] building kvlab with -fsanitize=address,undefined" >&2
cmake --build "$build" -j "$(nproc)" >&2
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:suppressions=$root/tests/sanitize/asan.supp"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitize/ubsan.supp"
cd "$build"
if [ $# -eq 0 ]; then set -- -LE slow; fi  # the slow tests (a scorer trained again) run in the plain build
ctest --output-on-failure --timeout 1800 "$@"
