#!/usr/bin/env python3
"""Many users at once (issue 46): N concurrent clients ask questions about one stored document,
each streaming a fixed-length greedy answer; aggregate decode tokens/s, TTFT and request time
p50 / p90, errors, peak RSS, per concurrency and per server configuration. kvlab's servers are
started here, one configuration after another (never two at once), on the same GGUF and threads.

  scripts/serve/concurrency.py --kvlab build/kvlab --model M.gguf --concurrency 1,4,16 \
      --config batching= --config slots=--no-batching [--threads 2] [--answer 96] [--out F.json]

A configuration is NAME=EXTRA-FLAGS (flags split on spaces; --parallel is set to the concurrency).
With --llama-server PATH, llama.cpp's server runs too (`-np N -cb`, the document as every
client's cached prompt prefix, `cache_prompt`), answering the same questions.
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
QUESTIONS = ["What is the main point of the text?", "Who is the author talking to?",
             "List three ideas from the text.", "What would a critic say about it?",
             "Summarize the text for a child.", "Which sentence matters most, and why?"]


def post(url, body, stream=False):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakRss:
    """A process's peak RSS, sampled every 50 ms from now until stop() (which returns it, bytes)."""

    def __init__(self, pid):
        self.pid, self.peak, self.done = pid, 0, threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while not self.done.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.05)

    def stop(self):
        self.done.set()
        return self.peak * 1024


