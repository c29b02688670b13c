#!/usr/bin/env bash
# Fuzzes one of kvlab's parsers of outside bytes with libFuzzer (clang from Debian):
#   scripts/fuzz.sh NAME [SECONDS]       NAME: a file of fuzz/targets/ (gguf, cache_file, qa_jsonl, experiment, http_body)
#   scripts/fuzz.sh --list
# Builds build-fuzz/kvlab_fuzz (clang, -fsanitize=fuzzer,address,undefined over kvlab's code),
# writes the target's seeds (from real files) and runs for SECONDS (default 600) on one core,
# growing a working corpus in $KVLAB_CACHE/fuzz/NAME/corpus (kept between runs). A crash, leak
# or hang leaves its input in $KVLAB_CACHE/fuzz/NAME/ and fails: fix it, then commit the input
# under fuzz/corpus/NAME/ so that the test suite replays it (tests/test_fuzz_replay.cpp).
# The last line printed is a JSON summary: target, seconds, execs, execs_per_s, corpus, findings.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name="${1:-}"
seconds="${2:-600}"
targets=$(basename -s .cpp "$root"/fuzz/targets/*.cpp | tr '\n' ' ' | sed 's/ $//')  # one file per target, named after it
if [ -z "$name" ] || [ "$name" = "-h" ] || [ "$name" = "--help" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
if [ "$name" = "--list" ]; then echo "$targets" | tr ' ' '\n'; exit 0; fi
case " $targets " in *" $name "*) ;; *) echo "fuzz.sh: unknown target '$name' (one of: $targets)" >&2; exit 2 ;; esac

source "$root/scripts/build-env.sh"
prepare_build --fuzz  # clang, its libFuzzer runtime, libomp
build="${KVLAB_FUZZ_BUILD_DIR:-$root/build-fuzz}"
if [ ! -f "$build/build.ninja" ]; then
  echo "[fuzz] configuring the libFuzzer build in $build" >&2
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVLAB_DEPS_PREFIX="$prefix" -DKVLAB_FUZZ=ON -DKVLAB_BUILD_TESTS=OFF "${launcher[@]}" >&2
fi
echo "[fuzz] building kvlab_fuzz" >&2
cmake --build "$build" --target kvlab_fuzz -j "$(nproc)" >&2

work="${KVLAB_CACHE:-$HOME/.cache/kvlab}/fuzz/$name"
mkdir -p "$work/corpus" "$work/seeds"
export KVLAB_FUZZ_TARGET="$name"
export KVLAB_SOURCE_DIR="$root"
KVLAB_FUZZ_WRITE_SEEDS="$work/seeds" "$build/kvlab_fuzz" >/dev/null
committed="$root/fuzz/corpus/$name"
dirs=("$work/corpus" "$work/seeds")
[ -d "$committed" ] && dirs+=("$committed")
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
log="$work/last-run.log"
echo "[fuzz] $name for $seconds s (log: $log)" >&2
set +e
"$build/kvlab_fuzz" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=262144 \
  -artifact_prefix="$work/" -print_final_stats=1 "${dirs[@]}" >"$log" 2>&1
rc=$?
set -e
tail -n 25 "$log" >&2
execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
execs=${execs:-0}
findings=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -newer "$work/seeds" | wc -l)
corpus=$(find "$work/corpus" -type f | wc -l)
printf '{"target": "%s", "seconds": %s, "execs": %s, "execs_per_s": %s, "corpus": %s, "findings": %s, "exit_code": %s, "cpu": "%s"}\n' \
  "$name" "$seconds" "$execs" "$((execs / (seconds > 0 ? seconds : 1)))" "$corpus" "$findings" "$rc" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
[ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]
