#!/usr/bin/env python3
"""Short-request time to first token (TTFT) alone and behind long prompts being prefilled.

Starts `fathom serve` (SmolLM2, default config, 2 threads), then measures, over HTTP streaming:
  unloaded    TTFT of a short chat request (~20 prompt tokens, 8 new tokens) with nothing else running;
  loaded      the same while a ~3,000-token prompt is always being prefilled: a background client
              keeps sending long prompts (each distinct, so no prefix-cache hit) back to back;
  one chunk   the time of one prefill chunk (scheduler.max_batched_tokens tokens) measured as the
              TTFT of a prompt of exactly that many tokens alone.
The issue's target: loaded p95 <= 2 x unloaded p95 + one chunk. Writes
bench/results/ttft_under_load.md (and prints it).

usage: bench/ttft_under_load.py [--samples 30] [--build build]
"""
import argparse
import json
import pathlib
import statistics
import sys
import threading
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from server_fixture import ServerProcess  # noqa: E402


def ttft(base, messages=None, prompt=None, max_tokens=8):
    body = {"max_tokens": max_tokens, "stream": True, "temperature": 0}
    if messages is not None:
        url = f"{base}/v1/chat/completions"
        body["messages"] = messages
    else:
        url = f"{base}/v1/completions"
        body["prompt"] = prompt
    t0 = time.perf_counter()
    with requests.post(url, json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                first = time.perf_counter() - t0
                for _ in r.iter_lines():
                    pass
                return first
    raise RuntimeError("no token")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--build", default="build")
    ap.add_argument("--long-tokens", type=int, default=3000)
    args = ap.parse_args()
    config = json.loads((ROOT / "configs" / "default.json").read_text())
    chunk = config["scheduler"]["max_batched_tokens"]

    with ServerProcess(ROOT / args.build / "fathom", extra_args=["--config", str(ROOT / "configs/default.json"),
                                                                 "--threads", "2", "--grpc-port", "0"]) as server:
        base = server.base_url
        tok = lambda text: requests.post(f"{base}/tokenize", json={"prompt": text}, timeout=60).json()["count"]
        # Prompts of known token counts, each distinct (a leading counter defeats the prefix cache).
        unit = "The quick brown fox jumps over the lazy dog. "
        per_unit = max(1, tok(unit * 10) // 10)

        def long_prompt(i, tokens):
            return f"{i} " + unit * (tokens // per_unit)

        short = lambda i: [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]
        for i in range(3):  # warm-up
            ttft(base, messages=short(-1 - i))

        unloaded = [ttft(base, messages=short(i)) for i in range(args.samples)]
        one_chunk = statistics.median(ttft(base, prompt=long_prompt(10_000 + i, chunk), max_tokens=1) for i in range(5))
        long_alone = ttft(base, prompt=long_prompt(20_000, args.long_tokens), max_tokens=1)

        stop = threading.Event()
        long_done = []

        def background():
            i = 30_000
            while not stop.is_set():
                t = ttft(base, prompt=long_prompt(i, args.long_tokens), max_tokens=1)
                long_done.append(t)
                i += 1

        bg = [threading.Thread(target=background, daemon=True)]
        bg[0].start()
        time.sleep(1.0)  # the first long prompt is prefilling
        loaded = []
        for i in range(args.samples):
            loaded.append(ttft(base, messages=short(1000 + i)))
            time.sleep(0.1)
        stop.set()
        bg[0].join(timeout=600)

    u95, l95 = pct(unloaded, 0.95), pct(loaded, 0.95)
    target = 2 * u95 + one_chunk
    lines = [
        "# Short-request TTFT behind long prompts (fair chunked prefill)",
        "",
        f"`bench/ttft_under_load.py --samples {args.samples}`: SmolLM2 135M Q4_1, configs/default.json "
        f"(max_batched_tokens {chunk}), 2 threads, {time.strftime('%Y-%m-%d')}. Short request: a one-line chat "
        f"question, 8 new tokens, streamed; long prompts: {args.long_tokens} tokens, distinct, sent back to back "
        "so one is always prefilling.",
        "",
        "| | p50 (s) | p95 (s) | max (s) |",
        "|---|---|---|---|",
        f"| short, unloaded | {pct(unloaded, 0.5):.3f} | {u95:.3f} | {max(unloaded):.3f} |",
        f"| short, behind {args.long_tokens}-token prompts | {pct(loaded, 0.5):.3f} | {l95:.3f} | {max(loaded):.3f} |",
        f"| one prefill chunk ({chunk} tokens) alone | {one_chunk:.3f} | | |",
        f"| one {args.long_tokens}-token prompt alone (TTFT) | {long_alone:.3f} | | |",
        f"| long prompts' TTFT while short ones ran (n={len(long_done)}) | "
        f"{pct(long_done, 0.5) if long_done else float('nan'):.3f} | | {max(long_done) if long_done else float('nan'):.3f} |",
        "",
        f"Target (issue 17): loaded p95 ≤ 2 × unloaded p95 + one chunk = {target:.3f} s; measured {l95:.3f} s: "
        f"**{'met' if l95 <= target else 'NOT met'}**.",
        "",
    ]
    text = "\n".join(lines)
    out = ROOT / "bench" / "results" / "ttft_under_load.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
