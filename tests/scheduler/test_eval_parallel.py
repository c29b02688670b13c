"""An evaluation spread by an existing scheduler (issue 33, "Evaluations across machines"): GNU
parallel runs `kvlab eval --shard i/N` in N workers (scripts/eval-parallel.sh) and `kvlab report`
merges them; the records equal one unsharded run's, answer for answer (timings aside), and so do
the report's rows. Run by CTest (scheduler.parallel) with KVLAB_BINARY and KVLAB_SOURCE_DIR set."""
import json
import os
import pathlib
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(os.environ.get("KVLAB_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
KVLAB = os.environ.get("KVLAB_BINARY", str(ROOT / "build" / "kvlab"))
TIMINGS = {"prefill_s", "compress_s", "ttft_s", "decode_s", "decode_tokens_per_s", "peak_rss_bytes", "compress"}


def answers(directory):
    out = {}
    for f in sorted(pathlib.Path(directory).glob("records-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "answer":
                continue
            key = (r["sample_id"], r["question_index"], r["method"], r["budget_label"])
            assert key not in out, "answered twice: %s" % (key,)
            out[key] = {k: v for k, v in r.items() if k not in TIMINGS}
    return out


def summary_rows(directory):
    """The summary's quality columns (method, budget, ratio, n, scores, KL, top-1, identical)."""
    rows = []
    for line in (pathlib.Path(directory) / "summary.md").read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| method") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip("|").split("|")][:10])
    return rows


class EvalUnderGnuParallel(unittest.TestCase):
    def test_shards_merged_equal_one_run(self):
        with tempfile.TemporaryDirectory(prefix="kvlab-parallel-") as tmp:
            experiment = {"model": "smollm2-135m", "tasks": ["niah", "ruler_niah_single"], "lengths": [256],
                          "depths": [0.2, 0.8], "samples": 1, "methods": ["knorm", "streaming_llm"],
                          "budgets": [0.5], "max_tokens": 6}
            path = os.path.join(tmp, "experiment.json")
            with open(path, "w") as f:
                json.dump(experiment, f)
            one, spread = os.path.join(tmp, "one"), os.path.join(tmp, "spread")
            subprocess.run([KVLAB, "eval", path, "-t", "2", "-o", one], check=True, capture_output=True)
            env = dict(os.environ, KVLAB_BINARY=KVLAB)
            run = subprocess.run(["bash", str(ROOT / "scripts" / "eval-parallel.sh"), "-j", "3", "-o", spread, path],
                                 capture_output=True, text=True, env=env)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(sorted(p.name for p in pathlib.Path(spread).glob("records-*.jsonl")),
                             ["records-0-of-3.jsonl", "records-1-of-3.jsonl", "records-2-of-3.jsonl"])
            a, b = answers(one), answers(spread)
            self.assertEqual(len(a), 4 * 3)  # 4 samples x (full cache + 2 methods)
            self.assertEqual(a, b)
            self.assertEqual(summary_rows(one), summary_rows(spread))
            # a rerun resumes: nothing is answered twice and nothing changes
            again = subprocess.run(["bash", str(ROOT / "scripts" / "eval-parallel.sh"), "-j", "3", "-o", spread, path],
                                   capture_output=True, text=True, env=env)
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertEqual(answers(spread), b)


if __name__ == "__main__":
    unittest.main(verbosity=2)
