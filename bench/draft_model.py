#!/usr/bin/env python3
"""Decode speed of the draft model (`--speculative model`, docs/speculative.md) against one token
a step: one `fathom serve --draft-model DRAFT` of TARGET, the same greedy completions asked with
`speculative` off and model in turn (the order flipped every round), `--clients` of them at once
(each its own prompt); tokens/s over the round's wall time, the draft tokens, kept drafts and
verify steps it added to the server's counters, and whether each client's texts are identical
(they must be).

    .venv/bin/python bench/draft_model.py --target ~/.cache/fathom/bench-models/smollm2-135m-instruct-q8_0.gguf \\
        --draft models/smollm2-135m-instruct-q4_1.gguf --rounds 2
(scripts/requantize_gguf.py makes the Q8_0 target from the Q4_1 file.)
"""
import argparse
import concurrent.futures as cf
import re
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from server_fixture import ServerProcess  # noqa: E402

PROMPT = "Write a short story about a cat who learns to play the piano. Once upon a time"


def counters(base):
    text = requests.get(f"{base}/metrics", timeout=30).text
    return {k: float(re.search(r'^fathom_spec_decode_%s_total\{drafter="model"\} (\S+)' % k, text, re.M).group(1))
            for k in ("draft_tokens", "accepted_tokens", "verify_steps")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=1)
    a = ap.parse_args()
    print(f"target {a.target.name}, draft {a.draft.name}, {a.clients} client(s) of {a.tokens} greedy tokens, "
          f"{a.threads} threads\n")
    print("| round | mode | tok/s | drafts | kept | verify steps |\n|---:|---|---:|---:|---:|---:|")
    with ServerProcess(ROOT / "build" / "fathom", a.target,
                       extra_args=["--threads", a.threads, "--draft-model", a.draft]) as server:
        texts = {}
        for r in range(a.rounds):
            for mode in (("off", "model") if r % 2 == 0 else ("model", "off")):
                before = counters(server.base_url)
                t0 = time.monotonic()

                def one(i):
                    prompt = PROMPT if i == 0 else f"Story {i}. {PROMPT}"
                    body = {"prompt": prompt, "max_tokens": a.tokens, "temperature": 0,
                            "fathom": {"speculative": mode, "ignore_eos": True}}
                    return requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600).json()

                with cf.ThreadPoolExecutor(a.clients) as pool:
                    outs = list(pool.map(one, range(a.clients)))
                seconds = time.monotonic() - t0
                after = counters(server.base_url)
                d = {k: after[k] - before[k] for k in after}
                for i, out in enumerate(outs):
                    texts.setdefault((mode, i), set()).add(out["choices"][0]["text"])
                print(f"| {r + 1} | {mode} | {a.clients * a.tokens / seconds:.1f} | {d['draft_tokens']:.0f} | "
                      f"{d['accepted_tokens']:.0f} | {d['verify_steps']:.0f} |")
    same = all(len(texts[("off", i)] | texts[("model", i)]) == 1 for i in range(a.clients))
    print(f"\ntexts identical: {same}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
