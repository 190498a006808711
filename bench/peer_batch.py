#!/usr/bin/env python3
"""Serving throughput under concurrent clients against llama.cpp's llama-server (issue 50): N
clients at once (N = 1, 4, 16 by default), each one streamed /v1/completions request of a distinct
~100-token prompt and `--tokens` greedy tokens with end-of-generation ignored, on the same GGUF,
served by `fathom serve` (dense attention, no speculation) and by `llama-server -np <most clients>`
(continuous batching, its defaults otherwise). Every round starts each server afresh, runs the client
counts in turn, and alternates which server goes first.

Two figures per run:
- wall tok/s: all clients' completion tokens over the time from the first request to the last
  token (prefill included, what a client population sees);
- decode tok/s: tokens streamed while every client was decoding (from the last client's first
  token to the first client's last token) over that window: the batched decode step's speed.

llama-server is the peer's, built for benchmarks only (its code stays out of the repository), e.g.
from the llama-cpp-python sdist's vendor/llama.cpp:
    cmake -S vendor/llama.cpp -B build -DGGML_NATIVE=ON && cmake --build build --target llama-server
    .venv/bin/python bench/peer_batch.py --llama-server build/bin/llama-server \\
        --model ~/.cache/fathom/bench-models/llama-3.2-1b-q4_k_m.gguf
"""
import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
from peer_ngram import LlamaServer, stream_completion  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402

WORDS = ("river stone lantern orchard harbor meadow signal copper window garden ladder winter "
         "falcon market engine silver canyon thunder pocket candle").split()


def prompt_for(client):
    """A distinct ~100-token prompt (no two clients share a prefix a cache could reuse)."""
    words = [WORDS[(client * 7 + i * (client + 3)) % len(WORDS)] for i in range(90)]
    return f"Client {client}: " + " ".join(words)


def stream(base_url, body, stamps):
    """Streams one /v1/completions request; appends the arrival time of every text chunk."""
    stamps.extend(t for t, _ in stream_completion(base_url, body, timeout=1800))


def run_clients(base_url, clients, body_for):
    """(wall tok/s, decode tok/s or None) of `clients` concurrent streamed requests."""
    stamps = [[] for _ in range(clients)]
    threads = [threading.Thread(target=stream, args=(base_url, body_for(c), stamps[c])) for c in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(len(s) < 2 for s in stamps):
        raise RuntimeError("a client got fewer than two chunks")
    total = sum(len(s) for s in stamps)
    wall = total / (max(s[-1] for s in stamps) - t0)
    start, end = max(s[0] for s in stamps), min(s[-1] for s in stamps)
    inside = sum(1 for s in stamps for t in s if start < t <= end)
    return wall, (inside / (end - start) if end > start and inside else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    counts = [int(c) for c in a.clients.split(",")]
    most = max(counts)
    results = {(s, n): [] for s in ("fathom", "llama.cpp") for n in counts}
    for r in range(a.rounds):
        for server in ("fathom", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "fathom"):
            base = {"max_tokens": a.tokens, "temperature": 0}
            if server == "fathom":
                extra = {"fathom": {"ignore_eos": True}}
                ctx = ServerProcess(ROOT / "build" / "fathom", a.model,
                                    extra_args=["--threads", a.threads, "--grpc-port", "-1", "--attention", "dense"])
            else:
                extra = {"ignore_eos": True, "cache_prompt": False}
                ctx = LlamaServer(a.llama_server, a.model, a.threads, None, parallel=most, ctx=most * 256)
            with ctx as s:
                run_clients(s.base_url, 1, lambda c: {**base, **extra, "prompt": "warm up", "max_tokens": 4})
                for n in counts:
                    wall, decode = run_clients(s.base_url, n, lambda c: {**base, **extra, "prompt": prompt_for(c)})
                    results[(server, n)].append((wall, decode))
                    print(f"round {r + 1} {server} {n} clients: wall {wall:.1f} tok/s, decode "
                          f"{decode or float('nan'):.1f} tok/s", file=sys.stderr)
    print(f"{Path(a.model).name}, {a.tokens} greedy tokens a client, ~100-token prompts, {a.threads} threads, "
          f"{a.rounds} rounds (median, min-max)\n")
    print("| clients | fathom wall tok/s | llama.cpp wall tok/s | fathom decode tok/s | llama.cpp decode tok/s "
          "| fathom ÷ llama.cpp (decode) |\n|---:|---:|---:|---:|---:|---:|")

    def cell(vals):
        vals = [v for v in vals if v is not None]
        return (f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})", statistics.median(vals)) if vals \
            else ("–", None)

    for n in counts:
        fw, lw = cell([w for w, _ in results[("fathom", n)]]), cell([w for w, _ in results[("llama.cpp", n)]])
        fd, ld = cell([d for _, d in results[("fathom", n)]]), cell([d for _, d in results[("llama.cpp", n)]])
        ratio = f"{fd[1] / ld[1]:.2f}×" if fd[1] and ld[1] else "–"
        print(f"| {n} | {fw[0]} | {lw[0]} | {fd[0]} | {ld[0]} | {ratio} |")


if __name__ == "__main__":
    main()
