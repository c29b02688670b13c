"""kvlab from Python: prefill a document once, compress its cache, answer from copies.
Run: scripts/python.sh examples/quickstart.py (after the set-up; docs/python.md)."""
import pathlib

import kvlab

m = kvlab.Model("smollm2-135m")
doc = (pathlib.Path(__file__).parent.parent / "data" / "haystack" / "avg.txt").read_text()[:4000]
cache, t = m.prefill(m.chat_prompt_tokens([{"role": "user", "content": doc}], add_generation_prompt=False))
full = cache.nbytes
stats = kvlab.compress(cache, kvlab.KnormPress(), ratio=0.5)  # kvpress's Knorm in Python (kvlab.presses)
g = m.generate_from_cache(cache.copy(), m.chat_prompt_tokens([{"role": "user", "content": "Summarize it."}])[1:], max_tokens=32)
print(f"prefill {t['prefill_tokens']} tokens in {t['prefill_ms']:.0f} ms; KV {full / 2**20:.1f} -> {cache.nbytes / 2**20:.1f} MiB")
print(f"TTFT {g['ttft_ms']:.0f} ms: {g['text']!r}")
