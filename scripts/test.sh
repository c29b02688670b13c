#!/usr/bin/env bash
# Builds kvlab after all set-up and runs every test (README, second command).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" --tests
build="${KVLAB_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure --timeout 1200 "$@"
