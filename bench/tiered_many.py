#!/usr/bin/env python3
"""Many long requests at once over a device tier smaller than their KV (docs/tiered_kv.md).

--requests distinct prompts of about --tokens tokens each are sent at once, greedy, --max-tokens
each, to a server whose device tier holds everything and to one whose device tier holds
--device-fraction of their total KV (the rest in a host tier), once per decode policy (--policies;
sparse ones at --ratio with the server's measured min_keys, or --min-keys). Every request must
complete with the same text on both; the wall time, preemptions, bytes moved between tiers and
each server's measured break-even are reported (a sparse policy runs densely below it, so two
servers that measure it on either side of the prompts' length do not run the same attention).

    .venv/bin/python bench/tiered_many.py --requests 16 --tokens 4096 --policies dense,sparq,hip,alisa
"""
import argparse
import concurrent.futures as cf
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "eval"))
from passkey_eval import fathom_options  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402

MODELS = {"smollm2": "models/smollm2-135m-instruct-q4_1.gguf", "gemma3": "models/gemma-3-270m-q4_k_m.gguf"}
WORDS = ("lighthouse keeper harbour storm ledger lantern granite tide beacon rope gull chart compass "
         "winter signal reef island ferry cargo anchor").split()


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def metric(base, name, labels="", absent=0.0):
    text = urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    return absent


def prompt(i, tokens, base):
    """A distinct text of about `tokens` tokens: numbered sentences over a word list."""
    sentences = [f"Entry {i}.{k}: the {WORDS[(i + k) % len(WORDS)]} and the {WORDS[(3 * i + 7 * k) % len(WORDS)]} "
                 f"were logged at hour {(i * 31 + k) % 24}." for k in range(tokens // 14 + 1)]
    text = " ".join(sentences)
    while post(base, "/tokenize", {"prompt": text})["count"] > tokens:
        sentences = sentences[:-8]
        text = " ".join(sentences)
    return text + f"\nSummary of log {i}:"


def run(server, prompts, max_tokens, fathom):
    t0 = time.monotonic()
    body = {"max_tokens": max_tokens, "temperature": 0, "fathom": fathom}
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(lambda p: post(server.base_url, "/v1/completions", body | {"prompt": p})
                              ["choices"][0]["text"], prompts))
    return texts, time.monotonic() - t0


def break_even(base, policy, ratio):
    """The server's measured min_keys for `policy` at `ratio` (None: not measured; labels in the
    exposition's sorted order)."""
    keys = metric(base, "fathom_attention_break_even_keys", f'{{kv_read_ratio="{ratio:g}",policy="{policy}"}}', None)
    return None if keys is None else f"{keys:.0f}" if keys != float("inf") else "+Inf"


def counters(base):
    return {"recomputes": metric(base, "fathom_preemptions_total", '{mode="recompute"}'),
            "moved_in": metric(base, "fathom_swap_bytes_total", '{direction="in"}'),
            "moved_out": metric(base, "fathom_swap_bytes_total", '{direction="out"}'),
            "demoted": metric(base, "fathom_kv_blocks_demoted_total"),
            "fallbacks": metric(base, "fathom_kv_hot_row_fallbacks_total")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device-fraction", type=float, default=0.25)
    ap.add_argument("--policies", default="dense")
    ap.add_argument("--ratio", type=float, default=0.125)
    ap.add_argument("--min-keys", type=int, help="sparse policies' min_keys (default: each server's measured one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default="build/fathom")
    ap.add_argument("--out", default=str(REPO / "bench/results/tiered_many.md"))
    args = ap.parse_args()
    gguf = REPO / MODELS[args.model]
    with ServerProcess(REPO / args.binary, gguf, extra_args=["--threads", 1, "--kv-cache-mib", 64]) as probe:
        blocks = int(re.search(r"kv cache: (\d+) device blocks", probe.stderr).group(1))
        block_mib = 64 / blocks
        prompts = [prompt(i, args.tokens, probe.base_url) for i in range(args.requests)]
    total_mib = args.requests * (args.tokens + args.max_tokens) / 16 * block_mib
    device_mib = max(1, int(total_mib * args.device_fraction))
    common = ["--threads", args.threads, "--max-num-seqs", args.requests, "--no-prefix-caching"]
    policies = args.policies.split(",")
    results = {}  # (server, policy) -> run
    for name, extra in (("resident", ["--kv-cache-mib", int(total_mib * 1.2) + 16]),
                        ("tiered", ["--kv-cache-mib", device_mib, "--host-kv-mib", int(total_mib * 1.2) + 16])):
        with ServerProcess(REPO / args.binary, gguf, extra_args=common + extra, startup_timeout=600) as srv:
            for policy in policies:
                before = counters(srv.base_url)
                texts, seconds = run(srv, prompts, args.max_tokens, fathom_options(policy, args.ratio, args.min_keys))
                after = counters(srv.base_url)
                results[name, policy] = {
                    "texts": texts, "seconds": seconds,
                    "log": re.search(r"kv cache: .*", srv.stderr).group(0),
                    "limits": (re.search(r"steps limited to .*", srv.stderr) or [None])[0],
                    "min_keys": args.min_keys if args.min_keys is not None else
                    "–" if policy == "dense" else break_even(srv.base_url, policy, args.ratio),
                } | {k: after[k] - before[k] for k in after}
                print(name, policy, {k: v for k, v in results[name, policy].items() if k != "texts"}, flush=True)
    lines = [f"# {args.requests} concurrent {args.tokens}-token requests over a device tier of "
             f"{args.device_fraction:g} of their KV ({args.model})", "",
             f"`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d')}, {args.threads} threads: {args.requests} distinct "
             f"prompts of ≤ {args.tokens} tokens sent at once, greedy, {args.max_tokens} tokens each, prefix cache off, "
             f"sparse policies at kv_read_ratio {args.ratio:g} with min_keys "
             f"{args.min_keys if args.min_keys is not None else 'as each server measured it'}. "
             f"Their KV: {total_mib:.0f} MiB; the tiered server's device tier {device_mib} MiB.", "",
             "| policy | server | KV tiers | all complete | texts equal to resident | wall time | recompute preemptions | "
             "host→device | device→host | blocks demoted | hot-row dense fallbacks | min_keys |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (name, policy), r in results.items():
        same = sum(a == b for a, b in zip(results["resident", policy]["texts"], r["texts"]))
        lines.append(f"| {policy} | {name} | {r['log'].removeprefix('kv cache: ')} | {len(r['texts'])}/{args.requests} | "
                     f"{same}/{args.requests} | {r['seconds']:.1f} s | "
                     f"{r['recomputes']:.0f} | {r['moved_in'] / 2**30:.2f} GiB | {r['moved_out'] / 2**30:.2f} GiB | "
                     f"{r['demoted']:.0f} | {r['fallbacks']:.0f} | {r['min_keys']} |")
    if limits := results["tiered", policies[0]]["limits"]:
        lines += ["", f"The tiered server logged: \"{limits}\"."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
