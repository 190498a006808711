#!/usr/bin/env python3
"""RULER-style long-context tasks under each decode attention policy, through the OpenAI API.

Why not lm-eval: its RULER tasks need torch (a multi-GB wheel), a Hugging Face tokenizer to size
the haystack, and for most tasks essays downloaded at run time; this machine reaches only PyPI and
Debian and the models are GGUF files. The tasks here follow RULER's synthetic definitions
(Hsieh et al. 2024, "RULER: What's the real context size of your long-context language models?")
with its noise haystack, so nothing is downloaded; prompts are sized with the server's own
tokenizer (/tokenize) and sent through /v1/chat/completions or /v1/completions like any client.

Tasks (RULER's names; every value is random per trial, seeded):
  niah_multikey    4 needles "One of the special magic numbers for <word> is: <7 digits>." with
                   different keys; the question asks for one key's number (3 are distractors).
  niah_multivalue  4 needles with the same key and different numbers; all 4 must be given.
  niah_multiquery  4 needles with different keys; the numbers of all 4 keys are asked at once.
  vt               variable tracking: "VAR <A> = <5 digits>" then a chain of 3 "VAR <B> = VAR <A>"
                   hops, scattered through the noise; all 4 names holding the value must be given.
Score (RULER's string match): per trial the fraction of the expected strings found in the reply;
a cell is the mean over trials, in percent. Sparse policies are judged against dense on the same
prompts: a policy "keeps dense" where it scores >= 95% of dense's score.

One `fathom serve` per model; each prompt is sent with every policy back to back (dense first), so
the prefix cache prefills it once. Results: --out (markdown), --raw (JSON lines).

    .venv/bin/python eval/ruler_eval.py --models smollm2 --lengths 1024,2048 --trials 5
"""
import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "eval"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from passkey_eval import FILLER, GEN_MARGIN, MODELS, POLICIES, count_tokens, fathom_options, post  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402

TASKS = ["niah_multikey", "niah_multivalue", "niah_multiquery", "vt"]
WORDS = ["apple", "river", "candle", "forest", "mirror", "garden", "violin", "harbor", "lantern", "meadow",
         "pepper", "castle", "thunder", "saddle", "marble", "orchid", "falcon", "glacier", "velvet", "compass"]
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.\n")
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
MAX_TOKENS = {"niah_multikey": 24, "niah_multivalue": 48, "niah_multiquery": 48, "vt": 32}


def needle(key, value):
    return f"One of the special magic numbers for {key} is: {value}. "


def make_task(task, rng):
    """(needles, question, answer prefix for completion prompts, expected strings)."""
    if task == "vt":
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(4)]
        value = str(rng.randint(10000, 99999))
        needles = [f"VAR {names[0]} = {value}. "] + [f"VAR {names[i]} = VAR {names[i - 1]}. " for i in range(1, 4)]
        q = f"Question: Find all variables that are assigned the value {value} in the text above."
        return needles, q, f" Answer: According to the chain(s) of variable assignment in the text above, 4 variables are assigned the value {value}, they are:", names
    keys = rng.sample(WORDS, 4)
    values = [str(rng.randint(1000000, 9999999)) for _ in range(4)]
    if task == "niah_multivalue":
        needles = [needle(keys[0], v) for v in values]
        q = f"What are all the special magic numbers for {keys[0]} mentioned in the provided text?"
        return needles, q, f" The special magic numbers for {keys[0]} mentioned in the provided text are", values
    needles = [needle(k, v) for k, v in zip(keys, values)]
    if task == "niah_multikey":
        q = f"What is the special magic number for {keys[0]} mentioned in the provided text?"
        return needles, q, f" The special magic number for {keys[0]} mentioned in the provided text is", values[:1]
    listed = ", ".join(keys[:-1]) + f", and {keys[-1]}"
    q = f"What are all the special magic numbers for {listed} mentioned in the provided text?"
    return needles, q, f" The special magic numbers for {listed} mentioned in the provided text are", values


def build_text(task, n_filler, needles, depths, question, fmt, prefix):
    """The prompt text with n_filler filler sentences and each needle at its depth (0..1)."""
    slots = sorted((round(d * n_filler), i) for i, d in enumerate(depths))
    parts, at = [], 0
    for pos, i in slots:
        parts.append(FILLER * (pos - at) + needles[i])
        at = pos
    parts.append(FILLER * (n_filler - at))
    intro = VT_INTRO if task == "vt" else NIAH_INTRO
    text = intro + "".join(parts) + "\n" + question
    return text if fmt == "chat" else text + prefix


