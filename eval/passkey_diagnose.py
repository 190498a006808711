#!/usr/bin/env python3
"""Why does a sparse policy miss the pass key? Per layer and head, how much of the attention that
dense decoding puts on the needle each policy keeps (issue 20's correspondence analysis).

Builds passkey prompts exactly as eval/passkey_eval.py does (same filler, needle, question and
seeds), takes their token ids from `fathom serve`'s /tokenize (chat template for SmolLM2), and
runs `attention_quality --needles` over them, which writes the report.

    .venv/bin/python eval/passkey_diagnose.py --models smollm2,gemma3 --lengths 1024,4096 --trials 2
"""
import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "eval"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import passkey_eval as pk  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402


def prompt_ids(base, fmt, text):
    body = {"messages": [{"role": "user", "content": text}]} if fmt == "chat" else {"prompt": text}
    return pk.post(base, "/tokenize", body)["tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--only-trials", default="", help="comma-separated trial numbers to keep (default: all)")
    ap.add_argument("--seed", default="", help="passkey_eval's --seed salt, to diagnose that run's prompts")
    ap.add_argument("--decode", type=int, default=12)
    ap.add_argument("--spec-only", action="store_true",
                    help="write the prompts' spec file (<build>/passkey_diagnose.jsonl) and stop; run "
                         "attention_quality --needles on it with other flags (--hip-refresh, "
                         "--swa-prompt-seed, --sparq-r/k) to try a change")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="eval/results/passkey_diagnosis.md")
    args = ap.parse_args()
    lines = []
    for name in args.models.split(","):
        gguf, fmt, _ = pk.MODELS[name]
        with ServerProcess(REPO / args.build / "fathom", REPO / gguf, extra_args=["--grpc-port", "0"]) as server:
            cache = {}
            for length in map(int, args.lengths.split(",")):
                only = {int(t) for t in args.only_trials.split(",") if t}
                for trial in range(args.trials):
                    if only and trial not in only:
                        continue
                    salt = f"{args.seed}-" if args.seed else ""
                    rng = random.Random(f"{salt}{name}-{fmt}-{length}-{trial}")  # passkey_eval's seeds
                    text, key, depth, tokens = pk.make_prompt(server.base_url, fmt, length, rng, cache)
                    ids = prompt_ids(server.base_url, fmt, text)
                    lines.append({"name": f"{name} {length} trial {trial}", "model": str(REPO / gguf), "ids": ids,
                                  "key": str(key)})
    spec = REPO / args.build / "passkey_diagnose.jsonl"  # the prompts' token ids (regenerated each run)
    spec.write_text("".join(json.dumps(x) + "\n" for x in lines))
    if args.spec_only:
        return
    subprocess.run([str(REPO / args.build / "attention_quality"), "--needles", str(spec), "--decode",
                    str(args.decode), "--out", args.out, "--threads", "2"], check=True)


if __name__ == "__main__":
    main()
