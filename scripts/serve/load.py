"""Load benchmark of `kvlab serve` beside llama.cpp's `llama-server` (issue 11, item 4).

On one model and one ~4k-token document with facts at several depths, for each server:
  * fresh: the TTFT of a question whose prompt carries the whole document (a full prefill),
  * stored: the TTFT of the same questions answered from the stored context (kvlab: a
    context made once with POST /v1/contexts; llama-server: its prompt cache, which reuses
    the document's KV when a slot sees the same prefix again),
  * automatic (kvlab): the whole prompt again, no context named, answered from the stored full
    context its tokens begin with (automatic prefix reuse; llama-server's prompt cache's peer),
  * load: K concurrent clients asking questions for M minutes (streamed): p50/p99 TTFT,
    requests per second, errors, and the server's RSS sampled twice a second,
  * resident KV bytes (kvlab: /metrics kvlab_kv_resident_bytes; llama-server: the KV cache
    size it allocates for -c, from its log).
Every TTFT is measured by the client: request sent -> first streamed content.
Prints a markdown table and writes the JSON (--out). Not a test: never run it beside other work.
"""
import argparse
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
ROOT = os.path.dirname(os.path.dirname(HERE))


FACTS = [("Ada", 4821), ("Boris", 1377), ("Chen", 9054), ("Dana", 6612), ("Emil", 2209), ("Farah", 7345),
         ("Goran", 5190), ("Hana", 3868)]
CODES = [c for _, c in FACTS]


def document(n_chars):
    """Real essays (data/haystack) with 8 facts at depths 0.05 .. 0.95; the questions."""
    files = sorted(f for f in os.listdir(os.path.join(ROOT, "data/haystack")) if f.endswith(".txt"))
    text = ""
    for f in files:
        with open(os.path.join(ROOT, "data/haystack", f), encoding="utf-8") as fh:
            text += fh.read() + "\n\n"
        if len(text) > n_chars:
            break
    text = text[:n_chars]
    facts = FACTS
    out, last = [], 0
    for i, (name, code) in enumerate(facts):
        at = text.rfind(". ", 0, int(len(text) * (0.05 + 0.9 * i / (len(facts) - 1)))) + 2
        out.append(text[last:at] + "The access code of %s is %d. " % (name, code))
        last = at
    out.append(text[last:])
    return "".join(out), ["What is the access code of %s?" % n for n, _ in facts]


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    return urllib.request.urlopen(req, timeout=600)


