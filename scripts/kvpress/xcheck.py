#!/usr/bin/env python3
"""Kept rows of kvpress's presses against kvlab's plans on the same GGUF and token ids: per
(method, ratio) the mean and minimum Jaccard similarity over (layer, KV head) of the kept row
sets. kvpress's kept rows are its ScorerPress rule: the top int(L * (1 - cr)) scores of each
KV head, captured from press.score; kvlab's come from `kvlab bench-methods --dump-plans`.
Only ScorerPress methods are compared (their selection is that one rule)."""
import argparse
import json
import os
import platform
import sys

KVPRESS = {
    "knorm": "KnormPress",
    "snapkv": "SnapKVPress",
    "tova": "TOVAPress",
    "h2o": "ObservedAttentionPress",
    "expected_attention": "ExpectedAttentionPress",
    "keydiff": "KeyDiffPress",
    "streaming_llm": "StreamingLLMPress",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--plans", required=True, help="kvlab's --dump-plans directory")
    ap.add_argument("--ratio", type=float, required=True)
    ap.add_argument("--methods", default=",".join(KVPRESS))
    ap.add_argument("--label", default="kvlab defaults")
    a = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    ids = torch.tensor([json.load(open(a.ids))], dtype=torch.long)
    L = ids.shape[1]
    d, f = os.path.split(os.path.abspath(a.gguf))
    models = {}

    def model_for(m):
        impl = "eager" if m == "h2o" else "sdpa"
        if impl not in models:
            models[impl] = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                                attn_implementation=impl).eval()
        return models[impl]

    rows = []
    for m in [x for x in a.methods.split(",") if x]:
        plan_path = os.path.join(a.plans, m + ".json")
        if m not in KVPRESS or not os.path.exists(plan_path):
            continue
        press = getattr(kvpress, KVPRESS[m])(compression_ratio=a.ratio)
        captured = {}
        original = press.score

        def score(module, *args, _orig=original, _cap=captured):
            s = _orig(module, *args)
            _cap[module.layer_idx] = s.detach().float().clone()
            return s

        press.score = score
        model = model_for(m)
        with torch.no_grad(), press(model):
            model.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
        n_kept = int(L * (1 - a.ratio))
        plan = json.load(open(plan_path))
        js = []
        for il in sorted(captured):
            s = captured[il][0]  # [H_kv, L]
            for h in range(s.shape[0]):
                ref = set(s[h].topk(n_kept).indices.tolist())
                got = set(plan["kept"][il][h])
                js.append(len(ref & got) / max(1, len(ref | got)))
        rows.append({"method": m, "kvlab_params": plan["params"], "ratio": a.ratio, "n_kept_kvpress": n_kept,
                     "n_kept_kvlab": len(plan["kept"][0][0]), "mean_jaccard": sum(js) / len(js), "min_jaccard": min(js),
                     "n_segments": len(js)})
        print(f"[xcheck] {a.label}: {m} ratio {a.ratio}: mean J {rows[-1]['mean_jaccard']:.3f}, "
              f"min {rows[-1]['min_jaccard']:.3f}", file=sys.stderr)
    json.dump({"label": a.label, "ratio": a.ratio, "context_tokens": L, "rows": rows,
               "provenance": {"torch": torch.__version__, "kvpress": "0.5.5", "gguf": os.path.abspath(a.gguf),
                              "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                           if l.startswith("model name")), platform.processor())}},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
