"""Checks shared by the Python scorer tests (test_scorers.py on the default model, test_gemma3.py
on Gemma 3): the kept rows of two caches, the window attention and the hidden states a scorer gets
against NumPy."""
import numpy as np

import kvlab


def same_rows(a, b):
    assert a.lengths == b.lengths
    for layer in range(a.n_layers):
        for head in range(a.n_kv_heads):
            np.testing.assert_array_equal(a.positions(layer, head), b.positions(layer, head), f"({layer}, {head})")


def window_softmax(queries, keys, window=0):
    """NumPy's window attention [n_heads, w, rows] in float64 from the scorer's queries and keys:
    the last w rows' queries (query heads h*g .. h*g+g-1 read KV head h), causal, and on a
    sliding-window layer only the rows within `window` positions; and where it is masked."""
    heads, rows, d = keys.shape
    w = queries.shape[1]
    q = queries.reshape(heads, -1, w, d).astype(np.float64)
    logits = np.einsum("hgwd,hld->hgwl", q, keys.astype(np.float64)) / np.sqrt(d)
    at, j = np.arange(rows - w, rows)[:, None], np.arange(rows)[None, :]
    hidden = (j > at) | ((at - j >= window) if window else False)
    logits[..., hidden] = -np.inf
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True)).reshape(-1, w, rows)
    return p, np.broadcast_to(hidden, p.shape)


class AttentionCheck:
    """A scorer that asks for the queries and the attentions by name and compares the attentions
    with NumPy's softmax over the same queries and keys (in float64)."""

    def __init__(self, window_queries, sliding=None, n_swa=0):
        self.window_queries, self.sliding, self.n_swa = window_queries, sliding or set(), n_swa
        self.rel, self.layers = 0.0, []

    def score(self, layer, keys, values, queries, attentions):
        want, hidden = window_softmax(queries, keys, self.n_swa if layer in self.sliding else 0)
        assert attentions.shape == want.shape and attentions.dtype == np.float32 and attentions.flags.c_contiguous
        assert not attentions[hidden].any(), "exactly 0 where the query does not see the row"
        seen = ~hidden
        self.rel = max(self.rel, float((np.abs(attentions[seen] - want[seen]) / want[seen]).max()))
        self.layers.append(layer)
        return -np.linalg.norm(keys, axis=-1)


def value_fit(values, hidden_states):
    """How far the values are from a linear map of the hidden states: the residual of the least
    squares fit of values [kv_heads, rows, head_dim] on [hidden_states, 1], relative to the values'
    spread (0: exactly linear)."""
    rows = hidden_states.shape[0]
    x = np.concatenate([hidden_states.astype(np.float64), np.ones((rows, 1))], axis=1)
    y = values.transpose(1, 0, 2).reshape(rows, -1).astype(np.float64)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(np.linalg.norm(y - x @ coef) / np.linalg.norm(y - y.mean(axis=0)))


class HiddenStatesCheck:
    """Keeps each layer's hidden states and how linearly its values follow them, as they are and
    one row apart."""

    def __init__(self):
        self.x, self.fit, self.shifted = {}, {}, {}

    def score(self, layer, keys, values, hidden_states):
        self.x[layer] = hidden_states
        if layer > 0:  # layer 0's states are a function of the token alone: any values fit them
            self.fit[layer] = value_fit(values, hidden_states)
            self.shifted[layer] = value_fit(values, np.roll(hidden_states, 1, axis=0))
        return -np.linalg.norm(keys, axis=-1)


def check_hidden_states(cache, hidden_size):
    check = HiddenStatesCheck()
    kvlab.compress(cache.copy(), check, ratio=0.5)
    ids = np.array(cache.context)
    x0 = check.x[0]
    assert x0.shape == (len(ids), hidden_size) and x0.dtype == np.float32 and x0.flags.c_contiguous
    # layer 0's input is the token's embedding, normed: the same token gives the same bits at any
    # position, another token other values (the rows are the tokens', in order)
    assert len(np.unique(ids)) < len(ids) - 100
    assert len(np.unique(x0, axis=0)) == len(np.unique(ids))
    assert all((x0[ids == t] == x0[np.argmax(ids == t)]).all() for t in np.unique(ids))
    # every layer's values are V x (+ b) of its hidden states, row for row: the least squares
    # residual is the products' rounding (the activations quantized to 8 bits, the values stored
    # as F16; measured 0.8-2.2% of the values' spread on smollm2-135m, 0.5-1.7% on gemma3-270m,
    # over ~1,000 rows), while the states one row off leave 47-61%
    assert max(check.fit.values()) < 0.05 and min(check.shifted.values()) > 0.3, (check.fit, check.shifted)
    return check
