"""A real `redis-server` (Debian's redis-server package, installed by scripts/deps.sh --tests) on
a free loopback port for the server tests, without persistence; `redis-cli` to look inside."""
import os
import shutil
import socket
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`with RedisServer(extra=[...]) as r:` -> r.url ("redis://127.0.0.1:PORT/0"), r.cli(...)."""

    def __init__(self, extra=(), port=None):
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(self.binary):
            raise RuntimeError("redis-server is missing: scripts/deps.sh --tests installs Debian's redis-server")
        self.extra = list(extra)
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="kvlab-test-redis-")
        self.proc = None
        self.url = "redis://127.0.0.1:%d/0" % self.port

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--protected-mode", "yes"] + self.extra,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.cli("PING") == "PONG":
                    return
            except (subprocess.CalledProcessError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start on port %d" % self.port)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def cli(self, *args, stdin=None):
        """A command through redis-cli; its reply as text (stripped). stdin: bytes sent as the last
        argument (redis-cli -x), binary-safe."""
        cmd = ["redis-cli", "-p", str(self.port), "--raw"] + (["-x"] if stdin is not None else []) + list(args)
        out = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True,
                             timeout=60).stdout
        return out.decode("utf-8", "replace").strip()

    def cli_bytes(self, *args):
        cmd = ["redis-cli", "-p", str(self.port), "--raw"] + list(args)
        return subprocess.run(cmd, stdout=subprocess.PIPE, check=True, timeout=60).stdout

    def context_keys(self):
        out = self.cli("KEYS", "kvlab:ctx:*")
        return sorted(k for k in out.split("\n") if k)
