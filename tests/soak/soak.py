#!/usr/bin/env python3
"""Load and fault soak for `fathom serve` (make soak; loopback only, not part of make test).

For --minutes (default 3), client threads run a mix against one server:
  short     short chat requests, streamed, TTFT recorded
  long      ~1,500-token completions, non-streaming
  cancel    streams closed by the client after a few tokens
  abandon   non-streaming requests whose socket is closed mid-generation
  slow      streams read one line every 0.3 s
  junk      malformed HTTP / JSON / oversized bodies (must get 4xx, never 5xx)
Checks at the end (exit 1 with the reasons when any fails):
  - no request lost: every request a client sent ended (a response, a 429 with Retry-After,
    or the client's own cancellation) before its 120 s deadline; no 5xx;
  - the server drained: fathom_requests_running and fathom_requests_waiting are 0;
  - memory bounded: RSS at the end within 64 MiB of RSS after the first minute;
  - stable short TTFT: p95 in the last third within 2x (+0.2 s) of the first third;
  - /health answered within 100 ms throughout (probed every 0.5 s).
Writes bench/results/soak.md.

usage: tests/soak/soak.py [--minutes 3] [--build build]
"""
import argparse
import json
import pathlib
import random
import re
import socket
import sys
import threading
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from server_fixture import ServerProcess  # noqa: E402

