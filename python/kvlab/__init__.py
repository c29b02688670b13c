"""kvlab: prefill a context once, compress its KV cache with a chosen method, answer from copies.

The seed's backend API (Model, Cache, prefill, next_logits, generate_from_cache, generate_text,
memory_snapshot) over kvlab's C++ engine, and compress() for every registered method or a Python
scorer (kvlab.presses: KnormPress, SnapKVPress, TOVAPress): the rows it drops are freed. kvlab
errors raise kvlab.Error (a RuntimeError) with kvlab's message. evaluate() runs a `kvlab eval`
experiment and returns its records as dicts. See docs/python.md.
"""
from . import presses
from ._kvlab import Cache, Error, Model, __version__, compress, evaluate, memory_snapshot, methods, reset_peak
from .presses import KnormPress, SnapKVPress, TOVAPress

__all__ = ["Cache", "Error", "KnormPress", "Model", "SnapKVPress", "TOVAPress", "__version__", "compress",
           "evaluate", "memory_snapshot", "methods", "presses", "reset_peak"]