def make_prompt(base, task, fmt, length, rng):
    """A prompt of at most length − GEN_MARGIN − max_tokens tokens, its expected strings."""
    needles, question, prefix, expected = make_task(task, rng)
    depths = [rng.random() for _ in needles]
    if task == "vt":  # a chain is inserted in order: each VAR is assigned before it is copied
        depths.sort()
    target = length - GEN_MARGIN - MAX_TOKENS[task]
    a = count_tokens(base, build_text(task, 10, needles, depths, question, fmt, prefix), fmt)
    b = count_tokens(base, build_text(task, 110, needles, depths, question, fmt, prefix), fmt)
    per_rep = (b - a) / 100.0
    n = max(1, int(10 + (target - a) / per_rep))
    while True:
        text = build_text(task, n, needles, depths, question, fmt, prefix)
        tokens = count_tokens(base, text, fmt)
        if tokens <= target or n == 1:
            return text, expected, tokens
        n = max(1, n - max(1, int((tokens - target) / per_rep)))


def ask(base, fmt, text, task, policy, args):
    body = {"max_tokens": MAX_TOKENS[task], "temperature": 0, "fathom": fathom_options(policy, args.ratio, args.min_keys)}
    if fmt == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        r = post(base, "/v1/chat/completions", body)
        return r["choices"][0]["message"]["content"], r["usage"]
    body["prompt"] = text
    r = post(base, "/v1/completions", body)
    return r["choices"][0]["text"], r["usage"]


def score(reply, expected):
    low = reply.lower()
    return sum(e.lower() in low for e in expected) / len(expected)


def render(recs, args, seconds):
    policies = args.policies.split(",")
    cells = {}
    for r in recs:
        cells.setdefault((r["model"], r["length"], r["task"], r["policy"]), []).append(r["score"])
    lines = ["# RULER-style long-context tasks per decode attention policy", "",
             f"Generated by `eval/ruler_eval.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')} "
             f"({seconds / 60:.1f} min): {args.trials} trials per cell, greedy, sparse policies at kv_read_ratio "
             f"{args.ratio:g}, min_keys {'measured' if args.min_keys is None else args.min_keys}, {args.threads} "
             "thread(s). Cells: mean string-match score in percent (RULER's: the share of expected strings in "
             "the reply); **bold**: below 95% of dense on the same prompts. Task definitions: the script's "
             "docstring.", "",
             "| model | length | task | " + " | ".join(policies) + " |",
             "|---|---|---|" + "---|" * len(policies)]
    keys = sorted({(m, l, t) for (m, l, t, _) in cells}, key=lambda k: (k[0], k[1], TASKS.index(k[2])))
    for m, l, t in keys:
        dense = statistics.mean(cells.get((m, l, t, "dense"), [0.0]))
        row = []
        for p in policies:
            s = cells.get((m, l, t, p))
            if not s:
                row.append("–")
                continue
            v = statistics.mean(s)
            row.append(f"**{100 * v:.0f}**" if p != "dense" and v < 0.95 * dense else f"{100 * v:.0f}")
        lines.append(f"| {m} | {l} | {t} | " + " | ".join(row) + " |")
    summary = {}
    for (m, l, t, p), s in cells.items():
        summary.setdefault(p, []).extend(s)
    lines += ["", "Mean over every cell: " + ", ".join(f"{p} {100 * statistics.mean(summary[p]):.0f}"
                                                     for p in policies if p in summary) + "."]
    Path(args.out).write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--ratio", type=float, default=0.125)
    ap.add_argument("--min-keys", type=int, default=None, help="min_keys of sparse requests (default: measured)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default="build/fathom")
    ap.add_argument("--raw", default="", help="JSON-lines results, rewritten (default: OUT's directory/raw/"
                                              "OUT's name.jsonl, ignored by git)")
    ap.add_argument("--out", default=str(REPO / "eval/results/ruler.md"))
    args = ap.parse_args()
    start = time.monotonic()
    recs = []
    out = Path(args.out)
    raw = Path(args.raw) if args.raw else out.parent / "raw" / (out.stem + ".jsonl")
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text("")
    for model in args.models.split(","):
        gguf, fmt, _ = MODELS[model]
        with ServerProcess(REPO / args.binary, REPO / gguf, extra_args=["--threads", str(args.threads)],
                           startup_timeout=600) as server:
            for length in [int(x) for x in args.lengths.split(",")]:
                for task in args.tasks.split(","):
                    for trial in range(args.trials):
                        rng = random.Random(f"ruler-{model}-{task}-{length}-{trial}")
                        text, expected, ntok = make_prompt(server.base_url, task, fmt, length, rng)
                        for policy in args.policies.split(","):
                            reply, usage = ask(server.base_url, fmt, text, task, policy, args)
                            rec = {"model": model, "length": length, "task": task, "trial": trial, "policy": policy,
                                   "prompt_tokens": usage["prompt_tokens"], "expected": expected, "reply": reply,
                                   "score": score(reply, expected)}
                            recs.append(rec)
                            with raw.open("a") as f:
                                f.write(json.dumps(rec) + "\n")
                            print(f"{model} L={length} {task} #{trial} {policy}: {rec['score']:.2f} {reply!r}", flush=True)
                    render(recs, args, time.monotonic() - start)
    render(recs, args, time.monotonic() - start)
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
