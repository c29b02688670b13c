#!/usr/bin/env bash
# kvlab's main job on the default model, after all set-up (README, first command):
# `kvlab demo` compares 10 compression methods at 2 ratios with the full cache on
# needle-in-a-haystack and RULER's single-needle task over the bundled essays, prints the
# table and writes the report (kvlab-demo/report.html). Extra arguments go to `kvlab demo`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
"${KVLAB_BUILD_DIR:-$root/build}/kvlab" demo "$@"
