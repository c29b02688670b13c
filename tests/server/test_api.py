"""`kvlab serve` with real clients: the official `openai` Python client (chat completions
streamed and not, completions, models, stop, seed, logprobs) against a stored context;
raw HTTP for the contexts API, bad requests, auth, the bounded queue, /metrics; a restart
that reloads the store; LRU drop and reload under --kv-budget with identical answers; and
the server's answer equals `kvlab ask --cache` on the same cache file.

Run: python3 tests/server/test_api.py (CTest runs it with the test venv's python).
"""
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import openai  # noqa: E402

from kvlab_server import KvlabServer, haystack, kvlab_binary, model_path  # noqa: E402

QUESTION = "What is the secret code?"


def metric(text, name):
    """The value of an unlabelled sample `name` in a Prometheus exposition."""
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


class ContextsAndOpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = KvlabServer()
        cls.s.start()
        cls.client = openai.OpenAI(base_url=cls.s.url + "/v1", api_key="unused", max_retries=0)
        st, cls.ctx, _ = cls.s.post("/v1/contexts", {"text": haystack(3000), "method": "snapkv", "ratio": 0.5,
                                                      "name": "essay"})
        assert st == 201, (st, cls.ctx)

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()

    def chat(self, **kw):
        args = dict(model="kvlab", messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=24,
                    extra_body={"context": self.ctx["id"]})
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def test_context_object(self):
        c = self.ctx
        self.assertTrue(c["id"].startswith("ctx-"))
        self.assertEqual(c["method"], "snapkv")
        self.assertEqual(c["name"], "essay")
        self.assertGreater(c["tokens"], 500)
        self.assertAlmostEqual(c["achieved_ratio"], 0.5, delta=0.01)
        self.assertLess(c["kv_bytes"], 0.51 * c["kv_bytes_full"])
        self.assertTrue(c["resident"])
        self.assertTrue(os.path.isfile(os.path.join(self.s.store, c["id"] + ".kvc")))
        st, listed, _ = self.s.get("/v1/contexts")
        self.assertEqual(st, 200)
        self.assertIn(c["id"], [x["id"] for x in listed["data"]])
        st, one, _ = self.s.get("/v1/contexts/" + c["id"])
        self.assertEqual((st, one["tokens"]), (200, c["tokens"]))
        st, err, _ = self.s.get("/v1/contexts/ctx-0000000000000000")
        self.assertEqual(st, 404)
        self.assertEqual(err["error"]["code"], "context_not_found")

    def test_chat_from_the_stored_context(self):
        r = self.chat()
        text = r.choices[0].message.content
        self.assertIn("7431", text)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, self.ctx["tokens"])
        self.assertGreater(r.usage.prompt_tokens, self.ctx["tokens"])
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        timings = r.model_extra["timings"]
        self.assertEqual(timings["context"], self.ctx["id"])
        self.assertEqual(timings["context_tokens"], self.ctx["tokens"])
        # streamed: the same tokens, delta by delta, then usage
        parts, finish, usage, last_timings = [], None, None, None
        for chunk in self.chat(stream=True, stream_options={"include_usage": True}):
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
                last_timings = (chunk.model_extra or {}).get("timings") or last_timings
            if chunk.usage:
                usage = chunk.usage
        self.assertGreater(len([p for p in parts if p]), 1)
        self.assertEqual("".join(parts), text)
        self.assertEqual(finish, "stop")
        self.assertEqual(usage.completion_tokens, r.usage.completion_tokens)
        self.assertGreater(last_timings["ttft_s"], 0)

    def test_answer_equals_kvlab_ask_on_the_same_file(self):
        text = self.chat().choices[0].message.content
        path = os.path.join(self.s.store, self.ctx["id"] + ".kvc")
        out = subprocess.run([kvlab_binary(), "ask", model_path(), "--cache", path, "-q", QUESTION, "-n", "24", "-t",
                              "1", "--json"], capture_output=True, text=True, check=True)
        self.assertEqual(json.loads(out.stdout)["answers"][0]["answer"], text)

    def test_sampling_stop_and_logprobs(self):
        a = self.chat(temperature=0.9, seed=7, max_tokens=16).choices[0].message.content
        b = self.chat(temperature=0.9, seed=7, max_tokens=16).choices[0].message.content
        self.assertEqual(a, b)
        r = self.chat(stop=["7431"])
        self.assertNotIn("7431", r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        r = self.chat(max_tokens=4, logprobs=True, top_logprobs=3)
        self.assertEqual(r.choices[0].finish_reason, "length")
        lp = r.choices[0].logprobs.content
        self.assertEqual(len(lp), r.usage.completion_tokens)
        for t in lp:
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertLessEqual(t.logprob, 0.0)
            self.assertGreaterEqual(t.top_logprobs[0].logprob, t.top_logprobs[2].logprob)
        self.assertEqual("".join(t.token for t in lp), r.choices[0].message.content)

    def test_completions_models_and_plain_chat(self):
        c = self.client.completions.create(model="kvlab", prompt="The capital of France is", max_tokens=4,
                                           temperature=0)
        self.assertEqual(c.object, "text_completion")
        self.assertEqual(c.usage.completion_tokens, 4)
        self.assertIn("Paris", c.choices[0].text)
        models = self.client.models.list()
        self.assertEqual(len(models.data), 1)
        self.assertIn("smollm2", models.data[0].id)
        r = self.client.chat.completions.create(model="kvlab", messages=[{"role": "user", "content": "Say hello."}],
                                                temperature=0, max_tokens=8)
        self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertGreater(len(r.choices[0].message.content), 0)

    def test_unknown_context_and_metrics(self):
        with self.assertRaises(openai.NotFoundError):
            self.chat(extra_body={"context": "ctx-ffffffffffffffff"})
        self.chat(max_tokens=2)
        st, text, headers = self.s.get("/metrics")
        self.assertEqual(st, 200)
        self.assertIn("text/plain", headers["Content-Type"])
        self.assertGreaterEqual(metric(text, "kvlab_kv_resident_bytes"), self.ctx["kv_bytes"])
        self.assertGreaterEqual(metric(text, "kvlab_contexts"), 1)
        self.assertGreaterEqual(metric(text, "kvlab_time_to_first_token_seconds_count"), 1)
        self.assertGreaterEqual(metric(text, "kvlab_request_errors_total"), 1)
        self.assertRegex(text, r'kvlab_requests_total\{endpoint="/v1/chat/completions",code="200"\} \d+')
        buckets = [float(v) for v in re.findall(r'^kvlab_time_to_first_token_seconds_bucket\{le="[^"]+"\} (\S+)$',
                                                 text, re.M)]
        self.assertEqual(buckets, sorted(buckets))  # cumulative
        self.assertEqual(buckets[-1], metric(text, "kvlab_time_to_first_token_seconds_count"))

    def test_zz_delete(self):
        st, c, _ = self.s.post("/v1/contexts", {"text": haystack(1200), "method": "none"})
        self.assertEqual(st, 201)
        self.assertEqual(c["achieved_ratio"], 0.0)
        st, body, _ = self.s.delete("/v1/contexts/" + c["id"])
        self.assertEqual((st, body["deleted"]), (200, True))
        self.assertFalse(os.path.exists(os.path.join(self.s.store, c["id"] + ".kvc")))
        self.assertEqual(self.s.get("/v1/contexts/" + c["id"])[0], 404)
        self.assertEqual(self.s.delete("/v1/contexts/" + c["id"])[0], 404)


class BadRequests(unittest.TestCase):
    def test_every_bad_request_gets_a_4xx_and_the_server_keeps_serving(self):
        with KvlabServer(extra=["--max-body", "200000"]) as s:
            cases = [
                ("POST", "/v1/chat/completions", b"{not json", 400, None),
                ("POST", "/v1/chat/completions", b"[1, 2]", 400, None),
                ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "pirate", "content": "x"}]}, 400,
                 "messages[0].role"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"},
                 400, "max_tokens"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 7},
                 400, "temperature"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                  "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                  "context": "../../etc/passwd"}, 404, "context"),
                ("POST", "/v1/completions", {"prompt": 5}, 400, "prompt"),
                ("POST", "/v1/contexts", {"text": "x", "method": "nosuch", "ratio": 0.5}, 400, None),
                ("POST", "/v1/contexts", {"text": "x", "method": "snapkv", "ratio": 1.5}, 400, "ratio"),
                ("POST", "/v1/contexts", {"text": "x", "method": "snapkv"}, 400, "ratio"),
                ("POST", "/v1/contexts", {"text": 3}, 400, "text"),
                ("GET", "/v1/nothing-here", None, 404, None),
            ]
            for method, path, body, status, param in cases:
                raw = body if isinstance(body, bytes) else None
                st, err, _ = s.request(method, path, None if raw else body, raw=raw)
                self.assertEqual(st, status, (path, body, err))
                self.assertIsInstance(err, dict, (path, body))
                self.assertIn("message", err["error"])
                self.assertIn("type", err["error"])
                if param:
                    self.assertEqual(err["error"]["param"], param, err)
            # larger than --max-body
            st, err, _ = s.post("/v1/chat/completions", raw=b'{"messages": "' + b"x" * 300000 + b'"}')
            self.assertEqual(st, 413)
            self.assertIn("larger than", err["error"]["message"])
            # a prompt longer than the model's context (8192 tokens)
            words = " ".join("word%d" % i for i in range(9000))
            st, err, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": words}]})
            self.assertEqual(st, 400)
            self.assertEqual(err["error"]["code"], "context_length_exceeded")
            st, err, _ = s.post("/v1/contexts", {"text": words})
            self.assertEqual((st, err["error"]["code"]), (400, "context_length_exceeded"))
            # still serving
            self.assertEqual(s.get("/health")[0], 200)
            st, r, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 2})
            self.assertEqual(st, 200, r)
            self.assertIsNone(s.proc.poll())