def ask(url, messages, extra=None, max_tokens=16):
    """(ttft_s, total_s, text) of one streamed chat completion; raises on an HTTP error."""
    body = {"messages": messages, "stream": True, "temperature": 0, "max_tokens": max_tokens}
    body.update(extra or {})
    t0 = time.perf_counter()
    ttft, text = None, ""
    with post(url + "/v1/chat/completions", body) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
    return ttft if ttft is not None else time.perf_counter() - t0, time.perf_counter() - t0, text


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def start(cmd, ready_re, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        with open(log_path) as f:
            m = re.search(ready_re, f.read())
        if m:
            return proc, m
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    with open(log_path) as f:
        raise RuntimeError("%s did not start:\n%s" % (cmd[0], f.read()[-3000:]))


def wait_health(url):
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(url + " never became healthy")


def load(url, prompts, clients, seconds, pid):
    """K clients cycling through prompts for `seconds`; RSS sampled twice a second. url and pid
    may be lists (replicas): client k asks url[k % n]; the RSS figures are then lists, one per pid."""
    urls, pids = (url, pid) if isinstance(url, list) else ([url], [pid])
    ttfts, errors, done, samples = [], [], [0], []
    stop = time.time() + seconds
    lock = threading.Lock()

    def client(k):
        i = k
        while time.time() < stop:
            messages, extra = prompts[i % len(prompts)]
            i += clients
            try:
                t, _, _ = ask(urls[k % len(urls)], messages, extra)
                with lock:
                    ttfts.append(t)
                    done[0] += 1
            except Exception as e:  # counted, never hidden
                with lock:
                    errors.append(repr(e)[:200])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        samples.append((round(time.time() - t0, 2), [rss(p) for p in pids]))
        time.sleep(0.5)
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    one = (lambda v: v) if isinstance(url, list) else (lambda v: v[0])  # noqa: E731
    return {"requests": done[0], "errors": len(errors), "error_samples": errors[:5],
            "requests_per_s": done[0] / elapsed, "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
            "rss_start_bytes": one(samples[0][1]), "rss_max_bytes": one([max(s[1][i] for s in samples)
                                                                         for i in range(len(pids))]),
            "rss_end_bytes": one(samples[-1][1]), "rss_samples": [(t, one(v)) for t, v in samples]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvlab", required=True, help="the kvlab executable")
    ap.add_argument("--llama-server", required=True, help="llama.cpp's llama-server (same pinned tree)")
    ap.add_argument("--model", required=True, help="GGUF path")
    ap.add_argument("--chars", type=int, default=16000, help="document length in characters (~4k tokens)")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="slots of both servers (each slot gets every thread)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", default="snapkv")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the fresh-prefill TTFT")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    doc, questions = document(a.chars)
    work = tempfile.mkdtemp(prefix="kvlab-serve-load-")
    result = {"model": a.model, "clients": a.clients, "parallel": a.parallel, "seconds": a.seconds, "threads": a.threads,
              "cpu": open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(),
              "questions": questions}
    full_prompt = lambda q: [{"role": "user", "content": doc + "\n\nQuestion: " + q}]  # noqa: E731

    # --- kvlab --------------------------------------------------------------------------
    proc, m = start([a.kvlab, "serve", a.model, "--port", "0", "--store", work + "/store", "-t", str(a.threads),
                     "--parallel", str(a.parallel)], r"listening on http://[^:]+:(\d+)", work + "/kvlab.log")
    url = "http://127.0.0.1:" + m.group(1)
    try:
        wait_health(url)
        fresh = [ask(url, full_prompt(q))[0] for q in questions[:a.reps]]
        r = {"fresh_ttft_s": statistics.median(fresh), "fresh_ttft_reps": fresh}
        for name, body in [("full", {"method": "none"}), ("compressed", {"method": a.method, "ratio": a.ratio})]:
            with post(url + "/v1/contexts", {"text": doc, **body}) as resp:
                ctx = json.loads(resp.read())
            stored = [ask(url, [{"role": "user", "content": q}], {"context": ctx["id"]}) for q in questions]
            r[name] = {"context": {k: ctx[k] for k in ("tokens", "kv_bytes", "kv_bytes_full", "achieved_ratio",
                                                        "timings")},
                       "stored_ttft_s": statistics.median(s[0] for s in stored),
                       "answers": [s[2] for s in stored],
                       "correct": sum(str(c) in s[2] for s, c in zip(stored, CODES))}
            r[name]["ttft_fraction_of_fresh"] = r[name]["stored_ttft_s"] / r["fresh_ttft_s"]
            if name == "full":  # the whole prompt, no context named: automatic prefix reuse finds it
                auto = [ask(url, full_prompt(q)) for q in questions]
                r["auto_prefix"] = {"stored_ttft_s": statistics.median(s[0] for s in auto),
                                    "answers": [s[2] for s in auto],
                                    "correct": sum(str(c) in s[2] for s, c in zip(auto, CODES))}
                r["auto_prefix"]["ttft_fraction_of_fresh"] = r["auto_prefix"]["stored_ttft_s"] / r["fresh_ttft_s"]
            r[name]["load"] = load(url, [([{"role": "user", "content": q}], {"context": ctx["id"]})
                                         for q in questions], a.clients, a.seconds, proc.pid)
        with urllib.request.urlopen(url + "/metrics") as resp:
            metrics = resp.read().decode()
        r["kv_resident_bytes"] = float(re.search(r"^kvlab_kv_resident_bytes (\S+)$", metrics, re.M).group(1))
        result["kvlab"] = r
    finally:
        proc.terminate()
        proc.wait()

    # --- llama-server -------------------------------------------------------------------
    n_ctx = 8192 * a.parallel
    proc, _ = start([a.llama_server, "-m", a.model, "--port", "18093", "--host", "127.0.0.1", "-t", str(a.threads),
                     "-c", str(n_ctx), "-np", str(a.parallel), "--no-webui"], r"server is listening|listening on http",
                    work + "/llama.log")
    url = "http://127.0.0.1:18093"
    try:
        wait_health(url)
        nocache = {"cache_prompt": False}
        fresh = [ask(url, full_prompt(q), nocache)[0] for q in questions[:a.reps]]
        r = {"fresh_ttft_s": statistics.median(fresh), "fresh_ttft_reps": fresh, "n_ctx": n_ctx}
        ask(url, full_prompt(questions[0]))  # the document into a slot's prompt cache
        stored = [ask(url, full_prompt(q)) for q in questions]
        r["prompt_cache"] = {"stored_ttft_s": statistics.median(s[0] for s in stored),
                             "answers": [s[2] for s in stored]}
        r["prompt_cache"]["ttft_fraction_of_fresh"] = r["prompt_cache"]["stored_ttft_s"] / r["fresh_ttft_s"]
        r["prompt_cache"]["load"] = load(url, [(full_prompt(q), None) for q in questions], a.clients, a.seconds,
                                         proc.pid)
        # its F16 KV cache holds n_ctx rows per layer from the start: kvlab's bytes per full row x n_ctx
        full = result["kvlab"]["full"]["context"]
        r["kv_allocated_bytes"] = n_ctx * full["kv_bytes_full"] / full["tokens"]
        r["prompt_cache"]["correct"] = sum(str(c) in t for t, c in zip(r["prompt_cache"]["answers"], CODES))
        result["llama_server"] = r
    finally:
        proc.terminate()
        proc.wait()

    k, l = result["kvlab"], result["llama_server"]
    mib = lambda b: "%.1f MiB" % (b / 2**20) if b else "?"  # noqa: E731
    rows = [("kvlab, fresh prefill", k["fresh_ttft_s"], None, None, None, None),
            ("kvlab, stored full context", k["full"]["stored_ttft_s"], k["full"]["load"], k["full"]["context"]["kv_bytes"],
             k["full"]["correct"], k["full"]["ttft_fraction_of_fresh"]),
            ("kvlab, automatic prefix reuse (full context)", k["auto_prefix"]["stored_ttft_s"], None, None,
             k["auto_prefix"]["correct"], k["auto_prefix"]["ttft_fraction_of_fresh"]),
            ("kvlab, stored %s %.2f" % (a.method, a.ratio), k["compressed"]["stored_ttft_s"], k["compressed"]["load"],
             k["compressed"]["context"]["kv_bytes"], k["compressed"]["correct"],
             k["compressed"]["ttft_fraction_of_fresh"]),
            ("llama-server, fresh prefill", l["fresh_ttft_s"], None, None, None, None),
            ("llama-server, prompt cache", l["prompt_cache"]["stored_ttft_s"], l["prompt_cache"]["load"],
             l["kv_allocated_bytes"], l["prompt_cache"]["correct"], l["prompt_cache"]["ttft_fraction_of_fresh"])]
    print("| setting | TTFT (median) | / fresh | load p50 / p99 TTFT | req/s | errors | RSS max | KV bytes | correct |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ttft, ld, kv, correct, frac in rows:
        print("| %s | %.3f s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, ttft, "1/%.0f" % (1 / frac) if frac else "", "%.3f / %.3f s" % (ld["ttft_p50_s"], ld["ttft_p99_s"])
            if ld else "", "%.2f" % ld["requests_per_s"] if ld else "", ld["errors"] if ld else "",
            mib(ld["rss_max_bytes"]) if ld else "", mib(kv) if kv else "", "%d/8" % correct if correct is not None
            else ""))
    print("\nCPU: %s; %d thread(s); %d client(s) x %.0f s" % (result["cpu"], a.threads, a.clients, a.seconds))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote " + a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
