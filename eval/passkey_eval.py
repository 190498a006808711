#!/usr/bin/env python3
"""Passkey retrieval (needle in a haystack) under each decode attention policy.

A random 5-digit pass key is hidden at a random depth in filler text ("The grass is green. The
sky is blue. ..." repeated, as in Mohtashami & Jaggi's passkey task), followed by a question
asking for it. The answer is correct when the first 5-digit number in the greedy reply is the key.
One `fathom serve` per model; for every trial the same prompt is sent with each policy back to
back (dense first), so the server's prefix cache prefills it once and the sparse policies only
decode (the cached prompt tokens each request reports are recorded).

Per (model, length) the first --check-trials trials decide whether the model can do the task
densely: below --min-dense accuracy the remaining trials are skipped (and, unless --no-skip,
the longer lengths of that model too), since a sparse policy cannot be judged where dense fails.

Every request's result is appended to --raw (JSON lines; by default OUT's directory/raw/, which git
ignores); a rerun with the same settings (ratio, min_keys, fathom options, seed, threads) skips
what it already holds, and the markdown table (--out) is rewritten from it after every trial, so
an interrupted run leaves a valid partial table.

    .venv/bin/python eval/passkey_eval.py --models smollm2,gemma3 --trials 20
    .venv/bin/python eval/passkey_eval.py --models smollm2 --lengths 1024,2048 --trials 3
    .venv/bin/python eval/passkey_eval.py --render-only
"""
import argparse
import json
import random
import re
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from server_fixture import ServerProcess  # noqa: E402

MODELS = {
    # name: (gguf, prompt format, default lengths)
    "smollm2": ("models/smollm2-135m-instruct-q4_1.gguf", "chat", [1024, 2048, 4096, 8192]),
    "gemma3": ("models/gemma-3-270m-q4_k_m.gguf", "completion", [1024, 2048, 4096, 8192, 16384, 32768]),
}
POLICIES = ["dense", "sparq", "hip", "alisa", "auto"]
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = {"chat": "\n\nWhat is the pass key? Answer with the 5-digit number only.",
            "completion": "\n\nWhat is the pass key? The pass key is"}
MAX_TOKENS = 12
GEN_MARGIN = 16  # prompt = length − margin tokens, so the reply fits a context of `length`


def post(base, path, body, timeout=7200):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def build_text(n_filler, depth_reps, key, fmt):
    hay = FILLER * depth_reps + NEEDLE.format(key=key) + FILLER * (n_filler - depth_reps)
    return INTRO + hay + QUESTION[fmt]


def count_tokens(base, text, fmt):
    body = {"messages": [{"role": "user", "content": text}]} if fmt == "chat" else {"prompt": text}
    return post(base, "/tokenize", body)["count"]


def make_prompt(base, fmt, length, rng, per_rep_cache):
    """A prompt of at most length − GEN_MARGIN tokens (as close as whole filler sentences allow)."""
    target = length - GEN_MARGIN
    key = rng.randint(10000, 99999)
    if fmt not in per_rep_cache:
        a, b = count_tokens(base, build_text(10, 5, 12345, fmt), fmt), count_tokens(base, build_text(110, 5, 12345, fmt), fmt)
        per_rep_cache[fmt] = ((b - a) / 100.0, a - 10 * (b - a) / 100.0)
    per_rep, overhead = per_rep_cache[fmt]
    n = max(1, int((target - overhead) / per_rep))
    depth = rng.random()
    while True:
        text = build_text(n, round(depth * n), key, fmt)
        tokens = count_tokens(base, text, fmt)
        if tokens <= target or n == 1:
            return text, key, depth, tokens
        n -= max(1, int((tokens - target) / per_rep))


# Named variants of a policy, for side-by-side columns: name -> (policy, its options).
VARIANTS = {"sparq-paper": ("sparq", {"sparq": {"key_spread": False}})}  # SparQ's step 1 as the paper


def fathom_options(policy, ratio, min_keys=None, extra="{}"):
    """The request's "fathom" object: the policy (or a VARIANTS name), and for a sparse one its
    ratio, min_keys (None: the server's measured default) and the extra options (a JSON object)."""
    if policy == "dense":
        return {"attention": policy}
    policy, variant = VARIANTS.get(policy, (policy, {}))
    return {"attention": policy, "kv_read_ratio": ratio} | ({} if min_keys is None else {"min_keys": min_keys}) \
        | variant | json.loads(extra)


def ask(base, fmt, text, policy, ratio, min_keys, extra):
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, "fathom": fathom_options(policy, ratio, min_keys, extra)}
    if fmt == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        r = post(base, "/v1/chat/completions", body)
        reply = r["choices"][0]["message"]["content"]
    else:
        body["prompt"] = text
        r = post(base, "/v1/completions", body)
        reply = r["choices"][0]["text"]
    usage = r.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return reply, usage.get("prompt_tokens", 0), cached