class Auth(unittest.TestCase):
    def test_bearer_key(self):
        with KvlabServer(extra=["--api-key", "s3cret"]) as s:
            self.assertEqual(s.get("/health")[0], 200)
            st, err, _ = s.get("/v1/models")
            self.assertEqual(st, 401)
            self.assertEqual(err["error"]["code"], "invalid_api_key")
            self.assertEqual(s.get("/v1/models", headers={"Authorization": "Bearer s3cre"})[0], 401)
            self.assertEqual(s.get("/v1/contexts", headers={"Authorization": "Basic s3cret"})[0], 401)
            self.assertEqual(s.get("/metrics", headers={"Authorization": "Bearer s3cret"})[0], 200)
            bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
            with self.assertRaises(openai.AuthenticationError):
                bad.models.list()
            good = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
            self.assertEqual(len(good.models.list().data), 1)


class StoreBudgetAndRestart(unittest.TestCase):
    def answer(self, s, ctx):
        st, r, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                                   "context": ctx, "temperature": 0, "max_tokens": 16})
        self.assertEqual(st, 200, r)
        return r["choices"][0]["message"]["content"], r["timings"]

    def test_lru_drop_reload_and_restart(self):
        # each context: ~700 tokens, half kept: about 8 MiB of rows; the budget holds one
        store = tempfile.mkdtemp(prefix="kvlab-test-store-")
        self.addCleanup(shutil.rmtree, store, True)
        with KvlabServer(store=store, extra=["--kv-budget", "12MiB"]) as s:
            st, a, _ = s.post("/v1/contexts", {"text": haystack(3000), "method": "snapkv", "ratio": 0.5})
            self.assertEqual(st, 201, a)
            a_answer, t = self.answer(s, a["id"])
            self.assertEqual(t["context_load_s"], 0.0)
            st, b, _ = s.post("/v1/contexts", {"text": haystack(3000, "The secret code is 9902."),
                                               "method": "snapkv", "ratio": 0.5})
            self.assertEqual(st, 201, b)
            listed = {x["id"]: x["resident"] for x in s.get("/v1/contexts")[1]["data"]}
            self.assertEqual(listed, {a["id"]: False, b["id"]: True})
            metrics = s.get("/metrics")[1]
            self.assertEqual(metric(metrics, "kvlab_context_drops_total"), 1)
            self.assertLessEqual(metric(metrics, "kvlab_kv_resident_bytes"), 12 * 2**20)
            again, t = self.answer(s, a["id"])  # read back from its file
            self.assertEqual(again, a_answer)
            self.assertGreater(t["context_load_s"], 0.0)
            b_answer, _ = self.answer(s, b["id"])
            self.assertIn("9902", b_answer)
            metrics = s.get("/metrics")[1]
            self.assertEqual(metric(metrics, "kvlab_context_reloads_total"), 2)
            st, err, _ = s.post("/v1/contexts", {"text": haystack(6000), "method": "none"})
            self.assertEqual((st, err["error"]["code"]), (400, "kv_budget_exceeded"))
        # a new process on the same store: both contexts are back, answers identical
        with KvlabServer(store=store) as s:
            listed = {x["id"]: x for x in s.get("/v1/contexts")[1]["data"]}
            self.assertEqual(set(listed), {a["id"], b["id"]})
            self.assertFalse(listed[a["id"]]["resident"])
            self.assertEqual(listed[a["id"]]["tokens"], a["tokens"])
            self.assertEqual(self.answer(s, a["id"])[0], a_answer)
            self.assertEqual(self.answer(s, b["id"])[0], b_answer)


