"""The Python module on Gemma 3 (gemma3-270m: 15 sliding-window layers of 512 positions, 3 global
ones; its own query scale; a base model without a chat template), against the CLI: next_logits
against `kvlab generate --logprobs`, the ported presses against kvlab's C++ methods with and without
compress_sliding, and the window attention and hidden states a scorer gets against NumPy. The model
is fetched by the test set-up (scripts/setup.sh --tests, scripts/build-env.sh), as for the C++
Gemma 3 tests; the tests are skipped where it is absent."""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import kvlab
from scorer_checks import AttentionCheck, check_hidden_states, same_rows

MODELS = pathlib.Path(os.environ.get("KVLAB_MODEL_DIR", pathlib.Path.home() / ".cache" / "kvlab" / "models"))


@pytest.fixture(scope="module")
def gemma():
    if not list(MODELS.glob("gemma3-270m-*.gguf")):
        pytest.skip(f"gemma3-270m is not in {MODELS} (scripts/setup.sh --tests fetches it)")
    return kvlab.Model("gemma3-270m", threads=2)


@pytest.fixture(scope="module")
def gemma_ids(gemma, essay):
    """The essay with BOS: about 1,000 tokens, twice the sliding window."""
    return gemma.encode(essay, add_special_tokens=True)


@pytest.fixture(scope="module")
def gemma_cache(gemma, gemma_ids):
    cache, _ = gemma.prefill(gemma_ids)
    return cache


SLIDING = {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16}  # every layer but each sixth


def test_info_of_a_base_model_with_sliding_window_layers(gemma):
    info = gemma.info
    assert (info["model_type"], info["num_layers"], info["num_attention_heads"], info["num_kv_heads"]) == \
        ("gemma3", 18, 4, 1)
    assert (info["head_dim"], info["hidden_size"], info["sliding_window"]) == (256, 640, 512)
    assert info["chat_template_hash"] is None, "gemma3-270m (base) has no chat template"
    assert set(info["provenance"]["hparams"]["sliding_window"]["layers"]) == SLIDING


def log_softmax(logits):
    """The CLI's log-softmax (engine/sampling.cpp): max + log(sum(exp(double(x - max)))) in float."""
    mx = logits.max()
    return logits - np.float32(mx + np.float32(np.log(np.sum(np.exp((logits - mx).astype(np.float64))))))


def test_next_logits_equal_kvlab_generate_logprobs(gemma, gemma_ids, binary, essay):
    cli = subprocess.run([binary, "generate", gemma.path, "-p", essay, "-n", "3", "--logprobs", "5", "--json", "-t",
                          "2", "--no-stop"], capture_output=True, text=True, check=True)
    cli = json.loads(cli.stdout)
    assert cli["prompt_tokens"] == len(gemma_ids) > 1000
    # The seed's flow: every token but the last, then the last alone (the CLI's chunks are 512 and
    # the rest: the same bits at any chunk size, W_o's Q4_K included)
    cache, _ = gemma.prefill(gemma_ids[:-1])
    steps = [gemma.next_logits(cache, gemma_ids[-1:]).copy()]
    for token in cli["tokens"][:2]:  # the CLI's decode: one token at a time
        steps.append(gemma.next_logits(cache, [token]).copy())
    for logits, position, token in zip(steps, cli["logprobs"], cli["tokens"]):
        assert logits.dtype == np.float32 and logits.shape == (262144,)
        lp = log_softmax(logits)
        for top in position["top"]:
            assert float(lp[top["token"]]) == top["logprob"]  # the same bits
        assert int(np.argmax(logits)) == token
    assert cache.next_pos == len(gemma_ids) + 2 == cache.lengths[5][0]


@pytest.mark.parametrize("compress_sliding", [False, True])
def test_ported_presses_keep_the_cpp_methods_rows(gemma_cache, compress_sliding):
    presses = [(kvlab.KnormPress(), "knorm", {}), (kvlab.SnapKVPress(), "snapkv", {}),
               (kvlab.SnapKVPress(window=64, kernel=5, pooling="avg"), "snapkv",
                {"window": 64, "kernel": 5, "pooling": "avg"})]
    for press, method, params in presses:
        py, cpp = gemma_cache.copy(), gemma_cache.copy()
        stats = kvlab.compress(py, press, ratio=0.5, compress_sliding=compress_sliding)
        kvlab.compress(cpp, method, ratio=0.5, compress_sliding=compress_sliding, **params)
        same_rows(py, cpp)
        assert stats["budget"].get("sliding", False) is compress_sliding
        kept = [n for (n,) in py.lengths]
        if compress_sliding:  # the sliding layers too, inside their window
            assert max(kept[i] for i in SLIDING) < 507 and all(kept[i] == 507 for i in (5, 11, 17))
        else:  # each sliding layer keeps its window
            assert all(kept[i] == 511 for i in SLIDING)


def test_tova_press_on_sliding_window_layers(gemma_cache):
    # TOVA's scores are the last query's attention; kvlab's compresses the global layers, and each
    # sliding layer keeps its window: the same rows as the C++ method
    py, cpp = gemma_cache.copy(), gemma_cache.copy()
    kvlab.compress(py, kvlab.TOVAPress(keep_last=True), ratio=0.5, per="layer")
    kvlab.compress(cpp, "tova", ratio=0.5, keep_last=True)
    same_rows(py, cpp)
    # With compress_sliding, a scorer's attentions on a sliding layer are the model's (the rows of
    # the window only; below), kvlab's C++ tova and kvpress's TOVAPress without eager attentions
    # take the softmax over every row: the same rows on the global layers only.
    py, cpp = gemma_cache.copy(), gemma_cache.copy()
    kvlab.compress(py, kvlab.TOVAPress(keep_last=True), ratio=0.5, per="layer", compress_sliding=True)
    kvlab.compress(cpp, "tova", ratio=0.5, keep_last=True, compress_sliding=True)
    for layer in (5, 11, 17):
        np.testing.assert_array_equal(py.positions(layer, 0), cpp.positions(layer, 0))


def test_attentions_mask_the_sliding_window(gemma_cache):
    # 600 window queries: the first of them (position 414) sees rows from 0, the last rows from 502
    check = AttentionCheck(window_queries=600, sliding=SLIDING, n_swa=512)
    kvlab.compress(gemma_cache.copy(), check, ratio=0.5)
    assert check.layers == list(range(18))
    # rounded to float32 once from double, as on smollm2-135m (measured 5.96e-8 = 2**-24 relative)
    assert check.rel <= 2.0**-23, check.rel


def test_hidden_states_are_each_layers_attention_input(gemma_cache):
    check_hidden_states(gemma_cache, 640)
