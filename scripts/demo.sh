#!/usr/bin/env bash
# kvlab's main job on the default model, after all set-up (README, first command).
# For now: a generation over a long prompt (an essay and a question), with every timing
# and memory figure. Extra arguments go to `kvlab generate` (e.g. --json).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
{
  cat "$root/tests/data/avg.txt"
  printf '\n\nQuestion: According to the essay above, which programming language did Viaweb use, and why?\nAnswer:'
} > "$prompt"
"${KVLAB_BUILD_DIR:-$root/build}/kvlab" generate smollm2-135m --prompt-file "$prompt" --max-tokens 64 "$@"
