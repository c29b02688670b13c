#!/usr/bin/env bash
# Runs Python with kvlab's module (`import kvlab`; docs/python.md) after all set-up:
# scripts/python.sh examples/quickstart.py
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
exec "${KVLAB_CACHE:-$HOME/.cache/kvlab}/venv/bin/python" "$@"
