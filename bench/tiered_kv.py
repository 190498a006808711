#!/usr/bin/env python3
"""The tiered KV cache against the all-resident cache, on long passkey prompts (docs/tiered_kv.md).

`fathom serve` processes on the same model: `resident` (a device tier that holds everything) and
one `tiered` per --device-fractions entry (a device tier of that fraction of one prompt's KV, a
host tier for the rest).
Per trial, one passkey prompt (eval/passkey_eval.py's task) is prefilled once per server (the
prefix cache keeps it); then for every policy the same greedy question is asked of both servers
(answers compared) and a fixed-length decode (--decode tokens, ignore_eos) is timed on each,
alternating resident / tiered servers. Decode speed is taken from the server's own request log
((completion_tokens − 1) / (total − ttft)), so HTTP and prefill time do not count.

    .venv/bin/python bench/tiered_kv.py --model gemma3 --lengths 16384 --trials 2 --device-fractions 0.125,0.25
"""
import argparse
import json
import re
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "eval"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from passkey_eval import MODELS, ask, fathom_options, make_prompt, post  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402

LOG_RE = re.compile(r"completion_tokens=(\d+) ttft_ms=([\d.]+) total_ms=([\d.]+)")


def device_blocks(server):
    """The device tier's block count, from the server's start-up line."""
    m = re.search(r"kv cache: (\d+) device blocks", server.stderr)
    return int(m.group(1))


def decode_rate(server, fmt, text, policy, args):
    body = {"max_tokens": args.decode, "temperature": 0, "ignore_eos": True,
            "fathom": fathom_options(policy, args.ratio, args.min_keys, args.fathom)}
    if fmt == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        post(server.base_url, "/v1/chat/completions", body)
    else:
        body["prompt"] = text
        post(server.base_url, "/v1/completions", body)
    time.sleep(0.05)  # the request's log line follows its response
    n, ttft, total = LOG_RE.findall(server.stderr)[-1]
    return (int(n) - 1) / ((float(total) - float(ttft)) / 1000.0)


def srv_mib(server):
    m = re.search(r"kv cache: (\d+) device blocks \+ (\d+) host blocks", server.stderr)
    return f"{m.group(1)} device blocks for the page table (the rest of the tier holds hot rows), {m.group(2)} host blocks"


def metric(server, name, labels=""):
    text = urllib_get(server.base_url + "/metrics")
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    return 0.0


