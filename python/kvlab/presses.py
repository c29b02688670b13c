"""Three of kvpress's presses as kvlab Python scorers (docs/python.md, "Python scorers").

A scorer is called once per layer as score(layer, keys, values, ...) with float32 NumPy arrays
keys and values [kv_heads, rows, head_dim] and, for the parameters it names (kvpress's names),
the prefill's
  queries        [n_heads, window, head_dim]: the last `window` context tokens' queries, post-RoPE,
                 scaled so that q . k / sqrt(head_dim) is the model's attention logit;
  attentions     [n_heads, window, rows]: those queries' attention weights over the rows, softmax
                 with the causal mask (and a sliding-window layer's window), per query head;
  hidden_states  [rows, hidden_size]: every context token's input to the layer's attention.
The window is the scorer's `window_queries` attribute, else its `window`. It returns scores
[kv_heads, rows] (or [rows] for every head); higher is kept first. kvlab.compress(cache, scorer,
ratio=...) keeps the top rows under the budget and frees the rest. Each press here keeps exactly
the rows of kvlab's C++ method of the same name (tests/python/test_scorers.py, test_gemma3.py).
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["KnormPress", "SnapKVPress", "TOVAPress"]


class KnormPress:
    """kvpress's KnormPress (kvlab's `knorm`): keeps the keys with the lowest L2 norm."""

    def score(self, layer, keys, values):
        return -np.linalg.norm(keys.astype(np.float64), axis=-1)


class SnapKVPress:
    """SnapKV (kvlab's `snapkv`, src/press/methods/snapkv.cpp; docs/methods.md, "Shared scorer").

    The attention of the last `window` context queries, softmax over the rows each sees (causal
    inside the window), summed over the window rows, averaged over each KV head's group of query
    heads, then pooled along the rows (`pooling` "max", "avg" or "none", odd `kernel`). The window's
    own rows are always kept (kvlab.compress reads the `window` attribute). kvpress's SnapKVPress
    is SnapKVPress(window=64, kernel=5, pooling="avg") (it averages over the window: the same
    ranking).
    """

    wants_queries = True  # the prefill's queries of the last `window` tokens

    def __init__(self, window=32, kernel=7, pooling="max"):
        if kernel < 1 or kernel % 2 == 0 or pooling not in ("max", "avg", "none"):
            raise ValueError("kernel is a positive odd number, pooling max, avg or none")
        self.window, self.kernel, self.pooling = window, kernel, pooling

    def score(self, layer, keys, values, queries):
        heads, rows, d = keys.shape
        w = queries.shape[1]
        q = queries.reshape(heads, -1, w, d).astype(np.float64)  # query heads h*g .. h*g+g-1 read KV head h
        logits = np.einsum("hgwd,hld->hgwl", q, keys.astype(np.float64)) / np.sqrt(d)
        logits[..., np.arange(rows)[None, :] > np.arange(rows - w, rows)[:, None]] = -np.inf
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        s = _pool(p[..., : rows - w].sum(axis=2).mean(axis=1), self.kernel, self.pooling)
        return np.concatenate([s, np.zeros((heads, w))], axis=1)  # the window's scores are ignored


class TOVAPress:
    """TOVA (kvlab's `tova`, src/press/methods/tova.cpp): the attention weights of the context's
    last token over the rows, averaged over the layer's query heads; one row set per layer
    (compress it with per="layer"). From the prefill's `attentions` (window_queries = 1).

    keep_last=True keeps the last context token whatever its score (kvlab's `tova keep_last=true`,
    kvpress's TOVAPress, which pads the last row with the highest score); False, TOVA's rule and
    kvlab's default, ranks it as any other row.
    """

    window_queries = 1  # the attentions of the last context token

    def __init__(self, keep_last=False):
        self.keep_last = keep_last
        self.window = 1 if keep_last else 0  # the rows always kept (kvlab.compress reads it)

    def score(self, layer, keys, values, attentions):
        return attentions[:, -1, :].astype(np.float64).mean(axis=0)  # [rows]: one score per row, every head


def _pool(x, kernel, pooling):
    """Pooling along the rows, stride 1, padding kernel // 2 (max pads -inf, avg divides by kernel)."""
    if pooling == "none" or kernel <= 1 or x.shape[-1] == 0:
        return x
    pad = ((0, 0), (kernel // 2, kernel // 2))
    if pooling == "max":
        return sliding_window_view(np.pad(x, pad, constant_values=-np.inf), kernel, axis=-1).max(axis=-1)
    return sliding_window_view(np.pad(x, pad), kernel, axis=-1).sum(axis=-1) / kernel
