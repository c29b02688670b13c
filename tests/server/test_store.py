"""Two real `kvlab serve` replicas sharing a real Redis (`--store redis://...`): a context made
on one is answered on the other with identical tokens; the same context asked of both at once is
made once; a replica killed while making a context leaves nothing the other would serve; corrupt,
foreign and evicted entries are refused, never served; Redis stopped mid-run gives 503s for what
needs it while resident contexts keep answering, and the replicas recover when it is back;
automatic prefix reuse across replicas; the official `openai` client drives the answers. And the
content address on a folder store: the same context asked twice is made once.

Run: python3 tests/server/test_store.py (CTest runs it with the test venv's python).
"""
import concurrent.futures
import os
import re
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import openai  # noqa: E402

from kvlab_server import KvlabServer, haystack  # noqa: E402
from redis_server import RedisServer  # noqa: E402

QUESTION = "What is the secret code?"
LOCK_TTL_S = 10  # src/server/redis_backend.cpp: k_lock_ttl_ms


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def answer(server, ctx_id, max_tokens=16):
    """(text, output token ids via logprobs, timings) through the official openai client."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="kvlab", messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=max_tokens, logprobs=True,
                                       extra_body={"context": ctx_id})
    tokens = [t.token for t in r.choices[0].logprobs.content]
    return r.choices[0].message.content, tokens, r.model_extra["timings"]


class Replicas(unittest.TestCase):
    def test_a_context_made_on_one_replica_is_answered_on_the_other(self):
        with RedisServer() as r, KvlabServer(store=r.url) as a, KvlabServer(store=r.url) as b:
            body = {"text": haystack(3000), "method": "snapkv", "ratio": 0.5, "name": "essay"}
            st, made, _ = a.post("/v1/contexts", body)
            self.assertEqual(st, 201, made)
            self.assertFalse(made["reused"])
            self.assertEqual(r.context_keys(), ["kvlab:ctx:" + made["id"]])
            # B knows it without being told (listing, describing), and does not make it again
            self.assertIn(made["id"], [x["id"] for x in b.get("/v1/contexts")[1]["data"]])
            st, desc, _ = b.get("/v1/contexts/" + made["id"])
            self.assertEqual((st, desc["resident"], desc["tokens"]), (200, False, made["tokens"]))
            st, again, _ = b.post("/v1/contexts", body)
            self.assertEqual((st, again["id"], again["reused"]), (200, made["id"], True))
            self.assertEqual(again["file_bytes"], made["file_bytes"])
            a_text, a_tokens, a_t = answer(a, made["id"])
            b_text, b_tokens, b_t = answer(b, made["id"])
            self.assertEqual(a_t["context_load_s"], 0.0)  # resident on A
            self.assertGreater(b_t["context_load_s"], 0.0)  # read from Redis on B
            self.assertEqual((b_text, b_tokens), (a_text, a_tokens))
            self.assertIn("7431", b_text)
            mb = b.get("/metrics")[1]
            self.assertEqual(metric(mb, "kvlab_store_writes_total"), 0)
            self.assertEqual(metric(mb, "kvlab_store_misses_total"), 0)
            self.assertEqual(metric(mb, "kvlab_store_hits_total"), 2)  # the reused making, the rows read
            self.assertEqual(metric(mb, "kvlab_store_read_bytes_total"), made["file_bytes"])
            ma = a.get("/metrics")[1]
            self.assertEqual((metric(ma, "kvlab_store_writes_total"), metric(ma, "kvlab_store_misses_total")), (1, 1))
            self.assertGreater(metric(ma, "kvlab_store_written_bytes_total"), made["file_bytes"])
            # deleted on B: gone from A too (A's resident rows with it)
            self.assertEqual(b.delete("/v1/contexts/" + made["id"])[0], 200)
            self.assertEqual(r.context_keys(), [])
            self.assertEqual(a.get("/v1/contexts/" + made["id"])[0], 404)
            st, err, _ = a.post("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                                         "context": made["id"], "max_tokens": 4})
            self.assertEqual((st, err["error"]["code"]), (404, "context_not_found"))
        # a restarted replica finds the contexts in Redis
        with RedisServer() as r:
            with KvlabServer(store=r.url) as a:
                st, made, _ = a.post("/v1/contexts", {"text": haystack(1500), "method": "none"})
                first = answer(a, made["id"])[:2]
            with KvlabServer(store=r.url) as a:
                self.assertEqual([x["id"] for x in a.get("/v1/contexts")[1]["data"]], [made["id"]])
                self.assertEqual(answer(a, made["id"])[:2], first)

    def test_the_same_context_asked_of_both_at_once_is_made_once(self):
        with RedisServer() as r, KvlabServer(store=r.url) as a, KvlabServer(store=r.url) as b:
            body = {"text": haystack(3000), "method": "knorm", "ratio": 0.5}
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda s: s.post("/v1/contexts", body), [a, b, a, b]))
            self.assertEqual({st for st, _, _ in got}, {200, 201}, got)
            self.assertEqual(len({c["id"] for _, c, _ in got}), 1)
            self.assertEqual(sorted(c["reused"] for _, c, _ in got), [False, True, True, True])
            self.assertEqual(len(r.context_keys()), 1)
            writes = sum(metric(s.get("/metrics")[1], "kvlab_store_writes_total") for s in (a, b))
            self.assertEqual(writes, 1)

    def test_a_replica_killed_while_making_a_context_leaves_nothing_served(self):
        with RedisServer() as r, KvlabServer(store=r.url) as b:
            a = KvlabServer(store=r.url, threads=1)
            a.start()
            body = {"text": haystack(12000), "method": "kvzip", "ratio": 0.5}  # several seconds of work

            def make():
                try:
                    a.post("/v1/contexts", body)
                except OSError:  # the connection dies with A
                    pass

            threading.Thread(target=make, daemon=True).start()
            deadline = time.time() + 60
            while not r.cli("KEYS", "kvlab:lock:*") and time.time() < deadline:
                time.sleep(0.02)
            self.assertTrue(r.cli("KEYS", "kvlab:lock:*"), "A never began making the context")
            time.sleep(0.5)
            a.proc.kill()  # SIGKILL mid-making: nothing cleans up
            a.stop()
            self.assertEqual(r.context_keys(), [])
            self.assertEqual(b.get("/v1/contexts")[1]["data"], [])
            # B asked for the same context waits for A's lock to lapse (10 s), then makes it: what B
            # spent not making it (prefill, compression, saving: its own timings) is the lapse, not
            # the 600 s B would wait for a live maker. The 20 s margin is tokenizing and the 200 ms
            # polls; the making itself takes minutes under sanitizers, so it is not bounded here.
            t0 = time.time()
            st, made, _ = b.post("/v1/contexts", body)
            elapsed = time.time() - t0
            self.assertEqual((st, made["reused"]), (201, False), made)
            work = sum(made["timings"][k] for k in ("prefill_s", "compress_s", "save_s"))
            self.assertLess(elapsed - work, LOCK_TTL_S + 20, made["timings"])
            self.assertIn("7431", answer(b, made["id"])[0])
            self.assertEqual(r.cli("KEYS", "kvlab:lock:*"), "")  # released

    def test_corrupt_foreign_and_evicted_entries_are_refused(self):
        with RedisServer(extra=["--maxmemory-policy", "allkeys-lru"]) as r, \
                KvlabServer(store=r.url) as a, KvlabServer(store=r.url) as b:
            st, c1, _ = a.post("/v1/contexts", {"text": haystack(3000), "method": "snapkv", "ratio": 0.5})
            self.assertEqual(st, 201, c1)
            key = "kvlab:ctx:" + c1["id"]
            blob = r.cli_bytes("HGET", key, "kvc")[:-1]  # redis-cli --raw ends it with a newline
            self.assertEqual(len(blob), int(r.cli("HSTRLEN", key, "kvc")))
            # a copy under another id: refused (it holds c1's id), never served
            info = r.cli("HGET", key, "info")
            r.cli("HSET", "kvlab:ctx:ctx-000000000000000000000000", "info", info)
            r.cli("INCR", "kvlab:gen")
            self.assertNotIn("ctx-000000000000000000000000", [x["id"] for x in b.get("/v1/contexts")[1]["data"]])
            self.assertIn("holds another context's id", b.log())
            r.cli("DEL", "kvlab:ctx:ctx-000000000000000000000000")  # (a small key LRU may or may not evict below)
            r.cli("INCR", "kvlab:gen")
            # a corrupt entry: refused with 500, the reason in B's log, not sent
            bad = bytearray(blob)
            at = len(bad) - 4096
            bad[at:at + 64] = b"\xff" * 64
            r.cli("HSET", key, "kvc", stdin=bytes(bad))
            self.assertEqual(int(r.cli("HSTRLEN", key, "kvc")), len(blob))
            st, err, _ = b.post("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                                         "context": c1["id"], "max_tokens": 4})
            self.assertEqual((st, err["error"]["code"]), (500, "context_unreadable"), err)
            self.assertIn("checksum mismatch", b.log())
            self.assertNotIn(r.url, err["error"]["message"])
            self.assertGreaterEqual(metric(b.get("/metrics")[1], "kvlab_store_errors_total"), 1)
            self.assertEqual(answer(a, c1["id"])[0], answer(a, c1["id"])[0])  # resident on A: unaffected
            # eviction: with Redis' memory capped just above what it holds now, a second context (a
            # small one: the command being read counts too) pushes the first out
            r.cli("HSET", key, "kvc", stdin=blob)
            used = int(r.cli("INFO", "memory").split("used_memory:")[1].split()[0])
            r.cli("CONFIG", "SET", "maxmemory", str(used + (1 << 20)))
            st, c2, _ = a.post("/v1/contexts", {"text": haystack(400, "The secret code is 9902."), "method": "none"})
            self.assertEqual(st, 201, c2)
            self.assertEqual(r.context_keys(), ["kvlab:ctx:" + c2["id"]])
            self.assertGreaterEqual(int(r.cli("INFO", "stats").split("evicted_keys:")[1].split()[0]), 1)
            st, err, _ = b.post("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                                         "context": c1["id"], "max_tokens": 4})
            self.assertEqual((st, err["error"]["code"]), (404, "context_not_found"), err)
            self.assertIn(c1["id"], err["error"]["message"])
            self.assertIn("9902", answer(b, c2["id"])[0])

    def test_redis_stopped_mid_run(self):
        with RedisServer() as r, KvlabServer(store=r.url) as a:
            st, c, _ = a.post("/v1/contexts", {"text": haystack(3000), "method": "snapkv", "ratio": 0.5})
            self.assertEqual(st, 201, c)
            before = answer(a, c["id"])[:2]
            r.stop()
            # resident contexts keep answering; what needs the store is a 503 naming it
            self.assertEqual(answer(a, c["id"])[:2], before)
            st, err, _ = a.post("/v1/contexts", {"text": haystack(1000), "method": "none"})
            self.assertEqual((st, err["error"]["code"]), (503, "store_unavailable"), err)
            self.assertIn(r.url, err["error"]["message"])
            st, health, _ = a.get("/health")
            self.assertEqual((st, health["store"]["up"]), (200, False))
            self.assertEqual(metric(a.get("/metrics")[1], "kvlab_store_up"), 0)
            self.assertEqual(a.get("/v1/contexts")[0], 200)  # the index it has
            # Redis back (empty: no persistence): the replica uses it again without a restart
            r.start()
            st, c2, _ = a.post("/v1/contexts", {"text": haystack(1000), "method": "none"})
            self.assertEqual(st, 201, c2)
            self.assertTrue(a.get("/health")[1]["store"]["up"])
            self.assertEqual(r.context_keys(), ["kvlab:ctx:" + c2["id"]])
        # Redis down at start: a clear error, exit status 1
        with RedisServer() as r:
            url = r.url
        s = KvlabServer(store=url)
        with self.assertRaises(RuntimeError) as cm:
            s.start()
        self.assertIn("cannot connect to " + url, str(cm.exception))
        self.assertEqual(s.proc.wait(30), 1)

    def test_automatic_prefix_reuse_across_replicas(self):
        text = haystack(3000)
        whole = [{"role": "user", "content": text + "\n\nQuestion: " + QUESTION}]
        with RedisServer() as r, KvlabServer(store=r.url) as a, KvlabServer(store=r.url) as b:
            st, ctx, _ = a.post("/v1/contexts", {"text": text, "method": "snapkv", "ratio": 0.5})
            self.assertEqual(st, 201, ctx)
            named_text, named_tokens, _ = answer(a, ctx["id"])
            client = openai.OpenAI(base_url=b.url + "/v1", api_key="unused", max_retries=0)
            auto = client.chat.completions.create(model="kvlab", messages=whole, temperature=0, max_tokens=16,
                                                  logprobs=True)
            self.assertEqual(auto.model_extra["timings"]["context"], ctx["id"])
            self.assertEqual(auto.usage.prompt_tokens_details.cached_tokens, ctx["tokens"])
            self.assertEqual(auto.choices[0].message.content, named_text)
            self.assertEqual([t.token for t in auto.choices[0].logprobs.content], named_tokens)


class ContentAddress(unittest.TestCase):
    def test_the_same_context_asked_twice_is_made_once(self):
        store = tempfile.mkdtemp(prefix="kvlab-test-store-")
        with KvlabServer(store=store) as s:
            body = {"text": haystack(1500), "method": "snapkv", "ratio": 0.5}
            st, a, _ = s.post("/v1/contexts", body)
            self.assertEqual((st, a["reused"]), (201, False))
            st, b, _ = s.post("/v1/contexts", dict(body, name="another label"))  # a name is not content
            self.assertEqual((st, b["id"], b["reused"]), (200, a["id"], True))
            for change in [{"ratio": 0.25}, {"method": "knorm"}, {"text": body["text"] + " "},
                           {"cache_type_k": "q8_0"}, {"system": "Be brief."}]:
                st, c, _ = s.post("/v1/contexts", dict(body, **change))
                self.assertEqual(st, 201, (change, c))
                self.assertNotEqual(c["id"], a["id"], change)
            self.assertEqual(sorted(os.listdir(store)), sorted(x["id"] + ".kvc" for x in s.get("/v1/contexts")[1]["data"]))
            self.assertEqual(len(os.listdir(store)), 6)
        with KvlabServer(store=store) as s:  # and after a restart
            st, again, _ = s.post("/v1/contexts", body)
            self.assertEqual((st, again["id"]), (200, a["id"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
