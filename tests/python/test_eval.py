"""Evaluation from Python (issue 31): a task's samples as the runner makes them, and a whole
experiment run through kvlab.evaluate giving the same records as `kvlab eval` with the same
configuration (timings aside)."""
import json
import subprocess

import pytest

import kvlab

TIMINGS = {"prefill_s", "compress_s", "ttft_s", "decode_s", "decode_tokens_per_s", "peak_rss_bytes", "compress"}


def test_task_samples_are_the_runners(model):
    samples = model.task_samples("ruler_niah_single", lengths=[300], depths=[0.25, 0.75], samples=2, seed=3)
    assert len(samples) == 4
    for s in samples:
        assert s["task"] == "ruler_niah_single" and s["metric"] == "string_match_all"
        assert 0 < s["meta"]["context_tokens"] <= 300
        assert len(model.encode(s["context"])) == s["meta"]["context_tokens"]
        (q,) = s["questions"]
        assert q["answers"] and all(a in s["context"] for a in q["answers"])
    assert len({s["id"] for s in samples}) == 4
    with pytest.raises(kvlab.Error, match="unknown task"):
        model.task_samples("no_such_task")


def answers(records):
    out = {}
    for r in records:
        if r.get("kind") != "answer":
            continue
        r = {k: v for k, v in r.items() if k not in TIMINGS}
        r["sample_meta"] = {k: v for k, v in r["sample_meta"].items() if k != "haystack"}  # the same essays, elsewhere
        out[(r["sample_id"], r["question_index"], r["method"], r["budget_label"])] = r
    return out


def test_evaluate_gives_the_records_of_kvlab_eval(model, binary, tmp_path):
    experiment = {"model": model.path, "tasks": ["niah"], "lengths": [256], "depths": [0.5], "samples": 1,
                  "methods": ["knorm", {"name": "streaming_llm", "params": {"n_sink": 8}}], "budgets": [0.5],
                  "max_tokens": 8, "threads": 2}
    seen = []
    py = kvlab.evaluate(dict(experiment, out_dir=str(tmp_path / "py")),
                        progress=lambda done, total, what: seen.append((done, total)))
    assert py[0]["kind"] == "header" and py[0]["config"]["methods"][1]["params"] == {"n_sink": "8"}
    assert seen and seen[-1][0] == seen[-1][1] == 3
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(dict(experiment, out_dir=str(tmp_path / "cli"))))
    subprocess.run([binary, "eval", str(path), "--no-report"], check=True, capture_output=True)
    cli = [json.loads(line) for line in (tmp_path / "cli" / "records-0-of-1.jsonl").read_text().splitlines()]
    a, b = answers(py), answers(cli)
    assert len(a) == 3 and a == b
    # a file works as the dict does; the records are resumed, not recomputed
    again = kvlab.evaluate(str(path))
    assert answers(again) == b
    with pytest.raises(kvlab.Error, match="unknown experiment key 'no_such_key'"):
        kvlab.evaluate({"no_such_key": 1})
