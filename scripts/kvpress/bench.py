#!/usr/bin/env python3
"""kvpress on torch CPU, timed the way `kvlab bench-methods` times kvlab: one context prefilled
and compressed per (method, repetition), the model loaded once, repetitions interleaved across
methods, medians reported. The same GGUF is loaded through transformers (dequantized to float32)
and the context is kvlab's own token ids (--ids, a JSON array written by the caller).

Prefill + compress = the base model's forward over the context with the press hooked in (what
kvpress's pipeline runs on a context: model.model(...), no LM head), with a fresh DynamicCache.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_press(kvpress, name, ratio):
    """kvlab's method name -> the kvpress press with kvpress's own defaults."""
    simple = {
        "streaming_llm": "StreamingLLMPress",
        "snapkv": "SnapKVPress",
        "pyramidkv": "PyramidKVPress",
        "h2o": "ObservedAttentionPress",
        "tova": "TOVAPress",
        "knorm": "KnormPress",
        "random": "RandomPress",
        "keydiff": "KeyDiffPress",
        "expected_attention": "ExpectedAttentionPress",
    }
    if name == "none":
        return None
    if name in simple:
        return getattr(kvpress, simple[name])(compression_ratio=ratio)
    base = kvpress.SnapKVPress(compression_ratio=ratio)  # kvlab's wrappers default to base snapkv
    if name == "adakv":
        return kvpress.AdaKVPress(press=base)
    if name == "criticalkv":
        return kvpress.CriticalKVPress(press=base)
    if name == "chunkkv":
        return kvpress.ChunkKVPress(press=base, chunk_length=20)
    raise SystemExit(f"bench.py: no kvpress press for method '{name}'")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--ids", required=True, help="JSON array of token ids: the context")
    ap.add_argument("--methods", default="none,streaming_llm,snapkv,pyramidkv,h2o,tova,knorm,expected_attention,adakv")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()

    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion progress bars
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(a.threads)
    ids = json.load(open(a.ids))
    input_ids = torch.tensor([ids], dtype=torch.long)
    methods = [m for m in a.methods.split(",") if m]
    t0 = time.perf_counter()
    d, f = os.path.split(os.path.abspath(a.gguf))
    models = {}
    # ObservedAttention (H2O) needs the attention weights: the eager implementation; the others
    # run transformers' default (SDPA) as kvpress recommends.
    for impl in sorted({"eager" if m == "h2o" else "sdpa" for m in methods}):
        models[impl] = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                            attn_implementation=impl).eval()
    load_s = time.perf_counter() - t0
    presses = {m: make_press(kvpress, m, a.ratio) for m in methods}

    def run(m):
        model = models["eager" if m == "h2o" else "sdpa"]
        cache = DynamicCache()
        start = time.perf_counter()
        with torch.no_grad():
            if presses[m] is None:
                model.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
            else:
                with presses[m](model):
                    model.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        return time.perf_counter() - start

    for m in methods:  # warm-up, untimed
        run(m)
    times = {m: [] for m in methods}
    for rep in range(a.reps):
        for m in methods:
            times[m].append(run(m))
            print(f"[kvpress] rep {rep + 1}/{a.reps} {m}: {times[m][-1]:.3f} s", file=sys.stderr)
    out = {
        "tool": "kvpress",
        "statistic": "median",
        "params": {"ratio": a.ratio, "threads": a.threads, "reps": a.reps, "context_tokens": len(ids)},
        "results": [{"method": m, "prefill_compress_s": statistics.median(times[m]), "reps_s": times[m]}
                    for m in methods],
        "provenance": {
            "cpu": cpu_model(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "kvpress": getattr(kvpress, "__version__", "0.5.5"),
            "python": platform.python_version(),
            "gguf": os.path.abspath(a.gguf),
            "model_load_s": load_s,
            "torch_threads": torch.get_num_threads(),
        },
    }
    if a.out:
        with open(a.out, "w") as fo:
            json.dump(out, fo, indent=2)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
