"""A compression method written in Python (docs/python.md, "Python scorers"): kvlab calls it per
layer with the keys and values, keeps the rows it scores highest and frees the rest.
Run: scripts/python.sh examples/python_scorer.py; prints e.g.
KV 21.9 -> 10.9 MiB; 'In 2001, a group of friends decided to create a new type of software that allowed end-users'"""
import pathlib

import numpy as np

import kvlab

m = kvlab.Model("smollm2-135m")
doc = (pathlib.Path(__file__).parent.parent / "data" / "haystack" / "avg.txt").read_text()[:4000]
cache, _ = m.prefill(m.chat_prompt_tokens([{"role": "user", "content": doc}], add_generation_prompt=False))
full = cache.nbytes


def knorm(layer, keys, values):  # float32 [kv_heads, rows, head_dim]
    return -np.linalg.norm(keys, axis=-1)  # [kv_heads, rows]: higher is kept


kvlab.compress(cache, knorm, ratio=0.5)
g = m.generate_from_cache(cache.copy(), m.chat_prompt_tokens([{"role": "user", "content": "Summarize it."}])[1:], max_tokens=24)
print(f"KV {full / 2**20:.1f} -> {cache.nbytes / 2**20:.1f} MiB; {g['text']!r}")
