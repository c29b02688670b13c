#!/usr/bin/env bash
# Do kvlab's methods keep the rows kvpress's presses keep? On the same GGUF and token ids,
# per method and ratio: the mean and minimum Jaccard similarity over (layer, KV head) of the
# kept row sets, for kvlab's defaults and for kvlab's `--preset kvpress` (the parameters that
# follow kvpress's rules; `kvlab methods` lists them and what still differs). Not part of CI: it uses the venv of scripts/bench-kvpress.sh (torch, kvpress).
#   scripts/xcheck-kvpress.sh [MODEL] [--tokens 2000] [--ratios "0.5 0.875"] [--f32] [--kv-f16] [--preset-only] [--methods A,B] [--out FILE]
# --f32: both tools run a float32 copy of the GGUF (scripts/kvpress/dequantize.py), so that
# the quantized weights and kvlab's 8-bit activations are out of the comparison.
# --kv-f16: kvpress's cache rounds every key and value row to float16, as kvlab's KV rows are
# stored, so that the storage precision is out of the comparison too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
methods=knorm,snapkv,tova,h2o,expected_attention,keydiff,streaming_llm,pyramidkv,criticalkv,adakv,chunkkv
model=smollm2-135m tokens=2000 ratios="0.5 0.875" out="" f32=0 kv_f16="" labels="defaults preset-kvpress"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --ratios) ratios=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --f32) f32=1; shift ;;
    --kv-f16) kv_f16=--kv-f16; shift ;;
    --preset-only) labels=preset-kvpress; shift ;;
    --methods) methods=$2; shift 2 ;;
    *) echo "xcheck-kvpress: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$root/scripts/kvpress/lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the context: real token ids drawn from the vocabulary with a fixed seed (speed does not
# depend on the text), the same ids for both tools
prepare_context "$root" "$model" "$tokens" "$work"
if [ "$f32" = 1 ]; then
  "$python" "$root/scripts/kvpress/dequantize.py" "$gguf" "$work/$(basename "$gguf" .gguf)-f32.gguf"
  gguf="$work/$(basename "$gguf" .gguf)-f32.gguf"
fi
declare -A params=([defaults]="" [preset-kvpress]="--preset kvpress")
results=()
for label in $labels; do
  for r in $ratios; do
    plans="$work/plans-$label-$r"
    # shellcheck disable=SC2086
    "$kvlab" bench-methods "$gguf" --tokens "$work/ids.json" --context "$tokens" --ratio "$r" --methods "$methods" \
      --reps 1 --decode 2 -t 1 --dump-plans "$plans" ${params[$label]} > /dev/null
    "$python" "$root/scripts/kvpress/xcheck.py" --gguf "$gguf" --ids "$work/ids.json" --plans "$plans" \
      --ratio "$r" --methods "$methods" --label "kvlab $label" $kv_f16 > "$work/x-$label-$r.json"
    results+=("$work/x-$label-$r.json")
  done
done
"$python" - "$out" "${results[@]}" <<'PY'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f)) for f in files]
print(f"{'kvlab':16s} {'method':20s} {'ratio':>6s} {'mean J':>7s} {'min J':>6s}")
for r in runs:
    for row in r["rows"]:
        if "error" in row:
            print(f"{r['label'][6:]:16s} {row['method']:20s} {r['ratio']:6.3f} {row['error']}")
            continue
        print(f"{r['label'][6:]:16s} {row['method']:20s} {r['ratio']:6.3f} {row['mean_jaccard']:7.3f} {row['min_jaccard']:6.3f}")
print(f"\n{runs[0]['context_tokens']} token ids, CPU {runs[0]['provenance']['cpu']}, kvpress {runs[0]['provenance']['kvpress']}, torch {runs[0]['provenance']['torch']}" + (", kvpress's KV rows rounded to F16" if runs[0].get('kvpress_kv_f16') else ""))
if out:
    json.dump({"runs": runs}, open(out, "w"), indent=2)
PY
