"""Two `kvlab serve` replicas sharing one Redis (issue 33): does a context made once serve both?

A real redis-server on a free loopback port (no persistence), replicas A and B with
`--store redis://...`, each with --threads / 2 threads. On N ~4k-token documents (the same essays,
facts at several depths, a different set of codes each):
  * made once: A makes N compressed contexts; B asked for the same ones reuses them (no prefill),
    and /metrics of both say how many were written (N) and read;
  * remote vs local: on B, the first question on each context (its rows come from Redis: made and
    held by A) and a second one (now resident on B): median TTFTs, and their ratio;
  * fresh: the TTFT of a question whose prompt carries a whole document no context holds;
  * load: K clients, half on each replica, cycling questions over the contexts for S seconds:
    p50/p99 TTFT, requests/s, errors; each replica's RSS sampled twice a second, flat after
    warm-up or not (its peak in the run's second quarter against its peak in the last).
Every TTFT is measured by the client: request sent -> first streamed content. Prints a markdown
table and writes the JSON (--out). Not a test: never run it beside other work.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import CODES, ask, document, load, post, start, wait_health  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def variant(doc, k):
    """Document k: the same essays, every code shifted by k (another context, the same work)."""
    codes = [c + 11 * k for c in CODES]
    for c, n in zip(CODES, codes):
        doc = doc.replace(" is %d. " % c, " is %d. " % n)
    return doc, codes


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics") as r:
        m = re.search(r"^%s (\S+)$" % re.escape(name), r.read().decode(), re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvlab", required=True, help="the kvlab executable")
    ap.add_argument("--model", required=True, help="GGUF path")
    ap.add_argument("--chars", type=int, default=16000, help="document length in characters (~4k tokens)")
    ap.add_argument("--contexts", type=int, default=5, help="documents, each made into a context on A")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=2, help="in all: each replica gets half")
    ap.add_argument("--method", default="snapkv")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the fresh-prefill TTFT")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    redis = shutil.which("redis-server")
    if not redis:
        sys.exit("redis-server is missing: scripts/deps.sh --tests installs Debian's redis-server")
    base, questions = document(a.chars)
    work = tempfile.mkdtemp(prefix="kvlab-serve-replicas-")
    port = free_port()
    store = "redis://127.0.0.1:%d/0" % port
    per = max(1, a.threads // 2)
    result = {"model": a.model, "clients": a.clients, "seconds": a.seconds, "threads_per_replica": per,
              "contexts": a.contexts, "method": a.method, "ratio": a.ratio, "questions": questions,
              "cpu": open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip()}
    procs = []
    try:
        procs.append(subprocess.Popen([redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL))
        urls = []
        for name in ("a", "b"):
            proc, m = start([a.kvlab, "serve", a.model, "--port", "0", "--store", store, "-t", str(per)],
                            r"listening on http://[^:]+:(\d+)", "%s/%s.log" % (work, name))
            procs.append(proc)
            urls.append("http://127.0.0.1:" + m.group(1))
            wait_health(urls[-1])
        url_a, url_b = urls
        docs = [variant(base, k + 1) for k in range(a.contexts)]
        body = {"method": a.method, "ratio": a.ratio}
        made = []
        for doc, _ in docs:
            with post(url_a + "/v1/contexts", {"text": doc, **body}) as r:
                made.append(json.loads(r.read()))
        reused = []
        for doc, _ in docs:
            t0 = time.perf_counter()
            with post(url_b + "/v1/contexts", {"text": doc, **body}) as r:
                c = json.loads(r.read())
            reused.append({"id": c["id"], "reused": c["reused"], "seconds": time.perf_counter() - t0})
        result["made_once"] = {
            "same_ids": [c["id"] for c in made] == [c["id"] for c in reused],
            "all_reused_on_b": all(c["reused"] for c in reused),
            "make_s_on_a": statistics.median(c["timings"]["prefill_s"] + c["timings"]["compress_s"] for c in made),
            "reuse_s_on_b": statistics.median(c["seconds"] for c in reused),
            "writes": {"a": metric(url_a, "kvlab_store_writes_total"), "b": metric(url_b, "kvlab_store_writes_total")},
            "context": {k: made[0][k] for k in ("tokens", "kv_bytes", "kv_bytes_full", "file_bytes", "achieved_ratio")}}
        remote, local, correct = [], [], 0
        for c, (_, codes) in zip(made, docs):
            q = lambda i: [{"role": "user", "content": questions[i]}]  # noqa: E731
            t, _, text = ask(url_b, q(0), {"context": c["id"]})
            remote.append(t)
            correct += str(codes[0]) in text
            t, _, text = ask(url_b, q(1), {"context": c["id"]})
            local.append(t)
            correct += str(codes[1]) in text
        fresh_doc, _ = variant(base, 1000)  # no context holds it
        fresh = [ask(url_b, [{"role": "user", "content": fresh_doc + "\n\nQuestion: " + q}])[0]
                 for q in questions[:a.reps]]
        r = {"remote_ttft_s": statistics.median(remote), "local_ttft_s": statistics.median(local),
             "fresh_ttft_s": statistics.median(fresh), "remote_reps": remote, "local_reps": local,
             "fresh_reps": fresh, "correct": correct, "asked": 2 * len(made),
             "store_read_bytes_b": metric(url_b, "kvlab_store_read_bytes_total")}
        r["remote_over_local"] = r["remote_ttft_s"] / r["local_ttft_s"]
        r["remote_over_fresh"] = r["remote_ttft_s"] / r["fresh_ttft_s"]
        result["ttft"] = r
        prompts = [([{"role": "user", "content": q}], {"context": c["id"]}) for c in made for q in questions]
        ld = load([url_a, url_b], prompts, a.clients, a.seconds, [p.pid for p in procs[1:]])
        # RSS rises and falls by one request's copy of a cache: compare peaks, not single samples
        # (the peak of the second quarter of the run, after warm-up, against that of the last)
        early = [v for t, v in ld["rss_samples"] if a.seconds / 4 <= t < a.seconds / 2]
        late = [v for t, v in ld["rss_samples"] if t >= a.seconds * 3 / 4]
        peak = lambda vs: [max(v[i] for v in vs) for i in range(2)] if vs else None  # noqa: E731
        ld["rss_peak_after_warmup_bytes"], ld["rss_peak_last_quarter_bytes"] = peak(early), peak(late)
        ld["rss_growth_after_warmup_bytes"] = ([b - e for e, b in zip(peak(early), peak(late))]
                                               if early and late else None)
        result["load"] = ld
        result["errors_total"] = {"a": metric(url_a, "kvlab_store_errors_total"),
                                  "b": metric(url_b, "kvlab_store_errors_total")}
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)

    t, m, ld = result["ttft"], result["made_once"], result["load"]
    mib = lambda b: "%.1f" % (b / 2**20)  # noqa: E731
    print("| measure | value |\n|---|---|")
    print("| contexts made on A / reused on B without a prefill | %d / %d (writes: A %d, B %d) |" % (
        a.contexts, sum(c["reused"] for c in reused), m["writes"]["a"], m["writes"]["b"]))
    print("| make on A (prefill + %s %.2f) / reuse on B | %.2f s / %.3f s |" % (a.method, a.ratio, m["make_s_on_a"],
                                                                           m["reuse_s_on_b"]))
    print("| TTFT on B, context held by A (read from Redis) | %.3f s |" % t["remote_ttft_s"])
    print("| TTFT on B, context resident on B | %.3f s |" % t["local_ttft_s"])
    print("| TTFT, fresh prefill of the whole prompt | %.3f s |" % t["fresh_ttft_s"])
    print("| remote / local; remote / fresh | %.2fx; 1/%.0f |" % (t["remote_over_local"], 1 / t["remote_over_fresh"]))
    print("| answers correct | %d/%d |" % (t["correct"], t["asked"]))
    print("| load: %d clients x %.0f s, p50 / p99 TTFT | %.3f / %.3f s |" % (a.clients, a.seconds, ld["ttft_p50_s"],
                                                                          ld["ttft_p99_s"]))
    print("| load: requests/s, errors | %.2f, %d |" % (ld["requests_per_s"], ld["errors"]))
    e, l2 = ld["rss_peak_after_warmup_bytes"], ld["rss_peak_last_quarter_bytes"]
    print("| RSS A, B: peak of the 2nd quarter -> of the last (MiB) | %s -> %s, %s -> %s |" % (
        mib(e[0]), mib(l2[0]), mib(e[1]), mib(l2[1])))
    print("\nCPU: %s; 2 replicas x %d thread(s); Redis on loopback" % (result["cpu"], per))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote " + a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