def load_raw(paths):
    recs = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    recs.append(json.loads(line))
    return recs


def render(recs, out, args, status):
    cells = defaultdict(lambda: defaultdict(list))  # (model, fmt, length) -> policy -> [correct]
    meta = defaultdict(lambda: {"tokens": [], "seconds": 0.0, "skipped": None, "cached": [], "trials": set()})
    for r in recs:
        k = (r["model"], r["format"], r["length"])
        if r.get("skipped"):
            meta[k]["skipped"] = r["skipped"]
            continue
        cells[k][r["policy"]].append(bool(r["correct"]))
        meta[k]["seconds"] += r["seconds"]
        meta[k]["trials"].add(r["trial"])
        if r["policy"] == "dense":
            meta[k]["tokens"].append(r["prompt_tokens"])
        else:
            meta[k]["cached"].append(r["cached_tokens"] / max(1, r["prompt_tokens"]))
    lines = ["# Passkey retrieval under sparse decode attention", "",
             f"Generated by `eval/passkey_eval.py` ({status}). A random 5-digit pass key at a random depth in "
             "repeated filler (\"The grass is green. The sky is blue. ...\"), then a question; correct when the first "
             "5-digit number of the greedy reply (temperature 0, up to "
             f"{MAX_TOKENS} tokens) is the key. Sparse policies at kv_read_ratio {args.ratio}; one `fathom serve` "
             f"per model ({args.threads} thread(s), default f16 KV), the policies sent back to back per prompt "
             "so the prefix cache prefills it once. Seeds: Python `random.Random(f\"{salt}{model}-{format}-{length}-{trial}\")` "
             f"picks key and depth (salt: {repr(args.seed + '-') if args.seed else 'none'}). Cells: correct/trials.", "",
             "| model | prompt | length | prompt tokens | " + " | ".join(POLICIES) + " | cached (sparse) | time | note |",
             "|---|---|---|---|" + "---|" * len(POLICIES) + "---|---|---|"]
    keys = sorted(set(cells) | set(meta), key=lambda k: (k[0], k[1], k[2]))
    for k in keys:
        c, m = cells[k], meta[k]
        def cell(p):
            v = c.get(p, [])
            return f"{sum(v)}/{len(v)}" if v else "–"
        tok = f"{sum(m['tokens']) / len(m['tokens']):.0f}" if m["tokens"] else "–"
        cached = f"{100 * sum(m['cached']) / len(m['cached']):.0f}%" if m["cached"] else "–"
        note = m["skipped"] or ""
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {tok} | " + " | ".join(cell(p) for p in POLICIES) +
                     f" | {cached} | {m['seconds'] / 60:.1f} min | {note} |")
    lines += ["", "`cached (sparse)`: mean share of the prompt the sparse requests found in the prefix cache. "
              "`time`: wall time of that cell's requests (prefill dominates; the machine is shared)."]
    if getattr(args, "notes", "") and Path(args.notes).exists():
        lines += ["", Path(args.notes).read_text().rstrip()]
    out.write_text("\n".join(lines) + "\n")


