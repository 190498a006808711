"""ServerProcess: runs `fathom serve` on a free port for the e2e tests.

    with ServerProcess(fathom_bin, model_path, extra_args=["--api-key", "k"]) as server:
        requests.get(f"{server.base_url}/health")

The server is started with `--port 0`; the port is read from its stdout line
"fathom: HTTP listening on HOST:PORT" (and "fathom: gRPC listening on HOST:PORT" when gRPC is
on), then /health is polled until it answers 200. Leaving the block sends SIGTERM and waits for
the process to exit; `returncode` and the captured `stdout` / `stderr` remain readable.

Unless extra_args give --threads, the server computes on one thread ($FATHOM_TEST_THREADS
overrides): on a shared, oversubscribed 2-core machine a 2-thread forward pass is several times
slower (a descheduled worker stalls every matmul), and results do not depend on the count.
"""
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTEN_RE = re.compile(r"fathom: (HTTP|gRPC) listening on (\S+):(\d+)")


def default_binary() -> Path:
    """<repo>/$FATHOM_BUILD/fathom (FATHOM_BUILD defaults to "build")."""
    return REPO_ROOT / os.environ.get("FATHOM_BUILD", "build") / "fathom"


class ServerProcess:
    def __init__(self, binary=None, model=None, extra_args=(), env=None, startup_timeout=180.0):
        self.binary = Path(binary) if binary else default_binary()
        self.model = Path(model) if model else REPO_ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"
        self.extra_args = [str(a) for a in extra_args]
        self.env = env
        self.startup_timeout = startup_timeout
        self.proc = None
        self.port = None
        self.grpc_port = None
        self._stdout, self._stderr = [], []
        self._lock = threading.Lock()
        self._http_seen = threading.Event()
        self._readers = []

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        cmd = [str(self.binary), "serve", "--model", str(self.model), "--port", "0", *self.extra_args]
        if not any(a == "--threads" or a.startswith("--threads=") for a in self.extra_args):
            cmd += ["--threads", os.environ.get("FATHOM_TEST_THREADS", "1")]
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace", env=env, cwd=str(REPO_ROOT))
        for stream, sink in ((self.proc.stdout, self._stdout), (self.proc.stderr, self._stderr)):
            t = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            t.start()
            self._readers.append(t)
        deadline = time.monotonic() + self.startup_timeout
        while not self._http_seen.wait(0.1):
            self._check_alive("before printing its HTTP port")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"fathom serve printed no HTTP port within {self.startup_timeout} s\n{self.stderr}")
        self.wait_ready(deadline - time.monotonic())
        if self._grpc_requested():  # printed before /health turns ready; let the reader catch up
            end = time.monotonic() + 5
            while self.grpc_port is None and time.monotonic() < end:
                time.sleep(0.02)

    def wait_ready(self, timeout=180.0):
        """Polls /health until it answers 200 ({"status": "ready"})."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive("while loading")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"fathom serve not ready within {timeout:.0f} s\n{self.stderr}")
            time.sleep(0.1)

    def send_signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout=120.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=5)
        return rc

    def stop(self, timeout=120.0):
        """SIGTERM, then wait (the server drains); SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # -- state -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def returncode(self):
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def stdout(self) -> str:
        with self._lock:
            return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        with self._lock:
            return "".join(self._stderr)

    # -- metrics -----------------------------------------------------------------------------
    def metric(self, name, labels=None) -> float:
        """One sample of /metrics: `name` with exactly `labels` (a dict, in exposition order)."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "") + " "
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(want):
                    return float(line.split()[-1])
        raise AssertionError(f"{want.strip()} not in /metrics")

    def settled_metric(self, name, labels=None, want=0.0, timeout=10.0) -> float:
        """The sample once it reads `want`, or its last reading after `timeout` seconds. The engine
        refreshes its gauges at the end of a step, just after publishing the step's final events:
        a client holding its answer may scrape them a moment before the refresh."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name, labels)
            if value == want or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    # -- internals ---------------------------------------------------------------------------
    def _pump(self, stream, sink):
        for line in stream:
            with self._lock:
                sink.append(line)
            m = LISTEN_RE.search(line)
            if m:
                if m.group(1) == "HTTP":
                    self.port = int(m.group(3))
                    self._http_seen.set()
                else:
                    self.grpc_port = int(m.group(3))

    def _grpc_requested(self) -> bool:
        args = self.extra_args
        for i, a in enumerate(args):
            if a == "--grpc-port" and i + 1 < len(args):
                return args[i + 1] != "0"
            if a.startswith("--grpc-port="):
                return a.split("=", 1)[1] != "0"
        return False

    def _check_alive(self, when):
        if self.proc.poll() is not None:
            for t in self._readers:
                t.join(timeout=5)
            raise RuntimeError(f"fathom serve exited with {self.proc.returncode} {when}\n"
                               f"command: {self.binary} serve --model {self.model} {' '.join(self.extra_args)}\n"
                               f"{self.stderr}")
