#!/usr/bin/env python3
"""Decode speed of speculative decoding (docs/speculative.md) against one token a step, on the same
binary, model, prompt and settings, alternating off / on within each round (the order flipped every
round), greedy. Each run is one `fathom generate --json`: decode tok/s is its generated tokens over
the time from every first token to the last (prefill excluded). Every pair's texts must be identical
(the bench stops otherwise): speculation may not change a token.

With --clients N it also serves N concurrent clients (each asking for the `edit` and the `story`
task in turn, twice) from one `fathom serve --speculative M` per mode and reports the server's
tokens/s (completion tokens over the wall time of the whole load): speculation under continuous
batching, where a verify step's extra rows compete with other sequences' tokens.

Tasks: `edit` — copy a ~1k-token text (the answer repeats the prompt: what prompt lookup is for, like
code editing or quoting a document); `story` — free writing (little repeats: what speculation costs
when drafts fail).

    .venv/bin/python bench/speculative.py --rounds 3 --clients 16 --out bench/results/speculative.md
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from policy_speed import machine  # noqa: E402

MODELS = {
    "SmolLM2 135M Q4_1": ROOT / "models/smollm2-135m-instruct-q4_1.gguf",
    "Gemma 3 270M Q4_K_M": ROOT / "models/gemma-3-270m-q4_k_m.gguf",
}
PARAGRAPH = ("The lighthouse keeper climbed the stairs every evening at six. He wound the clock, trimmed the "
             "wick and wrote the weather in his book. Ships passed in the night and never knew his name, but "
             "they knew his light. In winter the stairs were cold and the wind sang through the windows. ")
SECTIONS = ["Harbour", "Keeper", "Winter", "Ships", "Lamp", "Storm", "Spring", "Book", "Clock", "Stairs", "Light",
            "Night"]
DOCUMENT = "".join(f"## {name}\n{PARAGRAPH}\n" for name in SECTIONS)  # ~1k tokens
TASKS = {
    "edit": ("Copy the following document exactly, keeping every heading:\n\n" + DOCUMENT, 256),
    "story": ("Write a short story about a cat who learns to play the piano.", 128),
}


def run(binary, model, prompt, max_tokens, speculative, threads):
    out = subprocess.run([str(binary), "generate", "--model", str(model), "--chat",
                          json.dumps([{"role": "user", "content": prompt}]), "--max-tokens", str(max_tokens),
                          "--temperature", "0", "--threads", str(threads), "--speculative", speculative, "--json"],
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return j["decode_tokens_per_second"], j["text"], j["completion_tokens"]


def serve_throughput(binary, model, speculative, clients, threads):
    """Completion tokens per second of `clients` concurrent clients against one server."""
    proc = subprocess.Popen([str(binary), "serve", "--model", str(model), "--port", "0", "--threads", str(threads),
                             "--speculative", speculative, "--max-num-seqs", str(max(clients, 1)), "--model-name", "m"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = None
        for line in proc.stdout:
            m = re.search(r"HTTP listening on [^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                    break
            except Exception:
                time.sleep(0.2)

        def client(i):
            done = 0
            for j in range(2):
                prompt, max_tokens = TASKS["edit" if (i + j) % 2 == 0 else "story"]
                body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}],
                                   "max_tokens": max_tokens // 2, "temperature": 0}).encode()
                req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=900) as r:
                    done += json.loads(r.read())["usage"]["completion_tokens"]
            return done

        t0 = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            tokens = sum(pool.map(client, range(clients)))
        return tokens / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--clients", type=int, default=0, help="also N concurrent clients against the server (0: no)")
    ap.add_argument("--mode", default="ngram", help="the speculative mode set against off (ngram, sparse, auto, ...)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/speculative.md"), help="the markdown table (also printed)")
    a = ap.parse_args()
    binary = Path(a.build) / "fathom"
    lines = [f"Machine: {machine()}. `{' '.join(sys.argv)}`; greedy, {a.threads} threads, alternating "
             f"off / {a.mode}, {a.rounds} rounds; decode tok/s (median over rounds); texts identical in every pair.",
             "", f"| model | task | tokens | off tok/s | {a.mode} tok/s | speed-up |", "|---|---|---:|---:|---:|---:|"]
    for name in a.models.split(","):
        for task in a.tasks.split(","):
            prompt, max_tokens = TASKS[task]
            speeds = {"off": [], a.mode: []}
            tokens = 0
            for r in range(a.rounds):
                order = ["off", a.mode] if r % 2 == 0 else [a.mode, "off"]
                texts = {}
                for mode in order:
                    tps, texts[mode], tokens = run(binary, MODELS[name], prompt, max_tokens, mode, a.threads)
                    speeds[mode].append(tps)
                if texts["off"] != texts[a.mode]:
                    sys.exit(f"{name} {task}: speculative text differs from one token a step")
                print(f"{name} {task} round {r}: off {speeds['off'][-1]:.1f} {a.mode} {speeds[a.mode][-1]:.1f} tok/s",
                      flush=True)
            off, spec = statistics.median(speeds["off"]), statistics.median(speeds[a.mode])
            lines.append(f"| {name} | {task} | {tokens} | {off:.1f} | {spec:.1f} | {spec / off:.2f}× |")
    if a.clients:
        lines += ["", f"{a.clients} concurrent clients (edit and story in turn, half the tokens each), server tokens/s, "
                      f"alternating, median over {a.rounds} rounds:", "",
                  f"| model | off tok/s | {a.mode} tok/s | ratio |", "|---|---:|---:|---:|"]
        for name in a.models.split(","):
            speeds = {"off": [], a.mode: []}
            for r in range(a.rounds):
                for mode in (["off", a.mode] if r % 2 == 0 else [a.mode, "off"]):
                    speeds[mode].append(serve_throughput(binary, MODELS[name], mode, a.clients, a.threads))
                print(f"{name} {a.clients} clients round {r}: off {speeds['off'][-1]:.1f} "
                      f"{a.mode} {speeds[a.mode][-1]:.1f} tok/s", flush=True)
            off, spec = statistics.median(speeds["off"]), statistics.median(speeds[a.mode])
            lines.append(f"| {name} | {off:.1f} | {spec:.1f} | {spec / off:.2f}× |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