def start(cmd, pattern, log_path):
    """The server started, its stderr kept in log_path."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = open(log_path, "w")
    port = None
    for line in proc.stderr:
        log.write(line)
        m = re.search(pattern, line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("server did not start: %s (its log: %s)" % (" ".join(cmd), log_path))

    def drain():
        for line in proc.stderr:
            log.write(line)
        log.close()
    threading.Thread(target=drain, daemon=True).start()
    return proc, port


def ask_stream(url, body):
    """(ttft_s, total_s, completion_tokens) of one streamed answer."""
    t0 = time.time()
    ttft, tokens = None, 0
    with post(url, dict(body, stream=True, stream_options={"include_usage": True})) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("choices") and (j["choices"][0].get("delta", {}).get("content") or j["choices"][0].get("text")):
                if ttft is None:
                    ttft = time.time() - t0
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
    return ttft or 0.0, time.time() - t0, tokens


def ask_whole(url, body):
    """(None, total_s, completion_tokens) of one answer sent whole (the client parses one body:
    on a machine where the clients share the server's cores, streaming's per-token parsing
    takes CPU from the server)."""
    t0 = time.time()
    with post(url, dict(body, stream=False)) as r:
        j = json.loads(r.read())
    return None, time.time() - t0, j["usage"]["completion_tokens"]


def run_clients(n, ask, per_client):
    results, errors = [], 0
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futs = [pool.submit(lambda c=c: [ask(QUESTIONS[(c + k) % len(QUESTIONS)]) for k in range(per_client)])
                for c in range(n)]
        for f in futs:
            try:
                results += f.result()
            except Exception as e:  # noqa: BLE001 - an error is counted, the run goes on
                print("[concurrency] error: %s" % e, file=sys.stderr)
                errors += 1
    wall = time.time() - t0
    ttfts = sorted(r[0] for r in results if r[0] is not None)
    totals = sorted(r[1] for r in results)
    tokens = sum(r[2] for r in results)

    def pct(v, p):
        return v[min(len(v) - 1, int(p * len(v)))] if v else None
    return {"clients": n, "requests": len(results), "errors": errors, "wall_s": wall,
            "completion_tokens": tokens, "aggregate_tokens_per_s": tokens / wall if wall > 0 else 0,
            "ttft_p50_s": pct(ttfts, 0.5), "ttft_p90_s": pct(ttfts, 0.9),
            "request_p50_s": pct(totals, 0.5), "request_p90_s": pct(totals, 0.9)}


def kvlab_run(args, name, extra, n, document):
    store = tempfile.mkdtemp(prefix="kvlab-bench-store-")
    cmd = [args.kvlab, "serve", args.model, "--port", "0", "--store", store, "-t", str(args.threads),
           "--parallel", str(n), "--queue", "256"] + extra
    proc, port = start(cmd, r"listening on http://[^:]+:(\d+)", os.path.join(args.log_dir, "kvlab-%s-%d.log" % (name, n)))
    try:
        base = "http://127.0.0.1:%d" % port
        with post(base + "/v1/contexts", {"text": document, "method": args.method,
                                           **({"ratio": args.ratio} if args.method != "none" else {})}) as r:
            ctx = json.loads(r.read())["id"]
        peak = PeakRss(proc.pid)

        def ask(q):
            return (ask_whole if args.no_stream else ask_stream)(base + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": q}], "max_tokens": args.answer,
                               "temperature": 0, "ignore_eos": True, "context": ctx})
        ask(QUESTIONS[0])  # warm
        r = run_clients(n, ask, args.per_client)
        r["peak_rss_bytes"] = peak.stop()
        with urllib.request.urlopen(base + "/metrics") as m:
            text = m.read().decode()
        steps = re.search(r"^kvlab_batch_steps_total (\S+)$", text, re.M)
        rows = re.search(r"^kvlab_batch_rows_total (\S+)$", text, re.M)
        if steps and rows and float(steps.group(1)) > 0:
            r["mean_batch"] = float(rows.group(1)) / float(steps.group(1))
        r["server"] = name
        return r
    finally:
        proc.terminate()
        proc.wait()


def free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def llama_run(args, n, document):
    """llama-server with continuous batching: -np N -cb, the document as every client's cached
    prompt prefix (each slot warmed with it first, through id_slot)."""
    port = free_port()
    cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-np", str(n), "-cb", "-c", str(n * args.slot_ctx), "-fa", "on"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 300
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit("llama-server did not start: %s" % " ".join(cmd))
            time.sleep(0.2)

        def body(q, **extra):
            return dict({"messages": [{"role": "user", "content": document + "\n\nQuestion: " + q}],
                         "max_tokens": args.answer, "temperature": 0, "ignore_eos": True, "cache_prompt": True},
                        **extra)
        for i in range(n):  # every slot holds the document before the clients come
            with post(base + "/v1/chat/completions", body("Hello?", id_slot=i, max_tokens=1)) as r:
                r.read()
        peak = PeakRss(proc.pid)
        ask = ask_whole if args.no_stream else ask_stream
        r = run_clients(n, lambda q: ask(base + "/v1/chat/completions", body(q)), args.per_client)
        r["peak_rss_bytes"] = peak.stop()
        r["server"] = "llama-server"
        return r
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvlab", required=True)
    ap.add_argument("--model", required=True, help="GGUF path")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--config", action="append", default=[], help="NAME=EXTRA-FLAGS (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answer", type=int, default=96, help="tokens per answer (EOS ignored)")
    ap.add_argument("--per-client", type=int, default=2, help="questions each client asks in turn")
    ap.add_argument("--chars", type=int, default=8000, help="document length in characters (~2k tokens)")
    ap.add_argument("--method", default="none")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--llama-server", default="", help="llama.cpp's llama-server: run it too")
    ap.add_argument("--slot-ctx", type=int, default=4096, help="llama-server's context per slot (-c is N times it)")
    ap.add_argument("--no-stream", action="store_true", help="answers sent whole (throughput; no TTFT)")
    ap.add_argument("--log-dir", default=tempfile.gettempdir(), help="where the servers' stderr goes")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    configs = [c.split("=", 1) for c in (args.config or ["batching="])]
    with open(os.path.join(HERE, "../../data/haystack/avg.txt"), encoding="utf-8") as f:
        document = f.read()[:args.chars]
    out = {"model": args.model, "threads": args.threads, "answer_tokens": args.answer,
           "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
           "runs": []}
    for n in [int(x) for x in args.concurrency.split(",")]:
        for name, extra in configs:
            r = kvlab_run(args, name, extra.split(), n, document)
            print(json.dumps(r), flush=True)
            out["runs"].append(r)
        if args.llama_server:
            r = llama_run(args, n, document)
            print(json.dumps(r), flush=True)
            out["runs"].append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