def run_model(name, args, raw_path, recs):
    gguf, default_fmt, default_lengths = MODELS[name]
    fmts = [default_fmt] if not args.formats else [f for f in args.formats.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else default_lengths
    done = {(r["model"], r["format"], r["length"], r.get("trial"), r.get("policy")) for r in recs}
    skipped_cells = {(r["model"], r["format"], r["length"]) for r in recs if r.get("skipped")}
    extra = ["--threads", str(args.threads)]
    with ServerProcess(REPO / args.binary, REPO / gguf, extra_args=extra, startup_timeout=600) as server:
        base = server.base_url
        ctx = json.loads(urllib.request.urlopen(base + "/v1/models").read())["data"][0]["max_model_len"]
        for fmt in fmts:
            per_rep = {}
            dense_failed_at = None
            for length in lengths:
                key = (name, fmt, length)
                if key in skipped_cells:
                    continue
                if length > ctx:
                    rec = {"model": name, "format": fmt, "length": length, "skipped": f"beyond the context ({ctx})"}
                    recs.append(rec)
                    raw_path.open("a").write(json.dumps(rec) + "\n")
                    continue
                if dense_failed_at is not None and not args.no_skip:
                    rec = {"model": name, "format": fmt, "length": length,
                           "skipped": f"not run: dense failed at {dense_failed_at}"}
                    recs.append(rec)
                    raw_path.open("a").write(json.dumps(rec) + "\n")
                    render(recs, Path(args.out), args, "partial, running")
                    continue
                salt = f"{args.seed}-" if args.seed else ""  # --seed: fresh keys and depths
                for trial in range(args.trials):
                    rng = random.Random(f"{salt}{name}-{fmt}-{length}-{trial}")
                    policies = [p for p in args.policies.split(",") if (name, fmt, length, trial, p) not in done]
                    if policies:
                        text, pkey, depth, ntok = make_prompt(base, fmt, length, rng, per_rep)
                        for policy in policies:
                            t0 = time.monotonic()
                            reply, ptoks, cached = ask(base, fmt, text, policy, args.ratio, args.min_keys, args.fathom)
                            m = re.search(r"\d{5}", reply)
                            rec = {"model": name, "format": fmt, "length": length, "trial": trial, "policy": policy,
                                   "key": pkey, "depth": round(depth, 4), "prompt_tokens": ptoks,
                                   "cached_tokens": cached, "reply": reply,
                                   "correct": bool(m and int(m.group()) == pkey),
                                   "seconds": round(time.monotonic() - t0, 2)}
                            recs.append(rec)
                            done.add((name, fmt, length, trial, policy))
                            raw_path.open("a").write(json.dumps(rec) + "\n")
                            print(f"{name} {fmt} L={length} trial {trial} {policy}: {'ok ' if rec['correct'] else 'BAD'} "
                                  f"({rec['seconds']:.0f} s, cached {cached}/{ptoks}) {reply!r}", flush=True)
                        render(recs, Path(args.out), args, "partial, running")
                    if trial + 1 == args.check_trials:
                        dense = [r["correct"] for r in recs if (r.get("model"), r.get("format"), r.get("length"),
                                                                r.get("policy")) == (name, fmt, length, "dense")]
                        acc = sum(dense) / max(1, len(dense))
                        if acc < args.min_dense:
                            rec = {"model": name, "format": fmt, "length": length,
                                   "skipped": f"dense {sum(dense)}/{len(dense)} < {args.min_dense:.0%} in the check: "
                                              "remaining trials skipped"}
                            recs.append(rec)
                            raw_path.open("a").write(json.dumps(rec) + "\n")
                            dense_failed_at = length
                            break


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--lengths", default="", help="comma-separated prompt lengths in tokens (default per model)")
    ap.add_argument("--formats", default="", help="chat,completion (default: chat for smollm2, completion for gemma3)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--check-trials", type=int, default=4)
    ap.add_argument("--min-dense", type=float, default=0.5)
    ap.add_argument("--no-skip", action="store_true", help="run longer lengths even after dense failed")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--ratio", type=float, default=0.125)
    ap.add_argument("--min-keys", type=int, default=None,
                    help="sparse requests' min_keys (default: the server's measured break-even, as served; "
                         "0: the sparse kernel at every length)")
    ap.add_argument("--fathom", default="{}", help='more "fathom" options for sparse requests, e.g. \'{"hip": {"refresh": 2}}\'')
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", default="", help="a salt for the trials' seeds: fresh keys and depths (default: the "
                    "unsalted seeds every earlier table used)")
    ap.add_argument("--binary", default="build/fathom")
    ap.add_argument("--raw", default="",
                    help="JSON-lines results; several comma-separated files are merged, new results go to the first "
                         "(default: OUT's directory/raw/OUT's name.jsonl, ignored by git)")
    ap.add_argument("--out", default=str(REPO / "eval/results/passkey.md"))
    ap.add_argument("--render-only", action="store_true", help="rewrite --out from --raw and exit")
    ap.add_argument("--notes", default="", help="markdown file appended under the table")
    ap.add_argument("--status", default="partial", help="run status written into the table header (--render-only)")
    args = ap.parse_args()
    out = Path(args.out)
    raw_paths = [Path(p) for p in args.raw.split(",")] if args.raw else [out.parent / "raw" / (out.stem + ".jsonl")]
    raw_paths[0].parent.mkdir(parents=True, exist_ok=True)
    raw_path = raw_paths[0]  # new results are appended here; the others are read only
    recs = load_raw(raw_paths)
    # A rerun resumes only a run made with the same settings (the records do not carry them).
    settings = {k: getattr(args, k) for k in ("ratio", "min_keys", "fathom", "seed", "threads")}
    held = next((r["settings"] for r in load_raw([raw_path]) if "settings" in r), None)
    if not args.render_only:
        if held is not None and held != settings:
            sys.exit(f"passkey_eval: {raw_path} holds a run with other settings ({held}); "
                     "delete it or pass another --raw")
        if held is None and not raw_path.exists():
            raw_path.write_text(json.dumps({"settings": settings}) + "\n")
    recs = [r for r in recs if "settings" not in r]
    if args.render_only:
        render(recs, Path(args.out), args, args.status)
        return
    t0 = time.monotonic()
    for name in args.models.split(","):
        run_model(name, args, raw_path, recs)
    render(recs, Path(args.out), args, f"complete; this invocation ran {(time.monotonic() - t0) / 60:.0f} min")


if __name__ == "__main__":
    main()
