"""The Python module's memory over create/drop cycles (docs/python.md, "Memory"): a Model loaded,
a short prefill, both dropped, N times after a few warm-up cycles; prints the process's RSS before
and after. Run with kvlab's venv: scripts/python.sh scripts/bench-python-memory.py [N] [MODEL]."""
import gc
import sys
import time

import kvlab

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
name = sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m"


def cycle():
    m = kvlab.Model(name, threads=1)
    c, _ = m.prefill(m.encode("Hello there, how are you?"))
    del c, m


for _ in range(6):
    cycle()
gc.collect()
r0 = kvlab.memory_snapshot()["process_rss_bytes"]
t0 = time.time()
for _ in range(n):
    cycle()
gc.collect()
r1 = kvlab.memory_snapshot()["process_rss_bytes"]
print(f"{n} Model create/prefill/drop cycles: RSS {r0 / 2**20:.1f} -> {r1 / 2**20:.1f} MiB, "
      f"{(time.time() - t0) / n * 1000:.0f} ms per cycle")
