"""Starts a real `kvlab serve` on a free loopback port for the server tests, and stops it.

Environment (set by CTest): KVLAB_BINARY (the kvlab executable), KVLAB_TEST_MODEL (a GGUF;
default ~/.cache/kvlab/models/smollm2-135m-0.1.2.gguf).
"""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request


def rss_bound(bytes_):
    """An RSS growth bound for the normal build, widened for the sanitizer build (scripts/
    test-sanitize.sh sets ASAN_OPTIONS): ASan keeps freed blocks in a quarantine of up to 256 MiB
    and shadows every touched byte with 1/8 more (measured there: +219 MiB for the bodies test,
    +217 MiB in the soak, against +29 to +37 MiB in the normal build)."""
    return int(bytes_ * 1.125) + (256 << 20) if os.environ.get("ASAN_OPTIONS") else bytes_


def model_path():
    return os.environ.get("KVLAB_TEST_MODEL") or os.path.expanduser(
        "~/.cache/kvlab/models/smollm2-135m-0.1.2.gguf")


def kvlab_binary():
    return os.environ.get("KVLAB_BINARY") or os.path.join(os.path.dirname(__file__), "../../build/kvlab")


def source_dir():
    return os.environ.get("KVLAB_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "../..")


class KvlabServer:
    """`with KvlabServer(store=..., extra=[...]) as s:` -> s.url, s.port, s.log(). Without a
    store it makes a temporary one and removes it when it stops."""

    def __init__(self, store=None, extra=(), threads=2, address_space=None):
        self._own_store = store is None
        self.address_space = address_space  # bytes: the process's RLIMIT_AS (ulimit -v), or None
        self.store = store or tempfile.mkdtemp(prefix="kvlab-test-store-")
        self.extra = list(extra)
        self.threads = threads
        self.proc = None
        self.port = None
        self._log = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        cmd = [kvlab_binary(), "serve", model_path(), "--port", "0", "--store", self.store,
               "-t", str(self.threads)] + self.extra
        limit = self.address_space

        def limits():
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=limits)
        got = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self._log.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not got.wait(120) or self.port is None:
            self.stop()
            raise RuntimeError("kvlab serve did not start:\n" + self.log())
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("kvlab serve never answered /health:\n" + self.log())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stderr:
            self._pump.join(10)
            self.proc.stderr.close()
        if self._own_store:
            shutil.rmtree(self.store, ignore_errors=True)
        return self.proc.returncode if self.proc else None

    def log(self):
        return "".join(self._log)

    def _status_bytes(self, field):
        """A memory figure of /proc/PID/status ("VmPeak:", "VmRSS:"), in bytes."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no %s for kvlab serve" % field)

    def vm_peak(self):
        """The process's peak address space, in bytes."""
        return self._status_bytes("VmPeak:")

    def rss(self):
        """The process's resident memory, in bytes."""
        return self._status_bytes("VmRSS:")

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, parsed JSON or text, headers); never raises for HTTP errors."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, _parse(r.read(), r.headers), r.headers
        except urllib.error.HTTPError as e:
            return e.code, _parse(e.read(), e.headers), e.headers

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def post(self, path, body=None, headers=None, raw=None):
        return self.request("POST", path, body, headers, raw)

    def delete(self, path, headers=None):
        return self.request("DELETE", path, headers=headers)


def _parse(data, headers):
    text = data.decode("utf-8", "replace")
    if "json" in (headers.get("Content-Type") or ""):
        return json.loads(text)
    return text


def haystack(chars=5000, needle="The secret code is 7431.", depth=1.0):
    """A real essay from tests/data with a needle at a depth (0: start, 1: its end, where
    the observation window of SnapKV-like methods keeps it at any ratio)."""
    with open(os.path.join(source_dir(), "tests/data/avg.txt"), encoding="utf-8") as f:
        text = f.read()[:chars]
    if depth >= 1.0:
        return text.rstrip() + "\n\n" + needle
    at = text.rfind(". ", 0, int(len(text) * depth)) + 2
    return text[:at] + needle + " " + text[at:]
