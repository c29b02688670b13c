"""Continuous batching in a real `kvlab serve` (the default): 16 concurrent streamed requests on two
stored contexts of different methods and row types, through the official `openai` client, each get
the tokens and log-probabilities they get alone, while /metrics shows steps shared by several
requests; a request cancelled mid-stream ends and the others go on; a client that stops reading
stalls no one else; the decoding loop is empty afterwards.

Run: python3 tests/server/test_batch.py (CTest runs it with the test venv's python).
"""
import concurrent.futures
import os
import re
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import openai  # noqa: E402

from kvlab_server import KvlabServer, haystack  # noqa: E402

QUESTIONS = ["What is the secret code?", "Say the code twice.", "Which number was mentioned?",
             "Summarize the text in one line."]


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def ask(server, ctx_id, question, max_tokens=24):
    """(text, [(token, logprob)]) of a streamed answer, the logprobs from the last chunk."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="kvlab", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=max_tokens,
        logprobs=True, stream=True, extra_body={"context": ctx_id})
    text, lps = "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        text += c.delta.content or ""
        if c.logprobs and c.logprobs.content:
            lps = [(t.token, t.logprob) for t in c.logprobs.content]
    return text, lps


class Batching(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KvlabServer(extra=["--parallel", "16"]).__enter__()
        s = cls.server
        st, a, _ = s.post("/v1/contexts", {"text": haystack(3000), "method": "snapkv", "ratio": 0.5})
        assert st == 201, a
        st, b, _ = s.post("/v1/contexts", {"text": haystack(2000, needle="The secret code is 2207."),
                                           "method": "knorm", "ratio": 0.25, "cache_type_k": "q8_0",
                                           "cache_type_v": "q8_0"})
        assert st == 201, b
        cls.contexts = [a["id"], b["id"]]

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def jobs(self, n):
        return [(self.contexts[i % 2], QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]

    def test_sixteen_at_once_get_what_they_get_alone(self):
        s = self.server
        alone = {job: ask(s, *job) for job in set(self.jobs(16))}
        steps0 = metric(s.get("/metrics")[1], "kvlab_batch_steps_total")
        rows0 = metric(s.get("/metrics")[1], "kvlab_batch_rows_total")
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda job: ask(s, *job), self.jobs(16)))
        for job, answer in zip(self.jobs(16), got):
            self.assertEqual(answer, alone[job], job)
        self.assertIn("7431", alone[(self.contexts[0], QUESTIONS[0])][0])
        m = s.get("/metrics")[1]
        steps, rows = metric(m, "kvlab_batch_steps_total") - steps0, metric(m, "kvlab_batch_rows_total") - rows0
        self.assertGreater(rows / steps, 1.5, "the requests hardly shared a step")
        self.assertEqual(metric(m, "kvlab_batch_running"), 0)

    def test_a_stop_string_ends_the_answer_at_its_token(self):
        s = self.server
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)

        def stopped(i):
            return client.chat.completions.create(
                model="kvlab", messages=[{"role": "user", "content": QUESTIONS[3]}], temperature=0, max_tokens=64,
                stop=["."], logprobs=True, extra_body={"context": self.contexts[i % 2]})
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(stopped, range(4)))
        for r in got:
            tokens = [t.token for t in r.choices[0].logprobs.content]
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertEqual(r.usage.completion_tokens, len(tokens))
            # the loop may have made tokens past the stop before it saw it: they are not the answer's
            self.assertIn(".", tokens[-1])
            self.assertNotIn(".", "".join(tokens[:-1]))
            self.assertNotIn(".", r.choices[0].message.content)

    def test_a_cancelled_request_ends_and_the_others_go_on(self):
        s = self.server
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        reference = ask(s, self.contexts[0], QUESTIONS[3], max_tokens=48)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            others = [pool.submit(ask, s, self.contexts[0], QUESTIONS[3], 48) for _ in range(3)]
            stream = client.chat.completions.create(
                model="kvlab", messages=[{"role": "user", "content": QUESTIONS[3]}], max_tokens=400, stream=True,
                extra_body={"context": self.contexts[1]})
            for i, _ in enumerate(stream):
                if i == 3:
                    break
            stream.close()  # the client goes away mid-answer
            for f in others:
                self.assertEqual(f.result(timeout=300), reference)
        deadline = time.time() + 30
        while metric(s.get("/metrics")[1], "kvlab_batch_running") != 0 and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(metric(s.get("/metrics")[1], "kvlab_batch_running"), 0, "the cancelled request stayed")

    def test_a_client_that_stops_reading_stalls_no_one(self):
        s = self.server
        reference = ask(s, self.contexts[1], QUESTIONS[1])
        # a streamed request for a long answer whose client never reads a byte of it (a small
        # receive window, set before connecting)
        body = ('{"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 7000, '
                '"ignore_eos": true, "stream": true, "context": "%s"}' % self.contexts[0])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        try:
            deadline = time.time() + 60
            while metric(s.get("/metrics")[1], "kvlab_batch_running") != 1 and time.time() < deadline:
                time.sleep(0.05)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda _: ask(s, self.contexts[1], QUESTIONS[1]), range(4)))
            self.assertEqual(got, [reference] * 4)
            # the unread answer is still being made: the others finished beside it, not after it
            m = s.get("/metrics")[1]
            self.assertEqual(metric(m, "kvlab_batch_running"), 1, "the unread request left the loop early")
        finally:
            sock.close()
        deadline = time.time() + 60  # its client gone, it ends at its next write
        while metric(s.get("/metrics")[1], "kvlab_batch_running") != 0 and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(metric(s.get("/metrics")[1], "kvlab_batch_running"), 0, "the abandoned request stayed")


if __name__ == "__main__":
    unittest.main(verbosity=2)
