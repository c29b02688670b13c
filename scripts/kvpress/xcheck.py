#!/usr/bin/env python3
"""Kept rows of kvpress's presses against kvlab's plans on the same GGUF and token ids: per
(method, ratio) the mean and minimum Jaccard similarity over (layer, KV head) of the kept row
sets. kvpress's kept rows are its ScorerPress rule: the top n_kept scores of each KV head,
captured from press.score, with n_kept = int(L * (1 - cr)) (PyramidKV: its own
get_layer_budget per layer); kvlab's come from `kvlab bench-methods --dump-plans`. Only
presses whose selection is that rule are compared (CriticalKV wraps SnapKVPress)."""
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
    "pyramidkv": "PyramidKVPress",
    "criticalkv": "CriticalKVPress",
    "adakv": "AdaKVPress",
    "chunkkv": "ChunkKVPress",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--plans", required=True, help="kvlab's --dump-plans directory")
    ap.add_argument("--ratio", type=float, required=True)
    ap.add_argument("--methods", default=",".join(KVPRESS))
    ap.add_argument("--label", default="kvlab defaults")
    ap.add_argument("--kv-f16", action="store_true",
                    help="round the keys and values the cache stores to float16, as kvlab's (and llama.cpp's) KV rows")
    a = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache

    if a.kv_f16:  # every row the cache stores (and attention and the presses read) rounded to F16
        from transformers import cache_utils
        update = cache_utils.DynamicLayer.update

        def update_f16(self, key_states, value_states, *args, **kwargs):
            return update(self, key_states.half().float(), value_states.half().float(), *args, **kwargs)

        cache_utils.DynamicLayer.update = update_f16

    ids = torch.tensor([json.load(open(a.ids))], dtype=torch.long)
    L = ids.shape[1]
    d, f = os.path.split(os.path.abspath(a.gguf))
    models = {}

    def model_for(m):
        impl = "eager" if m == "h2o" else "sdpa"
        if impl not in models:
            models[impl] = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                                attn_implementation=impl).eval()
            cfg = models[impl].config  # CriticalKVPress reads config.head_dim, which Qwen2Config lacks
            if getattr(cfg, "head_dim", None) is None:
                cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        return models[impl]

    rows = []
    for m in [x for x in a.methods.split(",") if x]:
        plan_path = os.path.join(a.plans, m + ".json")
        if m not in KVPRESS or not os.path.exists(plan_path):
            continue
        if m == "criticalkv":
            press = kvpress.CriticalKVPress(press=kvpress.SnapKVPress(compression_ratio=a.ratio))
        elif m in ("adakv", "chunkkv"):
            press = getattr(kvpress, KVPRESS[m])(press=kvpress.SnapKVPress(compression_ratio=a.ratio))
        else:
            press = getattr(kvpress, KVPRESS[m])(compression_ratio=a.ratio)
        budgets = {}
        captured = {}
        original = press.press.score if m in ("adakv", "chunkkv") else press.score

        def score(module, *args, _orig=original, _cap=captured, _press=press, _budgets=budgets):
            s = _orig(module, *args)
            _cap[module.layer_idx] = s.detach().float().clone()
            if hasattr(_press, "get_layer_budget"):
                _budgets[module.layer_idx] = _press.get_layer_budget(module, s.shape[-1])
            return s

        masked = {}
        if m == "adakv":  # its selection is its own: the rows it masks, per (layer, head)
            compress = press.compress

            def masking(module, *args, _orig=compress, _masked=masked):
                out = _orig(module, *args)
                _, heads, seqs = module.masked_key_indices
                _masked[module.layer_idx] = list(zip(heads.tolist(), seqs.tolist()))
                return out

            press.compress = masking
            press.press.score = score
        elif m == "chunkkv":  # it gathers whole chunks: the kept rows are found by their key vectors
            compress = press.compress

            def gathering(module, hidden_states, keys, values, *args, _orig=compress, _masked=masked):
                out_k, out_v = _orig(module, hidden_states, keys, values, *args)
                where = {keys[0, 0, j].numpy().tobytes(): j for j in range(keys.shape[2])}
                kept = {where[out_k[0, 0, i].numpy().tobytes()] for i in range(out_k.shape[2])}
                _masked[module.layer_idx] = [(h, j) for h in range(keys.shape[1]) for j in range(keys.shape[2])
                                             if j not in kept]
                return out_k, out_v

            press.compress = gathering
            press.press.score = score
        else:
            press.score = score
        model = model_for(m)
        try:
            with torch.no_grad(), press(model):
                model.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
        except Exception as e:  # kvpress's own limits: recorded, the other presses still run
            rows.append({"method": m, "ratio": a.ratio, "error": f"kvpress: {type(e).__name__}: {e}"})
            print(f"[xcheck] {a.label}: {m} ratio {a.ratio}: kvpress failed: {e}", file=sys.stderr)
            continue
        n_kept = int(L * (1 - a.ratio))
        plan = json.load(open(plan_path))
        js, rhos = [], []
        free = None
        if "scores" in plan:  # the rows both rank by score: those kvlab does not keep regardless
            free = torch.tensor([not f for f in plan["forced"]])
        for il in sorted(captured):
            s = captured[il][0]  # [H_kv, L]
            for h in range(s.shape[0]):
                if il in masked:
                    ref = set(range(L)) - {j for hh, j in masked[il] if hh == h}
                else:
                    ref = set(s[h].topk(budgets.get(il, n_kept)).indices.tolist())
                got = set(plan["kept"][il][h])
                js.append(len(ref & got) / max(1, len(ref | got)))
                if free is not None:
                    a_s, b_s = s[h][free].double(), torch.tensor(plan["scores"][il][h], dtype=torch.float64)[free]
                    ra, rb = a_s.argsort().argsort().double(), b_s.argsort().argsort().double()
                    ra, rb = ra - ra.mean(), rb - rb.mean()
                    rhos.append(float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-300)))
        rows.append({"method": m, "kvlab_params": plan["params"], "ratio": a.ratio, "n_kept_kvpress": n_kept,
                     "n_kept_kvlab": sum(len(x) for x in plan["kept"][0]) // len(plan["kept"][0]), "mean_jaccard": sum(js) / len(js), "min_jaccard": min(js),
                     "mean_spearman": sum(rhos) / len(rhos) if rhos else None,
                     "min_spearman": min(rhos) if rhos else None,
                     "n_segments": len(js)})
        print(f"[xcheck] {a.label}: {m} ratio {a.ratio}: mean J {rows[-1]['mean_jaccard']:.3f}, "
              f"min {rows[-1]['min_jaccard']:.3f}" + (f"; score Spearman mean {rows[-1]['mean_spearman']:.4f}, "
                                                  f"min {rows[-1]['min_spearman']:.4f}" if rhos else ""), file=sys.stderr)
    json.dump({"label": a.label, "ratio": a.ratio, "context_tokens": L, "rows": rows, "kvpress_kv_f16": a.kv_f16,
               "provenance": {"torch": torch.__version__, "kvpress": "0.5.5", "gguf": os.path.abspath(a.gguf),
                              "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                           if l.startswith("model name")), platform.processor())}},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
