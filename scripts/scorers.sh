#!/usr/bin/env bash
# Installs the KVzap scorers bundled in data/scorers/ (the default model's, trained by
# `kvlab train-scorer`; docs/kvzap.md gives the command that reproduces each bit for bit) into
# kvlab's cache, where the kvzap method looks for a model's scorer. A scorer already there is kept
# (one trained on this machine, or with --force). Idempotent; run by scripts/setup.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="${KVLAB_CACHE:-$HOME/.cache/kvlab}/scorers"
mkdir -p "$dir"
for f in "$root"/data/scorers/*.kvzap; do
  [ -e "$f" ] || continue
  dest="$dir/$(basename "$f")"
  [ -e "$dest" ] && continue
  cp "$f" "$dest.tmp.$$" && mv "$dest.tmp.$$" "$dest"
  echo "[scorers] installed $(basename "$f") (bundled, data/scorers/)" >&2
done
