#!/usr/bin/env bash
# kvlab against kvpress on torch CPU, on the same machine, the same GGUF and the same token
# ids: prefill + compress of one context per method, medians of repetitions (issue 10's anchor).
# Not part of CI: it pip-installs torch, transformers and kvpress into its own venv
# ($KVLAB_CACHE/kvpress-venv, default ~/.cache/kvlab/kvpress-venv).
#   scripts/bench-kvpress.sh [MODEL] [--tokens N] [--ratio R] [--reps N] [--threads "1 2"] [--methods a,b] [--out FILE]
# Prints a table per thread count and writes the JSON (both tools' outputs, provenance, ratios).
# kvlab's figure per method = its own prefill (the model's part; bench-methods --prefill-per-method:
# observed by that method alone) + its compression (its scoring during the prefill included), and
# for none a prefill observed by no method; kvpress's = the base model's forward with the press.
# The two tools run one after the other for each thread count; never run it beside other work.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=smollm2-135m tokens=2048 ratio=0.5 reps=3 threads="1 2" out=""
methods=streaming_llm,snapkv,pyramidkv,h2o,tova,knorm,expected_attention,adakv
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --ratio) ratio=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench-kvpress: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$root/scripts/kvpress/lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the context: real token ids drawn from the vocabulary with a fixed seed (speed does not
# depend on the text), the same ids for both tools
prepare_context "$root" "$model" "$tokens" "$work"
for t in $threads; do
  echo "[bench-kvpress] $t thread(s): kvlab" >&2
  "$kvlab" bench-methods "$gguf" --tokens "$work/ids.json" --context "$tokens" --ratio "$ratio" --methods "$methods" \
    --prefill-per-method --reps "$reps" -t "$t" --json > "$work/kvlab-$t.json"
  echo "[bench-kvpress] $t thread(s): kvpress" >&2
  "$python" "$root/scripts/kvpress/bench.py" --gguf "$gguf" --ids "$work/ids.json" --methods "none,$methods" \
    --ratio "$ratio" --threads "$t" --reps "$reps" --out "$work/kvpress-$t.json" > /dev/null
done
"$python" - "$work" "$threads" "${out:-}" <<'PY'
import json, sys
work, threads, out = sys.argv[1], sys.argv[2].split(), sys.argv[3]
report = {"runs": []}
for t in threads:
    k = json.load(open(f"{work}/kvlab-{t}.json"))
    p = json.load(open(f"{work}/kvpress-{t}.json"))
    ps = {r["method"]: r["prefill_compress_s"] for r in p["results"]}
    rows = [{"method": "none", "kvlab_s": k["prefill_s"], "kvpress_s": ps["none"]}]
    for r in k["results"]:
        rows.append({"method": r["method"], "kvlab_s": r.get("prefill_s", k["prefill_s"]) + r["compression_s"], "kvpress_s": ps[r["method"]]})
    for r in rows:
        r["kvpress_over_kvlab"] = r["kvpress_s"] / r["kvlab_s"]
    print(f"\n{t} thread(s), {k['params']['context']} tokens, ratio {k['params']['ratio']}, "
          f"CPU {k['provenance']['machine']['cpu']} (kvpress {p['provenance']['kvpress']}, torch {p['provenance']['torch']})")
    print(f"{'method':20s} {'kvlab s':>9s} {'kvpress s':>10s} {'kvlab faster':>13s}")
    for r in rows:
        print(f"{r['method']:20s} {r['kvlab_s']:9.2f} {r['kvpress_s']:10.2f} {r['kvpress_over_kvlab']:12.2f}x")
    report["runs"].append({"threads": int(t), "rows": rows, "kvlab": k, "kvpress": p})
if out:
    json.dump(report, open(out, "w"), indent=2)
    print(f"\n[bench-kvpress] written {out}", file=sys.stderr)
PY
