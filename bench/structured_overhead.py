#!/usr/bin/env python3
"""Per-token cost of grammar-constrained decoding at batch 16 (issue 19's target: < 5%).

Starts `fathom serve` (SmolLM2, 2 threads) and alternates, --rounds times, two requests of
n = 16 choices × 64 tokens from the same short prompt with ignore_eos:
  free         no constraint;
  record       an extraction-style JSON Schema: an object of 40 required string fields, which
               cannot complete within 64 tokens, so all 16 sequences are constrained every step;
  long string  {"text": a string of minLength 400}: the costly case for xgrammar, whose bounded
               repetition makes each accepted token cost ~4x more than in a plain string.
Every constrained step computes 16 masks over the whole vocabulary.
Reports milliseconds per step (wall time ÷ 64 steps, the longest choice; prefill of the short
prompt included in both) for each, and the overhead. Writes bench/results/structured_overhead.md.

usage: bench/structured_overhead.py [--rounds 3] [--build build]
"""
import argparse
import pathlib
import statistics
import sys
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from server_fixture import ServerProcess  # noqa: E402

# Neither schema can be completed within 64 tokens: every choice runs 64 steps.
SCHEMAS = {
    "record": {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(40)},
               "required": [f"field_{i}" for i in range(40)]},
    "long string": {"type": "object", "properties": {"text": {"type": "string", "minLength": 400}},
                    "required": ["text"]},
}


def run(base, schema):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "n": 16, "max_tokens": 64,
            "temperature": 1.0, "seed": 7, "ignore_eos": True}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    t0 = time.perf_counter()
    r = requests.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    usage = r.json()["usage"]
    # The request lasts as long as its longest choice: 64 steps when any choice hit max_tokens.
    choices = r.json()["choices"]
    steps = 64 if any(c["finish_reason"] == "length" for c in choices) else usage["completion_tokens"] / 16
    return elapsed * 1e3 / steps, usage["completion_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    kinds = {"free": None, **SCHEMAS}
    ms = {k: [] for k in kinds}
    tokens = []
    with ServerProcess(ROOT / args.build / "fathom", extra_args=["--threads", "2", "--grpc-port", "0"]) as server:
        for schema in kinds.values():
            run(server.base_url, schema)  # warm-up; compiles each schema once (cached afterwards)
        for _ in range(args.rounds):
            for kind, schema in kinds.items():  # alternating, so drift hits every kind alike
                m, n = run(server.base_url, schema)
                ms[kind].append(m)
                if schema is not None:
                    tokens.append(n)
    free = statistics.median(ms["free"])
    rows = [f"| {k} | {statistics.median(v):.1f} | {100 * (statistics.median(v) - free) / free:+.1f}% | "
            f"{', '.join(f'{x:.1f}' for x in v)} |" for k, v in ms.items()]
    text = "\n".join([
        "# Grammar-constrained decoding overhead at batch 16",
        "",
        f"`bench/structured_overhead.py --rounds {args.rounds}` ({time.strftime('%Y-%m-%d')}; SmolLM2 135M, 2 threads, "
        "n = 16 choices × 64 tokens, ignore_eos, alternating free / record / long string; neither schema can "
        "complete within 64 tokens, so all 16 sequences compute a full-vocabulary mask every step; "
        f"constrained runs produced {min(tokens)}–{max(tokens)} tokens).",
        "",
        "| | ms per decode step (median) | vs free | runs |",
        "|---|---|---|---|",
        *rows,
        "",
        "Target: < 5% per step. On the CPU backend the masks are computed right before they are applied, "
        "after the forward pass (engine/scheduler.cpp): the forward keeps both cores busy, and computing them "
        "on a second thread during it measured +6.4% for the record schema (2026-11-26, 5 rounds) against "
        "+1.7% inline; a device backend overlaps them with its forward. Timers around each part "
        "(2026-11-26): masks 0.06–0.13 ms for all 16 sequences, applying a mask 7 µs, accepting a token "
        "9 µs in a plain string vs 40 µs inside the minLength-400 string (xgrammar's bounded repetition): "
        "the long-string case's cost is that accept, on the critical path.",
        "",
    ])
    (ROOT / "bench" / "results" / "structured_overhead.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
