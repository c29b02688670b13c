"""The seed's backend API on kvlab's engine (issue: `import kvlab`): the whole flow on the
default model against the CLI (next_logits against `kvlab generate --logprobs`, generation
against `kvlab generate`, every method's kept rows against `kvlab compress`), copies, bytes,
and kvlab errors as Python exceptions."""
import json
import re
import subprocess

import numpy as np
import pytest

import kvlab


def run_json(*args):
    out = subprocess.run(list(args), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_info_has_the_seeds_fields_from_the_gguf(model):
    info = model.info
    assert (info["model_type"], info["num_layers"], info["num_attention_heads"], info["num_kv_heads"]) == \
        ("llama", 30, 9, 3)
    assert (info["head_dim"], info["hidden_size"], info["vocab_size"], info["max_position_embeddings"]) == \
        (64, 576, 49152, 8192)
    assert info["rope_theta"] == 100000.0 and info["rope_scaling"] is None and info["sliding_window"] is None
    for key in ("tokenizer_hash", "chat_template_hash", "config_hash"):
        assert re.fullmatch(r"[0-9a-f]{64}", info[key]), key
    (name, sha), = info["weight_files_sha256"].items()
    assert name.endswith(".gguf") and sha == info["provenance"]["model"]["sha256"]
    assert info["bos_token_id"] == 1 and 2 in info["eos_token_ids"]
    assert info["weight_dtype"] == "q4_1" and model.load_ms > 0
    assert info["kvlab_version"] == kvlab.__version__


def test_tokenization_and_chat_template(model):
    ids = model.encode("The capital of France is")
    assert model.decode(ids) == "The capital of France is"
    chat = model.chat_prompt_tokens([{"role": "user", "content": "Hello"}])
    assert chat[:2] != [model.info["bos_token_id"]] * 2, "one BOS" 
    assert model.decode(chat).endswith("assistant\n")
    without = model.chat_prompt_tokens([{"role": "user", "content": "Hello"}], add_generation_prompt=False)
    assert len(without) < len(chat) and chat[: len(without)] == without


def test_seed_flow_against_the_cli(model, binary, essay):
    ids = model.encode(essay, add_special_tokens=True)
    cache, t = model.prefill(ids[:-1])
    assert t["prefill_tokens"] == len(ids) - 1 and t["prefill_ms"] > 0
    assert cache.context == ids[:-1] and cache.next_pos == len(ids) - 1
    # next_logits on a copy: the log-softmax equals kvlab generate's log-probabilities on the same ids
    logits = model.next_logits(cache.copy(), ids[-1:])
    assert logits.dtype == np.float32 and logits.shape == (49152,)
    cli = run_json(binary, "generate", model.path, "-p", essay, "-n", "8", "--logprobs", "5", "--json", "-t", "2")
    assert cli["prompt_tokens"] == len(ids)
    # the CLI's log-softmax (engine/sampling.cpp): max + log(sum(exp(double(x - max)))) rounded to float;
    # the logits are the same bits (kvlab's prefill gives the same at any chunking): equal, exactly
    mx = logits.max()
    lse = np.float32(mx + np.float32(np.log(np.sum(np.exp((logits - mx).astype(np.float64))))))
    for top in cli["logprobs"][0]["top"]:
        assert float(np.float32(logits[top["token"]] - lse)) == top["logprob"]
    assert int(np.argmax(logits)) == cli["tokens"][0]
    # generation from the cache (a copy: the cache stays as it was) equals kvlab generate's
    before = (cache.lengths, cache.next_pos, cache.nbytes)
    g = model.generate_from_cache(cache.copy(), ids[-1:], max_tokens=8, stop_on_eos=False)
    assert (cache.lengths, cache.next_pos, cache.nbytes) == before
    assert g["output_ids"] == cli["tokens"] and g["text"] == cli["text"]
    for key in ("text", "output_ids", "output_tokens", "ttft_ms", "sequential_query_prefill", "query_prefill_ms",
                "decode_ms", "query_tokens"):
        assert key in g, key
    assert g["output_tokens"] == 8 and g["query_tokens"] == 1 and g["ttft_ms"] > 0
    full = model.generate_text(ids, max_tokens=8, stop_on_eos=False)
    assert full["output_ids"] == cli["tokens"] and full["prefill_tokens"] == len(ids) - 1


def test_copies_are_independent_and_bytes_are_the_rows(model, essay):
    cache, _ = model.prefill(model.encode(essay))
    copy = cache.copy()
    model.generate_from_cache(copy, model.encode(" And"), max_tokens=4)
    assert copy.next_pos > cache.next_pos
    assert cache.lengths == [[len(cache.context)] * 3] * 30
    row_bytes = 2 * 64 * 2  # K and V at F16, head_dim 64
    assert cache.used_bytes == 30 * 3 * len(cache.context) * row_bytes
    assert cache.nbytes >= cache.used_bytes
    np.testing.assert_array_equal(cache.positions(0, 0), np.arange(len(cache.context), dtype=np.int32))


def test_generate_batch_answers_each_question_as_alone(model, essay):
    cache, _ = model.prefill(model.encode(essay))
    small = cache.copy()
    kvlab.compress(small, "knorm", ratio=0.5)
    questions = [" Question: what is it about?", " In short,", " The author", " Why?"]
    caches = [(cache if i % 2 == 0 else small).copy() for i in range(len(questions))]
    alone = [model.generate_from_cache(c.copy(), model.encode(q), max_tokens=12, stop_on_eos=False,
                                       temp=0.7 if i == 3 else 0.0, seed=5)
             for i, (c, q) in enumerate(zip(caches, questions))]
    together = model.generate_batch(caches[:3], [model.encode(q) for q in questions[:3]], max_tokens=12,
                                    stop_on_eos=False, chunk=4)
    for got, want in zip(together, alone[:3]):
        assert got["output_ids"] == want["output_ids"]
        assert got["text"] == want["text"]
        assert got["decode_tokens"] == 11 and got["stop_reason"] == "max_tokens"
    sampled = model.generate_batch([caches[3]], [model.encode(questions[3])], max_tokens=12, stop_on_eos=False,
                                   temp=0.7, seed=5)
    assert sampled[0]["output_ids"] == alone[3]["output_ids"]
    with pytest.raises(kvlab.Error, match="twice"):
        model.generate_batch([caches[0], caches[0]], [[1], [2]])
    with pytest.raises(kvlab.Error, match="one query per cache"):
        model.generate_batch([caches[0]], [[1], [2]])


def methods_to_compare():
    return [m["name"] for m in kvlab.methods()]


@pytest.mark.parametrize("method", methods_to_compare())
def test_every_method_keeps_the_rows_kvlab_compress_keeps(model, binary, essay, method, tmp_path):
    context = tmp_path / "essay.txt"
    context.write_text(essay)
    out = tmp_path / "c.kvc"
    made = subprocess.run([binary, "compress", model.path, "--context-file", str(context), "--method", method,
                           "--ratio", "0.5", "-o", str(out), "-t", "2"], capture_output=True, text=True)
    if method == "kvzap" and "train-scorer" in made.stderr:
        pytest.skip("no KVzap scorer for the default model here (kvlab train-scorer smollm2-135m)")
    assert made.returncode == 0, made.stderr
    ref = model.load_cache(str(out))
    cache, _ = model.prefill(ref.context)
    before = cache.nbytes
    stats = kvlab.compress(cache, method, ratio=0.5)
    assert stats["method"] == method
    assert cache.lengths == ref.lengths
    for layer in range(30):
        for head in range(3):
            np.testing.assert_array_equal(cache.positions(layer, head), ref.positions(layer, head))
    assert cache.nbytes < before, "the dropped rows are freed"


def test_compress_parameters_and_budgets(model, essay):
    cache, _ = model.prefill(model.encode(essay))
    n = len(cache.context)
    stats = kvlab.compress(cache, "streaming_llm", budget=100, n_sink=8)
    assert int(stats["params"]["n_sink"]) == 8 and stats["reprefilled"] is False
    assert cache.lengths == [[100] * 3] * 30
    np.testing.assert_array_equal(cache.positions(3, 1)[:8], np.arange(8, dtype=np.int32))
    assert cache.positions(3, 1)[-1] == n - 1
    cache2, _ = model.prefill(model.encode(essay))
    full = cache2.used_bytes
    st = kvlab.compress(cache2, "snapkv", kv_bytes=full // 4)
    assert st["reprefilled"] is True
    assert 0.2 * full < cache2.used_bytes <= full // 4


def test_errors_are_kvlab_errors_with_kvlabs_message(model, essay):
    with pytest.raises(kvlab.Error, match="no-such-model"):
        kvlab.Model("no-such-model")
    cache, _ = model.prefill(model.encode(essay))
    with pytest.raises(kvlab.Error, match="unknown method"):
        kvlab.compress(cache, "no_such_method", ratio=0.5)
    with pytest.raises(kvlab.Error, match="ratio"):
        kvlab.compress(cache, "knorm", ratio=1.5)
    with pytest.raises(kvlab.Error, match="exactly one"):
        kvlab.compress(cache, "knorm", ratio=0.5, budget=10)
    with pytest.raises(kvlab.Error, match="unknown parameter|no parameter"):
        kvlab.compress(cache, "knorm", ratio=0.5, no_such_param=1)
    with pytest.raises(kvlab.Error, match="outside the vocabulary"):
        model.next_logits(cache, [49152])
    with pytest.raises(kvlab.Error, match="outside the vocabulary"):
        model.prefill([-1])
    generated = cache.copy()
    model.generate_from_cache(generated, model.encode(" So"), max_tokens=2)
    with pytest.raises(kvlab.Error, match="plain prefill"):
        kvlab.compress(generated, "snapkv", ratio=0.5)
    assert isinstance(kvlab.Error("x"), RuntimeError)


def test_memory_snapshot(model):
    snap = model.memory_snapshot()
    assert snap["weights_bytes"] > 90e6 and snap["process_rss_bytes"] > snap["weights_bytes"] / 2
    assert set(kvlab.memory_snapshot()) == {"process_rss_bytes", "process_peak_rss_bytes"}
