#!/usr/bin/env bash
# Builds kvlab after all set-up and runs every test (README, second command), but those labelled
# slow (the bundled scorer trained again, minutes: `scripts/test.sh -L slow` runs them; CI does).
# Arguments replace that default and go to ctest (e.g. -R NAME).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" --tests
build="${KVLAB_BUILD_DIR:-$root/build}"
cd "$build"
if [ $# -eq 0 ]; then set -- -LE slow; fi
ctest --output-on-failure --timeout 1200 "$@"