DEADLINE = 120.0


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []
        self.ttft = []  # (time, seconds)
        self.health = []  # (time, ms)

    def count(self, kind, outcome):
        with self.lock:
            self.counts[(kind, outcome)] = self.counts.get((kind, outcome), 0) + 1

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(what)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metric(base, name):
    text = requests.get(f"{base}/metrics", timeout=5).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def run_client(kind, base, port, stop, stats, rng):
    long_text = "The history of the river valley is long and full of change. " * 120
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if kind == "short":
                with requests.post(f"{base}/v1/chat/completions", stream=True, timeout=DEADLINE,
                                   json={"messages": [{"role": "user", "content": f"Say hi #{rng.random()}"}],
                                         "max_tokens": 8, "stream": True}) as r:
                    if r.status_code == 429:
                        stats.count(kind, "429")
                        time.sleep(0.2)
                        continue
                    if r.status_code != 200:
                        raise RuntimeError(f"status {r.status_code}")
                    first = None
                    for line in r.iter_lines():
                        if first is None and line.startswith(b"data: {"):
                            first = time.monotonic() - t0
                        if line == b"data: [DONE]":
                            break
                    else:
                        raise RuntimeError("stream ended without [DONE]")
                    with stats.lock:
                        stats.ttft.append((time.monotonic(), first))
                    stats.count(kind, "ok")
            elif kind == "long":
                r = requests.post(f"{base}/v1/completions", timeout=DEADLINE,
                                  json={"prompt": f"{rng.random()} " + long_text, "max_tokens": 16})
                if r.status_code not in (200, 429):
                    raise RuntimeError(f"status {r.status_code}: {r.text[:200]}")
                stats.count(kind, str(r.status_code))
            elif kind in ("cancel", "slow"):
                with requests.post(f"{base}/v1/completions", stream=True, timeout=DEADLINE,
                                   json={"prompt": "Count slowly:", "max_tokens": 64, "ignore_eos": True,
                                         "stream": True}) as r:
                    if r.status_code not in (200, 429):
                        raise RuntimeError(f"status {r.status_code}")
                    n = 0
                    for line in r.iter_lines():
                        n += 1
                        if kind == "cancel" and n >= 4:
                            break
                        if kind == "slow":
                            time.sleep(0.3)
                    stats.count(kind, "ok" if r.status_code == 200 else "429")
            elif kind == "abandon":
                body = json.dumps({"prompt": "Write an essay:", "max_tokens": 200, "ignore_eos": True}).encode()
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                time.sleep(rng.uniform(0.2, 1.5))
                s.close()
                stats.count(kind, "ok")
            elif kind == "junk":
                choice = rng.randrange(4)
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                payload = [b"GARBAGE\r\n\r\n",
                           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"prompt\"",
                           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
                           b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n[1]"][choice]
                s.sendall(payload)
                s.settimeout(10)
                data = s.recv(4096)
                s.close()
                m = re.match(rb"HTTP/1\.1 (\d{3})", data)
                if not m or not (400 <= int(m.group(1)) < 500):
                    raise RuntimeError(f"junk {choice} got {data[:80]!r}")
                stats.count(kind, m.group(1).decode())
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            stats.fail(f"{kind}: {type(e).__name__}: {e}")
            stats.count(kind, "FAILED")
        if time.monotonic() - t0 > DEADLINE:
            stats.fail(f"{kind}: took {time.monotonic() - t0:.0f} s")


def probe_health(base, port, stop, stats):
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                s.recv(1024)
            with stats.lock:
                stats.health.append((time.monotonic(), (time.perf_counter() - t0) * 1e3))
        except OSError as e:
            stats.fail(f"health: {e}")
        time.sleep(0.5)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    mix = ["short"] * 3 + ["long"] * 2 + ["cancel", "abandon", "slow", "junk"]
    stats = Stats()
    stop = threading.Event()
    with ServerProcess(ROOT / args.build / "fathom", extra_args=["--threads", "2", "--grpc-port", "0",
                                                                 "--max-num-seqs", "8", "--max-queue", "16"]) as server:
        base, port, pid = server.base_url, server.port, server.proc.pid
        threads = [threading.Thread(target=run_client, args=(k, base, port, stop, stats, random.Random(i)), daemon=True)
                   for i, k in enumerate(mix)]
        threads.append(threading.Thread(target=probe_health, args=(base, port, stop, stats), daemon=True))
        start = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(min(60.0, args.minutes * 60 / 3))
        rss_warm = rss_kib(pid)
        time.sleep(max(0.0, args.minutes * 60 - (time.monotonic() - start)))
        stop.set()
        for t in threads:
            t.join(timeout=DEADLINE + 10)
        hung = [t.name for t in threads if t.is_alive()]
        end = time.monotonic()
        time.sleep(2.0)  # cancellations land
        rss_end = rss_kib(pid)
        running, waiting = metric(base, "fathom_requests_running"), metric(base, "fathom_requests_waiting")

    reasons = list(stats.failures)
    if hung:
        reasons.append(f"client threads still running after the deadline: {hung}")
    if running != 0 or waiting != 0:
        reasons.append(f"not drained: running {running}, waiting {waiting}")
    if rss_end - rss_warm > 64 * 1024:
        reasons.append(f"RSS grew {(rss_end - rss_warm) / 1024:.0f} MiB after warm-up")
    third = (end - start) / 3
    early = [t for at, t in stats.ttft if at < start + third]
    late = [t for at, t in stats.ttft if at >= end - third]
    if early and late and pct(late, 0.95) > 2 * pct(early, 0.95) + 0.2:
        reasons.append(f"short TTFT p95 drifted: {pct(early, .95):.3f} s -> {pct(late, .95):.3f} s")
    slow_health = [ms for _, ms in stats.health if ms > 100]
    if slow_health:
        reasons.append(f"/health over 100 ms {len(slow_health)} times (max {max(slow_health):.0f} ms)")

    total = sum(stats.counts.values())
    lines = ["# Soak: mixed load and faults", "",
             f"`tests/soak/soak.py --minutes {args.minutes:g}` ({time.strftime('%Y-%m-%d')}; SmolLM2, 2 threads, "
             "max_num_seqs 8, max_queue 16; clients: 3 short streams, 2 long prompts, 1 cancelling, 1 abandoning, "
             "1 slow reader, 1 junk sender).", "",
             f"- requests: {total}, by kind and outcome: " +
             ", ".join(f"{k}/{o} {n}" for (k, o), n in sorted(stats.counts.items())),
             f"- short TTFT p50 / p95: first third {pct(early, .5):.3f} / {pct(early, .95):.3f} s, "
             f"last third {pct(late, .5):.3f} / {pct(late, .95):.3f} s",
             f"- /health: {len(stats.health)} probes, max {max((ms for _, ms in stats.health), default=0):.1f} ms",
             f"- RSS: {rss_warm / 1024:.0f} MiB after warm-up, {rss_end / 1024:.0f} MiB at the end",
             f"- at the end: running {running:g}, waiting {waiting:g}",
             f"- result: **{'PASS' if not reasons else 'FAIL'}**", ""]
    lines += [f"  - {r}" for r in reasons]
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "soak.md").write_text(text)
    print(text)
    sys.exit(1 if reasons else 0)


if __name__ == "__main__":
    main()
