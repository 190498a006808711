#!/usr/bin/env python3
"""The tiered KV cache against the all-resident cache, on long passkey prompts (docs/tiered_kv.md).

Two `fathom serve` processes on the same model: `resident` (a device tier that holds everything)
and `tiered` (a device tier of --device-fraction of one prompt's KV, a host tier for the rest).
Per trial, one passkey prompt (bench/passkey_eval.py's task) is prefilled once per server (the
prefix cache keeps it); then for every policy the same greedy question is asked of both servers
(answers compared) and a fixed-length decode (--decode tokens, ignore_eos) is timed on each,
alternating resident / tiered. Decode speed is taken from the server's own request log
((completion_tokens − 1) / (total − ttft)), so HTTP and prefill time do not count.

    .venv/bin/python bench/tiered_kv.py --model gemma3 --lengths 16384 --trials 2
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
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from passkey_eval import MODELS, ask, make_prompt, post  # noqa: E402
from server_fixture import ServerProcess  # noqa: E402

LOG_RE = re.compile(r"completion_tokens=(\d+) ttft_ms=([\d.]+) total_ms=([\d.]+)")


def device_blocks(server):
    """The device tier's block count, from the server's start-up line."""
    m = re.search(r"kv cache: (\d+) device blocks", server.stderr)
    return int(m.group(1))


def decode_rate(server, fmt, text, policy, ratio, tokens):
    body = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "fathom": {"attention": policy} | ({} if policy == "dense" else {"kv_read_ratio": ratio})}
    if fmt == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        post(server.base_url, "/v1/chat/completions", body)
    else:
        body["prompt"] = text
        post(server.base_url, "/v1/completions", body)
    time.sleep(0.05)  # the request's log line follows its response
    n, ttft, total = LOG_RE.findall(server.stderr)[-1]
    return (int(n) - 1) / ((float(total) - float(ttft)) / 1000.0)


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
    ap.add_argument("--policies", default="dense,sparq,hip,swa")
    ap.add_argument("--ratio", type=float, default=0.125)
    ap.add_argument("--device-fraction", type=float, default=0.125)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default="build/fathom")
    ap.add_argument("--out", default=str(REPO / "bench/results/tiered_kv.md"))
    args = ap.parse_args()
    gguf, fmt, _ = MODELS[args.model]
    lengths = [int(x) for x in args.lengths.split(",")]
    policies = args.policies.split(",")
    rows = []
    for length in lengths:
        # The KV bytes of one `length`-token sequence, from a probe server's block count.
        probe_mib = 64
        with ServerProcess(REPO / args.binary, REPO / gguf,
                           extra_args=["--threads", "1", "--kv-cache-mib", probe_mib]) as probe:
            bytes_per_block = (probe_mib << 20) / device_blocks(probe)
        seq_mib = length / 16 * bytes_per_block / (1 << 20)
        device_mib = max(1, int(seq_mib * args.device_fraction))
        common = ["--threads", args.threads, "--max-num-seqs", 4, "--max-batched-tokens", 512]
        resident = ServerProcess(REPO / args.binary, REPO / gguf, startup_timeout=600,
                                 extra_args=common + ["--kv-cache-mib", int(seq_mib * 1.5) + 64])
        tiered = ServerProcess(REPO / args.binary, REPO / gguf, startup_timeout=600,
                               extra_args=common + ["--kv-cache-mib", device_mib, "--host-kv-mib", int(seq_mib * 1.5) + 64])
        resident.start()
        tiered.start()
        try:
            print(f"L={length}: one sequence's KV {seq_mib:.0f} MiB; tiered device tier {device_mib} MiB", flush=True)
            rates = {(p, s): [] for p in policies for s in ("resident", "tiered")}
            same = {p: 0 for p in policies}
            correct = {(p, s): 0 for p in policies for s in ("resident", "tiered")}
            for trial in range(args.trials):
                rng = random.Random(f"tiered-{args.model}-{length}-{trial}")
                text, key, depth, ntok = make_prompt(resident.base_url, fmt, length, rng, {})
                for policy in policies:
                    replies = {}
                    for name, srv in (("resident", resident), ("tiered", tiered)):
                        replies[name] = ask(srv.base_url, fmt, text, policy, args.ratio)[0]
                        m = re.search(r"\d{5}", replies[name])
                        correct[(policy, name)] += bool(m and int(m.group()) == key)
                    same[policy] += replies["resident"] == replies["tiered"]
                    for name, srv in (("resident", resident), ("tiered", tiered)):
                        rates[(policy, name)].append(decode_rate(srv, fmt, text, policy, args.ratio, args.decode))
                    print(f"  trial {trial} {policy}: replies {'same' if replies['resident'] == replies['tiered'] else 'DIFFER'} "
                          f"{replies}; decode {rates[(policy, 'resident')][-1]:.1f} vs {rates[(policy, 'tiered')][-1]:.1f} tok/s",
                          flush=True)
            moved_in = metric(tiered, "fathom_swap_bytes_total", '{direction="in"}')
            for policy in policies:
                r = statistics.median(rates[(policy, "resident")])
                t = statistics.median(rates[(policy, "tiered")])
                rows.append((length, policy, f"{same[policy]}/{args.trials}", f"{correct[(policy, 'resident')]}/{args.trials}",
                             f"{correct[(policy, 'tiered')]}/{args.trials}", f"{r:.1f}", f"{t:.1f}", f"{t / r:.2f}"))
            rows.append((length, "(all)", "", "", "", "", "", f"host→device {moved_in / 2**30:.2f} GiB"))
        finally:
            resident.stop()
            tiered.stop()
    out = Path(args.out)
    lines = [f"# Tiered KV cache vs all-resident ({args.model}, device tier {args.device_fraction:g} of one sequence's KV)",
             "",
             f"`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d')}: {args.trials} passkey trials per length, greedy; "
             f"decode = {args.decode} tokens (ignore_eos) after the cached prompt, median over trials, "
             f"{args.threads} threads, both servers idle while the other runs. Sequences with host-tier blocks "
             "decode densely whatever their policy (docs/tiered_kv.md), so the tiered sparse rows measure dense over "
             "offloaded KV.",
             "",
             "| length | policy | same reply | key found (resident) | key found (tiered) | decode tok/s resident | decode tok/s tiered | tiered / resident |",
             "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