def urllib_get(url):
    import urllib.request
    return urllib.request.urlopen(url, timeout=60).read().decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--lengths", default="16384")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--policies", default="dense,sparq,hip,alisa")
    ap.add_argument("--ratio", type=float, default=0.125)
    ap.add_argument("--device-fractions", default="0.125,0.25")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--hot-rows-percent", type=int, default=100,
                    help="the tiered servers' split of their device tier (100: all it can spare to hot rows)")
    ap.add_argument("--min-keys", type=int, default=None, help="min_keys of sparse requests (default: measured)")
    ap.add_argument("--fathom", default="{}", help='more "fathom" options for sparse requests, e.g. \'{"hip": {"refresh": 2}}\'')
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default="build/fathom")
    ap.add_argument("--out", default=str(REPO / "bench/results/tiered_kv.md"))
    args = ap.parse_args()
    gguf, fmt, _ = MODELS[args.model]
    lengths = [int(x) for x in args.lengths.split(",")]
    policies = args.policies.split(",")
    fractions = [float(x) for x in args.device_fractions.split(",")]
    rows, notes = [], []
    for length in lengths:
        # The KV bytes of one `length`-token sequence, from a probe server's block count.
        probe_mib = 64
        with ServerProcess(REPO / args.binary, REPO / gguf,
                           extra_args=["--threads", "1", "--kv-cache-mib", probe_mib]) as probe:
            bytes_per_block = (probe_mib << 20) / device_blocks(probe)
        seq_mib = length / 16 * bytes_per_block / (1 << 20)
        common = ["--threads", args.threads, "--max-num-seqs", 4, "--max-batched-tokens", 256]
        servers = {"resident": ServerProcess(REPO / args.binary, REPO / gguf, startup_timeout=600,
                                             extra_args=common + ["--kv-cache-mib", int(seq_mib * 1.5) + 64])}
        for f in fractions:
            servers[f"tiered {f:g}"] = ServerProcess(
                REPO / args.binary, REPO / gguf, startup_timeout=600,
                extra_args=common + ["--kv-cache-mib", max(1, int(seq_mib * f)), "--host-kv-mib", int(seq_mib * 1.5) + 64,
                                     "--hot-rows-percent", args.hot_rows_percent])
        for srv in servers.values():
            srv.start()
        try:
            print(f"L={length}: one sequence's KV {seq_mib:.0f} MiB", flush=True)
            rates = {(p, n): [] for p in policies for n in servers}
            same = {(p, n): 0 for p in policies for n in servers}
            correct = {(p, n): 0 for p in policies for n in servers}
            for trial in range(args.trials):
                rng = random.Random(f"tiered-{args.model}-{length}-{trial}")
                text, key, depth, ntok = make_prompt(servers["resident"].base_url, fmt, length, rng, {})
                for policy in policies:
                    replies = {}
                    for name, srv in servers.items():
                        replies[name] = ask(srv.base_url, fmt, text, policy, args.ratio, args.min_keys, args.fathom)[0]
                        m = re.search(r"\d{5}", replies[name])
                        correct[(policy, name)] += bool(m and int(m.group()) == key)
                        same[(policy, name)] += replies[name] == replies["resident"]
                    for name, srv in servers.items():
                        rates[(policy, name)].append(decode_rate(srv, fmt, text, policy, args))
                    print(f"  trial {trial} {policy}: " + "; ".join(
                        f"{n}: {replies[n]!r} {rates[(policy, n)][-1]:.1f} tok/s" for n in servers), flush=True)
            for name, srv in servers.items():
                if name == "resident":
                    continue
                moved = metric(srv, "fathom_swap_bytes_total", '{direction="in"}')
                fallbacks = metric(srv, "fathom_kv_hot_row_fallbacks_total")
                hot = {r: sum(metric(srv, "fathom_kv_hot_rows_total", f'{{policy="{p}",result="{r}"}}') for p in ("hip", "alisa"))
                       for r in ("hit", "miss")}
                notes.append(f"{name} at {length}: {srv_mib(srv)}; host→device {moved / 2**30:.2f} GiB in all; hot rows "
                             f"{hot['hit']:.0f} hits / {hot['miss']:.0f} misses; {fallbacks:.0f} layer steps fell back to dense")
            for policy in policies:
                base = statistics.median(rates[(policy, "resident")])
                row = [length, policy, f"{correct[(policy, 'resident')]}/{args.trials}", f"{base:.1f}"]
                for name in servers:
                    if name == "resident":
                        continue
                    r = statistics.median(rates[(policy, name)])
                    row += [f"{same[(policy, name)]}/{args.trials}", f"{correct[(policy, name)]}/{args.trials}",
                            f"{r:.1f} ({r / base:.2f}×)"]
                rows.append(row)
        finally:
            for srv in servers.values():
                srv.stop()
    out = Path(args.out)
    head = "| length | policy | key found (resident) | decode tok/s (resident) |"
    rule = "|---|---|---|---|"
    for f in fractions:
        head += f" same reply ({f:g}) | key found ({f:g}) | decode tok/s ({f:g}) |"
        rule += "---|---|---|"
    lines = [f"# Tiered KV cache vs all-resident ({args.model})",
             "",
             f"`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d')}: {args.trials} passkey trials per length, greedy, "
             f"`kv_read_ratio` {args.ratio:g}, sparse options {args.fathom}, min_keys "
             f"{'measured' if args.min_keys is None else args.min_keys}; decode = {args.decode} tokens (ignore_eos) after the cached prompt, median "
             f"over trials, {args.threads} threads, every server idle while another runs. Columns per device tier: the "
             "fraction of one sequence's KV the device tier holds (the rest in the host tier), "
             f"`--hot-rows-percent {args.hot_rows_percent}`. HiP, SWA and SparQ read host rows through the hot "
             "row cache (SparQ's step 1 reads r dimension rows of each host block's transposed K from the host "
             "tier), a selection larger than the cache in batches it holds (docs/tiered_kv.md).",
             "", head, rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    lines += [""] + [f"- {n}" for n in notes]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
