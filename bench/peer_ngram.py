#!/usr/bin/env python3
"""Prompt-lookup speculation against llama.cpp's own (issue 51): the `edit` task of
bench/speculative.py (copy a ~1k-token document: the answer repeats the prompt) on the same GGUF,
greedy, `--tokens` tokens with end-of-generation ignored, one request at a time, served by
`fathom serve` (speculative off / ngram) and by llama.cpp's `llama-server` (no speculation /
`--spec-type ngram-simple` / `ngram-mod`, its defaults otherwise). Every server gets a fresh process,
the configurations run in turn, their order reversed every round. Decode tok/s is the streamed
tokens after the first over the time from the first to the last (prefill excluded); `same text`
says whether a configuration's text equals its server's own text without speculation.

llama-server is the peer's, built for this benchmark only (its code stays out of the repository),
e.g. from the llama-cpp-python sdist's vendor/llama.cpp:
    cmake -S vendor/llama.cpp -B build -DGGML_NATIVE=ON && cmake --build build --target llama-server
    .venv/bin/python bench/peer_ngram.py --llama-server build/bin/llama-server --rounds 3
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
from server_fixture import ServerProcess  # noqa: E402
from speculative import TASKS  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on a free port, ready when /health answers 200."""

    def __init__(self, binary, model, threads, spec, parallel=1, ctx=4096):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [binary, "-m", model, "--port", str(self.port), "-t", str(threads), "-c", str(ctx), "-np",
                str(parallel), "--no-webui"]
        self.proc = subprocess.Popen(args + (["--spec-type", spec] if spec else []), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def __enter__(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("llama-server did not come up")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:  # seen once: llama-server ignored SIGTERM for a minute
            self.proc.kill()
            self.proc.wait(60)


def stream_completion(base_url, body, timeout=600):
    """Yields (arrival time, text) of every non-empty text chunk of one streamed /v1/completions request."""
    req = urllib.request.Request(f"{base_url}/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            piece = (chunk.get("choices") or [{}])[0].get("text") or ""
            if piece:
                yield time.monotonic(), piece


def decode_speed(base_url, body):
    """(decode tok/s, text) of one streamed /v1/completions request."""
    chunks = list(stream_completion(base_url, body))
    times, text = [t for t, _ in chunks], "".join(p for _, p in chunks)
    return body["max_tokens"] - 1 if len(times) < 2 else (body["max_tokens"] - 1) / (times[-1] - times[0]), text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    prompt = TASKS["edit"][0]
    configs = [("fathom", "off"), ("fathom", "ngram"), ("llama.cpp", None), ("llama.cpp", "ngram-simple"),
               ("llama.cpp", "ngram-mod")]
    speeds = {c: [] for c in configs}
    texts = {c: set() for c in configs}
    for r in range(a.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            server, spec = c
            body = {"prompt": prompt, "max_tokens": a.tokens, "temperature": 0}
            if server == "fathom":
                body["fathom"] = {"speculative": spec, "ignore_eos": True}
                ctx = ServerProcess(ROOT / "build" / "fathom", a.model,
                                    extra_args=["--threads", a.threads, "--grpc-port", "-1", "--no-prefix-caching"])
            else:
                body["ignore_eos"] = True
                body["cache_prompt"] = False
                ctx = LlamaServer(a.llama_server, a.model, a.threads, spec)
            with ctx as s:
                decode_speed(s.base_url, {**body, "max_tokens": 8})  # warm-up
                speed, text = decode_speed(s.base_url, body)
            speeds[c].append(speed)
            texts[c].add(text)
            print(f"round {r + 1} {server} {spec}: {speed:.1f} tok/s", file=sys.stderr)
    print(f"{Path(a.model).name}, edit task, {a.tokens} greedy tokens, {a.threads} threads, {a.rounds} rounds "
          f"(median, min-max)\n")
    print("| server | speculation | decode tok/s | × its own plain | same text |\n|---|---|---:|---:|---|")
    for c in configs:
        plain = (c[0], "off" if c[0] == "fathom" else None)
        med = statistics.median(speeds[c])
        print(f"| {c[0]} | {c[1] or 'none'} | {med:.1f} ({min(speeds[c]):.1f}-{max(speeds[c]):.1f}) | "
              f"{med / statistics.median(speeds[plain]):.2f}× | {texts[c] == texts[plain]} |")


if __name__ == "__main__":
    main()