class MemoryUpFront(unittest.TestCase):
    def test_a_context_too_big_for_memory_is_a_507_naming_its_bytes(self):
        with KvlabServer() as s:
            st, a, _ = s.post("/v1/contexts", {"text": haystack(3000)})
            self.assertEqual(st, 201, a)
            peak = s.vm_peak()
        # the same server with its measured peak address space + 100 MiB: that context still
        # fits; one of ~7,000 tokens (~160 MiB of F16 rows) is refused before its prefill
        with KvlabServer(address_space=peak + 100 * 2**20) as s:
            st, a, _ = s.post("/v1/contexts", {"text": haystack(3000)})
            self.assertEqual(st, 201, a)
            st, r, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                                        "context": a["id"], "temperature": 0, "max_tokens": 16})
            self.assertEqual(st, 200, r)
            st, err, _ = s.post("/v1/contexts", {"text": haystack(30000)})
            self.assertEqual(st, 507, err)
            self.assertEqual(err["error"]["code"], "insufficient_memory")
            self.assertRegex(err["error"]["message"], r"\[memory\] a KV cache of \d+ rows .* needs \d+ bytes .* "
                                                      r"are available \(ulimit -v\)")
            self.assertEqual(s.get("/health")[0], 200)


class Parallel(unittest.TestCase):
    def test_slots_and_bounded_queue(self):
        """Both slots held deterministically by streams that have sent their first token (each has
        hundreds more to go): a third request finds no slot and no queue, 503; once the streams
        are closed (cancelled), two requests at once are both served, by two engines on one model
        with the same greedy answer."""
        with KvlabServer(extra=["--parallel", "2", "--queue", "0"]) as s:
            long_body = {"messages": [{"role": "user", "content": "Write a long story about a cat."}],
                         "max_tokens": 1500, "temperature": 0, "stream": True}
            streams = []
            for _ in range(2):
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
                conn.request("POST", "/v1/chat/completions", json.dumps(long_body),
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                self.assertEqual(r.status, 200)
                line = r.readline()
                while line and b'"content"' not in line:  # until a token's chunk: the slot is taken
                    line = r.readline()
                self.assertTrue(line.startswith(b"data: "), line)
                streams.append(conn)
            self.assertEqual(s.get("/health")[1]["slots_processing"], 2)
            body = {"messages": [{"role": "user", "content": "Write a long story about a cat."}], "max_tokens": 48,
                    "temperature": 0}
            st, busy, _ = s.post("/v1/chat/completions", body)
            self.assertEqual(st, 503, busy)
            self.assertEqual(busy["error"]["code"], "server_busy")
            for conn in streams:
                conn.close()
            deadline = time.monotonic() + 30
            while s.get("/health")[1]["slots_processing"] != 0:
                self.assertLess(time.monotonic(), deadline, "the closed streams kept their slots")
                time.sleep(0.05)
            go = threading.Barrier(2)

            def one(_):
                go.wait()
                return s.post("/v1/chat/completions", body)

            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                results = list(ex.map(one, range(2)))
            self.assertEqual([r[0] for r in results], [200, 200], [r[1] for r in results])
            ok = [r[1]["choices"][0]["message"]["content"] for r in results]
            self.assertEqual(ok[0], ok[1])  # two engines, one model: the same greedy answer


if __name__ == "__main__":
    unittest.main(verbosity=2)
