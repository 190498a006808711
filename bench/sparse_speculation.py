#!/usr/bin/env python3
"""Decode speed of the sparse drafter (docs/speculative.md) at long context: dense decoding (the
model's exact output) against `--speculative sparse` (drafts through `auto` at 1/16 of the KV,
verified densely: the same output), adaptive k and fixed k = 4, and for reference plain `auto` at
1/16 (lossy: its text may differ). Same binary, model, prompt and settings, the modes in turn
within each round (the order rotated every round), greedy, `--ignore-eos` so every run decodes the
same number of tokens. `--attention-min-keys 0` keeps the break-even measurement out of the timed
decode. Each run is one `fathom generate --json`: decode tok/s excludes the prefill. The dense and
speculative texts must be identical (the bench stops otherwise).

    .venv/bin/python bench/sparse_speculation.py --rounds 2 --out bench/results/sparse_speculation.md
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from policy_speed import machine  # noqa: E402

MODEL = ROOT / "models/smollm2-135m-instruct-q4_1.gguf"
MODES = {
    "dense": ["--attention", "dense"],
    "sparse spec": ["--speculative", "sparse"],
    "sparse spec, k=4": ["--speculative", "sparse", "--fixed-drafts"],
    "auto 1/16 (lossy)": ["--attention", "auto", "--kv-read-ratio", "0.0625"],
}
EXACT = ["dense", "sparse spec", "sparse spec, k=4"]


def log_prompt(lines):
    text = "".join(f"Line {i}: the robot counted gears and wrote the number {i * 7} in the log. " for i in range(lines))
    return json.dumps([{"role": "user", "content": text + " Summarize the log in a few sentences."}])


def run(binary, model, chat, max_tokens, threads, extra):
    out = subprocess.run([str(binary), "generate", "--model", str(model), "--chat", chat, "--max-tokens",
                          str(max_tokens), "--temperature", "0", "--ignore-eos", "--attention-min-keys", "0",
                          "--threads", str(threads), "--json", *extra], capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return j["decode_tokens_per_second"], j["text"], j["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--lines", default="180,330", help="prompt sizes in log lines (~22 tokens each)")
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--modes", default=",".join(MODES), help="a comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "bench/results/sparse_speculation.md"), help="the markdown table (also printed)")
    a = ap.parse_args()
    binary = Path(a.build) / "fathom"
    names = a.modes.split(",")
    if "dense" not in names or any(m not in MODES for m in names):
        sys.exit(f"--modes: dense and any of {', '.join(MODES)}")
    lines = [f"Machine: {machine()}. `{' '.join(sys.argv)}`; {Path(a.model).name}, greedy, {a.tokens} tokens, "
             f"{a.threads} threads, modes in turn, {a.rounds} rounds; decode tok/s (median); dense and speculative "
             "texts identical.", "",
             "| prompt tokens | " + " | ".join(names) + " | sparse spec ÷ dense |",
             "|---:|" + "---:|" * (len(names) + 1)]
    for n in (int(x) for x in a.lines.split(",")):
        chat = log_prompt(n)
        speeds = {m: [] for m in names}
        prompt_tokens = 0
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            texts = {}
            for m in order:
                tps, texts[m], prompt_tokens = run(binary, a.model, chat, a.tokens, a.threads, MODES[m])
                speeds[m].append(tps)
            if any(texts[m] != texts["dense"] for m in EXACT if m in texts):
                sys.exit(f"{n} lines: a speculative text differs from dense decoding")
            print(f"{prompt_tokens} tokens round {r}: " + ", ".join(f"{m} {speeds[m][-1]:.1f}" for m in names), flush=True)
        med = {m: statistics.median(v) for m, v in speeds.items()}
        lines.append(f"| {prompt_tokens} | " + " | ".join(f"{med[m]:.1f}" for m in names) +
                     f" | {med['sparse spec'] / med['dense']:.2f}× |" if "sparse spec" in med else " | — |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
