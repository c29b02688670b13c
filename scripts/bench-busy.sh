#!/usr/bin/env bash
# kvlab and llama.cpp on a busy machine (issue 10, item 3): prefill and decode speed with one
# competing process that keeps a core busy, beside the idle machine's figures.
#   scripts/bench-busy.sh [MODEL] [--tokens N] [--decode N] [--reps N] [--out FILE]
# Scenarios, each a fresh process, medians of --reps:
#   idle       : kvlab -t 1, kvlab -t 0 (the default), llama-bench -t 1 and -t <all CPUs>
#   busy       : a spinning process started before; the same four plus kvlab -t <all CPUs>
#   busy-later : the spinner starts 1 s after kvlab (during its prefill): kvlab -t 0 against -t <all>
# kvlab's figures come from `kvlab generate --json` (a prompt of --tokens tokens of bundled text,
# then --decode greedy tokens); llama-bench's from pp<tokens> and tg<decode>.
# Never run it beside other work: the spinner is the only load it wants.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=smollm2-135m tokens=512 decode=256 reps=3 out=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench-busy: unknown argument $1" >&2; exit 2 ;;
  esac
done
kvlab="${KVLAB_BIN:-$root/build/kvlab}"
[ -x "$kvlab" ] || { echo "bench-busy: $kvlab is not built (scripts/setup.sh)" >&2; exit 1; }
gguf=$("$kvlab" fetch "$model")
bench="${KVLAB_LLAMA_BENCH:-$(ls "${KVLAB_CACHE:-$HOME/.cache/kvlab}"/deps/llama-cpp-python-*/install/bin/llama-bench 2>/dev/null | head -1)}"
[ -x "$bench" ] || { echo "bench-busy: llama-bench is not built (scripts/deps.sh --bench builds it)" >&2; exit 1; }
ncpu=$(nproc)
work=$(mktemp -d)
spinner=""
stop_spinner() { if [ -n "$spinner" ]; then kill "$spinner" 2>/dev/null || true; wait "$spinner" 2>/dev/null || true; spinner=""; fi; }
trap 'stop_spinner; rm -rf "$work"' EXIT
start_spinner() { sh -c 'while :; do :; done' > /dev/null 2>&1 & spinner=$!; }

# a prompt of about $tokens tokens: bundled essays, cut by kvlab's tokenizer
python3 - "$root/data/haystack" "$tokens" > "$work/prompt.txt" <<'PY'
import pathlib, sys
text = "".join(p.read_text() for p in sorted(pathlib.Path(sys.argv[1]).glob("*.txt")))
print(text[: int(sys.argv[2]) * 4])  # ~4 characters per token; kvlab reports the exact count
PY

results="$work/results.jsonl"
kvlab_run() {  # scenario threads
  local scen=$1 t=$2 later=${3:-0}
  for r in $(seq "$reps"); do
    [ "$later" = 1 ] && { (sleep 1; exec sh -c 'while :; do :; done') > /dev/null 2>&1 & spinner=$!; }
    "$kvlab" generate "$gguf" -f "$work/prompt.txt" -n "$decode" --no-stop -t "$t" --json 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin); t=j["timings"]; print(json.dumps({"engine":"kvlab","scenario":sys.argv[1],"threads":sys.argv[2],"rep":int(sys.argv[3]),"prefill_tok_s":t["prefill_tokens_per_s"],"decode_tok_s":t["decode_tokens_per_s"]}))' \
      "$scen" "$t" "$r" >> "$results"
    [ "$later" = 1 ] && stop_spinner
  done
  echo "[bench-busy] kvlab $scen -t $t done" >&2
}
bench_run() {  # scenario threads
  local scen=$1 t=$2
  "$bench" -m "$gguf" -p "$tokens" -n "$decode" -t "$t" -r "$reps" -fa on -o json 2>/dev/null |
    python3 -c 'import json,sys
for x in json.load(sys.stdin):
    k = "prefill_tok_s" if x["n_prompt"] > 0 else "decode_tok_s"
    for i, ns in enumerate(x["samples_ns"]):
        print(json.dumps({"engine":"llama-bench","scenario":sys.argv[1],"threads":sys.argv[2],"rep":i+1,k:(x["n_prompt"]+x["n_gen"])*1e9/ns}))' \
    "$scen" "$t" >> "$results"
  echo "[bench-busy] llama-bench $scen -t $t done" >&2
}

uptime >&2
for t in 1 0; do kvlab_run idle $t; done
for t in 1 "$ncpu"; do bench_run idle $t; done
start_spinner; sleep 1
for t in 1 0 "$ncpu"; do kvlab_run busy $t; done
for t in 1 "$ncpu"; do bench_run busy $t; done
stop_spinner
for t in 0 "$ncpu"; do kvlab_run busy-later $t 1; done

python3 - "$results" "$gguf" "$kvlab" "$tokens" "$decode" "$reps" "$ncpu" "${out:-/dev/null}" <<'PY'
import json, platform, statistics, subprocess, sys
path, gguf, kvlab, tokens, decode, reps, ncpu, out = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
groups = {}
for r in rows:
    key = (r["engine"], r["scenario"], r["threads"])
    g = groups.setdefault(key, {"prefill_tok_s": [], "decode_tok_s": []})
    for k in g:
        if k in r: g[k].append(r[k])
table = []
print(f"CPU: {cpu} ({ncpu} CPUs); prompt {tokens} tokens, {decode} decoded, medians of {reps}")
print(f"{'engine':12} {'scenario':11} {'threads':>7} {'prefill tok/s':>14} {'decode tok/s':>13}")
for (e, s, t), g in groups.items():
    med = {k: (statistics.median(v) if v else None) for k, v in g.items()}
    table.append({"engine": e, "scenario": s, "threads": t, **med})
    f = lambda v: f"{v:.1f}" if v is not None else "-"
    label = "0 (auto)" if t == "0" else t
    print(f"{e:12} {s:11} {label:>7} {f(med['prefill_tok_s']):>14} {f(med['decode_tok_s']):>13}")
commit = subprocess.run(["git", "-C", __import__("os").path.dirname(kvlab), "rev-parse", "--short=12", "HEAD"],
                        capture_output=True, text=True).stdout.strip()
doc = {"command": "scripts/bench-busy.sh", "model": gguf, "prompt_tokens_approx": int(tokens), "decode_tokens": int(decode),
       "reps": int(reps), "machine": {"cpu": cpu, "n_cpus": int(ncpu), "kernel": platform.release()},
       "kvlab_commit": commit, "medians": table, "samples": rows}
if out != "/dev/null":
    json.dump(doc, open(out, "w"), indent=1)
    print(f"wrote {out}")
PY
