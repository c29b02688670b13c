"""kvlab: prefill a context once, compress its KV cache with a chosen method, answer from copies.

The seed's backend API (Model, Cache, prefill, next_logits, generate_from_cache, generate_text,
memory_snapshot) over kvlab's C++ engine, and compress() for every registered method: the rows a
method drops are freed. kvlab errors raise kvlab.Error (a RuntimeError) with kvlab's message.
See docs/python.md.
"""
from ._kvlab import Cache, Error, Model, __version__, compress, memory_snapshot, methods, reset_peak

__all__ = ["Cache", "Error", "Model", "__version__", "compress", "memory_snapshot", "methods", "reset_peak"]
