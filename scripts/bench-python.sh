#!/usr/bin/env bash
# The Python module's overhead (issue 31, docs/python.md): a 512-token prefill and a 64-token
# greedy decode through `import kvlab` against `kvlab generate MODEL -f FILE -n 64 --no-stop
# --json -t T` on the same machine, alternated, medians of REPS runs each. The CLI's figure is
# its own ttft_s + decode_s (its load excluded); Python's is the wall time of the call
# (Model.generate_from_cache on a new cache: the CLI's path, engine.generate on the whole prompt)
# and of the seed's flow (prefill of 511 tokens, then generate_from_cache with the last one).
# Usage: scripts/bench-python.sh [REPS] [MODEL] [THREADS]; needs build/kvlab and the module
# (scripts/python-module.sh). Refuses a busy machine (load > 1.2) unless KVLAB_BENCH_FORCE=1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
reps=${1:-7} model=${2:-smollm2-135m} threads=${3:-2}
py="${KVLAB_CACHE:-$HOME/.cache/kvlab}/venv/bin/python"
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 1.2) }' && [ "${KVLAB_BENCH_FORCE:-0}" != 1 ]; then
  echo "[bench-python] the machine is busy (load $load > 1.2): not measuring (KVLAB_BENCH_FORCE=1 to force)" >&2
  exit 2
fi
cd /tmp
KVLAB_BIN="$root/build/kvlab" KVLAB_ROOT="$root" "$py" - "$reps" "$model" "$threads" <<'PY'
import json, os, statistics, subprocess, sys, tempfile, time
import kvlab

reps, name, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
m = kvlab.Model(name, threads=threads)
text = open(os.path.join(os.environ["KVLAB_ROOT"], "data", "haystack", "avg.txt")).read()
words = text.split(" ")
lo, hi = 1, len(words)  # the longest prefix of words that tokenizes (with BOS) to at most 512 tokens
while lo < hi:
    mid = (lo + hi + 1) // 2
    lo, hi = (mid, hi) if len(m.encode(" ".join(words[:mid]), add_special_tokens=True)) <= 512 else (lo, mid - 1)
prompt = " ".join(words[:lo])
ids = m.encode(prompt, add_special_tokens=True)
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(prompt)
cli = [os.environ["KVLAB_BIN"], "generate", m.path, "-f", f.name, "-n", "64", "--no-stop", "--json", "-t", str(threads)]

def run_cli():
    d = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)
    assert d["prompt_tokens"] == len(ids) and len(d["tokens"]) == 64, (d["prompt_tokens"], len(d["tokens"]))
    return (d["timings"]["ttft_s"] + d["timings"]["decode_s"]) * 1e3, d["tokens"]

def run_python():
    t0 = time.perf_counter()
    g = m.generate_from_cache(m.new_cache(), ids, max_tokens=64, stop_on_eos=False)
    return (time.perf_counter() - t0) * 1e3, g["ttft_ms"] + g["decode_ms"], g["output_ids"]

def run_seed():
    t0 = time.perf_counter()
    cache, _ = m.prefill(ids[:-1])
    g = m.generate_from_cache(cache, ids[-1:], max_tokens=64, stop_on_eos=False)
    return (time.perf_counter() - t0) * 1e3, g["output_ids"]

run_cli(), run_python(), run_seed()  # warm-up: page cache, compute buffers
c, p, pi, s = [], [], [], []
for _ in range(reps):
    ms, cli_tokens = run_cli()
    c.append(ms)
    wall, inner, py_tokens = run_python()
    p.append(wall), pi.append(inner)
    s.append(run_seed()[0])
    assert py_tokens == cli_tokens, "Python and the CLI generate the same tokens"
med = statistics.median
print(f"prompt {len(ids)} tokens, 64 generated, {threads} threads, {reps} reps, load {os.getloadavg()[0]:.2f}")
print(f"CLI  kvlab generate (ttft_s + decode_s)        median {med(c):8.1f} ms  {sorted(round(x) for x in c)}")
print(f"Python generate_from_cache, wall of the call   median {med(p):8.1f} ms  {sorted(round(x) for x in p)}"
      f"  ({100 * (med(p) / med(c) - 1):+.1f}% vs CLI; its own ttft+decode {med(pi):.1f} ms)")
print(f"Python prefill(511) + generate_from_cache(1)   median {med(s):8.1f} ms  {sorted(round(x) for x in s)}"
      f"  ({100 * (med(s) / med(c) - 1):+.1f}% vs CLI)")
os.unlink(f.name)
PY
