#!/usr/bin/env python3
"""Decode speed of every attention policy at kv_read_ratio 1/8 (bench_decode's; the server's default
is 1/4) with min_keys measured (each sparse policy runs densely below its measured break-even, as
served) against dense, per depth, over several rounds.

Each round is one `bench_decode` run: per depth it prefills once and times each policy's decode
from the same cache one after the other (the order rotated by one policy each round), so the
policies alternate within a round;
the table gives per policy the median over rounds of the mean ms per token, and dense ÷ policy.
The read bandwidth of the `% bound` column is measured in the same run unless --bandwidth-json
names a file: bench_bandwidth before the first round and after every round, and the median of those
runs. This VM's host, and so its bandwidth, changes between sessions (23 GB/s one day, 38 the next)
and within one (34, 67 and 37 GB/s a minute apart on the Zen 4): the best of two runs, the rule
before, measured every policy against the outlier.

A second table per model isolates what the policies change: each step's time above the dense
step at the model's shortest depth (the weights, the norms and the short-context attention), so
that the weights, which this VM's L3 can hold, do not hide the attention's speed-up.

    .venv/bin/python bench/policy_speed.py --rounds 3 --decode-tokens 64 --out bench/results/policy_speed.md

--batch B decodes B sequences of each depth together (`bench_decode --batch`: the server's
continuous batching of B concurrent requests, each with its own copy of the prompt's KV); ms per
token is then the step's time ÷ B (the inverse of the throughput), so the weights, read once a step,
weigh 1/B as much as in a lone sequence's step.
"""
import argparse
import json
import re
import statistics
import subprocess
from collections import defaultdict, namedtuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "SmolLM2 135M Q4_1": (ROOT / "models/smollm2-135m-instruct-q4_1.gguf", "256,1024,2048,4096,8000"),
    "Gemma 3 270M Q4_K_M": (ROOT / "models/gemma-3-270m-q4_k_m.gguf", "1024,4096,8192,16384"),
}
POLICIES = ["dense", "sparq", "hip", "alisa", "auto"]
NOISE_MS = 0.3  # the spread of a mean ms per token between runs of the same kernel on this VM
Cell = namedtuple("Cell", "mean_ms mb p90_ms max_ms")  # one policy at one depth: a round's, or their medians
LINE = re.compile(r"depth=(\d+).*\|\s*(\w+) decode\s+[\d.]+ tok/s \(median ([\d.]+) ms, mean ([\d.]+) ms, "
                  r"p90 ([\d.]+) ms, max ([\d.]+) ms\) \| ([\d.]+) MB/token")


def machine():
    """The CPU this ran on (its L3 decides whether the weights come from DRAM)."""
    info = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    flags = info.get("Flags", "").split()
    simd = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    return (f"{info.get('Model name', '?')} (family {info.get('CPU family', '?')} model {info.get('Model', '?')}), "
            f"{info.get('CPU(s)', '?')} vCPUs, L3 {info.get('L3 cache', '?')}, best SIMD {simd}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together (bench_decode --batch)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--depths", default="", help="override every model's depths (comma-separated)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/policy_speed.md"))
    ap.add_argument("--bandwidth-json", default="", help="read bandwidth from this bench_bandwidth JSON "
                    "(default: measure it before and after the runs)")
    args = ap.parse_args()

    def bandwidth(path):
        return {r["threads"]: r["best_gbps"] for r in json.loads(Path(path).read_text())["results"]}.get(args.threads)

    def measure_bandwidth():
        tmp = Path("/tmp/policy_speed_bandwidth.json")
        subprocess.run([str(ROOT / args.build / "bench_bandwidth"), "--threads", str(args.threads), "--json",
                        str(tmp)], cwd=ROOT, capture_output=True, check=True)
        return bandwidth(tmp)

    samples = [bandwidth(args.bandwidth_json) if args.bandwidth_json else measure_bandwidth()]
    if not samples[0]:
        raise SystemExit(f"no read bandwidth at {args.threads} threads in {args.bandwidth_json or 'bench_bandwidth'}")
    tables = []
    for name in args.models.split(","):
        gguf, depths = MODELS[name]
        depths = args.depths or depths
        runs = defaultdict(list)  # (depth, policy) -> [Cell per round]
        for r in range(args.rounds):
            # Each round starts from another policy: a host that slows down (or speeds up) during a
            # run would otherwise favour whichever policy always runs first.
            order = POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]
            out = subprocess.run([str(ROOT / args.build / "bench_decode"), "--model", str(gguf), "--threads",
                                  str(args.threads), "--depths", depths, "--decode-tokens", str(args.decode_tokens),
                                  "--attention", ",".join(order), "--batch", str(args.batch)], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout
            for m in LINE.finditer(out):  # bench_decode's ms are per step: per token is ÷ batch
                runs[(int(m.group(1)), m.group(2))].append(
                    Cell(float(m.group(4)) / args.batch, float(m.group(7)), float(m.group(5)) / args.batch,
                         float(m.group(6)) / args.batch))
            if not args.bandwidth_json:
                samples.append(measure_bandwidth())
            print(f"{name}: round {r + 1} done", flush=True)
        tables.append((name, sorted(map(int, depths.split(","))), runs))
    gbps = statistics.median(samples)
    bw_source = (Path(args.bandwidth_json).name if args.bandwidth_json else
                 f"the median of {len(samples)} runs in this run, before the first round and after each: "
                 f"{min(samples):.1f}-{max(samples):.1f} GB/s")
    batched = args.batch > 1
    lines = ["# Decode speed per attention policy, as served" + (f", {args.batch} sequences a step" if batched else ""),
             "",
             f"Generated by `bench/policy_speed.py --rounds {args.rounds} --decode-tokens {args.decode_tokens}"
             + (f" --batch {args.batch}" if batched else "") + "`: "
             f"`bench_decode --threads {args.threads} "
             f"--decode-tokens {args.decode_tokens} --attention {','.join(POLICIES)}"
             + (f" --batch {args.batch}" if batched else "") + "` (each round's order rotated by one "
             "policy; kv_read_ratio 1/8, "
             "min_keys measured: a sparse step shorter than the policy's measured break-even runs densely). "
             "Cells: mean ms per token (median over rounds) and dense ÷ policy; MB/token is what the kernels "
             "report reading (weights + KV); `% bound`: the time those bytes take at the read bandwidth "
             f"bench_bandwidth measured at {args.threads} threads ({gbps:.1f} GB/s, {bw_source}) ÷ "
             "the measured time; `= dense path`: the policy read exactly dense's bytes, i.e. every step ran "
             "the dense kernel (below its break-even), so its ratio is run-to-run noise. Where the L3 holds a small model's weights, a step can beat the "
             "DRAM bound (> 100%); the second table per model leaves the weights out."
             + (f" With {args.batch} sequences a step (each its own copy of the prompt's KV), ms and MB per token "
                f"are a step's ÷ {args.batch}: the weights are read once for all of them." if batched else ""), "",
             f"Machine: {machine()}.", ""]
    for name, depths, runs in tables:
        med = {key: Cell(*(statistics.median(v[i] for v in vals) for i in range(len(Cell._fields))))
               for key, vals in runs.items()}
        lines += [f"## {name}", "", "| depth | " + " | ".join(POLICIES) + " |", "|---" * (len(POLICIES) + 1) + "|"]
        for depth in depths:
            dense = med[(depth, "dense")].mean_ms
            cells = []
            dense_mb = med[(depth, "dense")].mb
            for p in POLICIES:
                ms, mb = med[(depth, p)].mean_ms, med[(depth, p)].mb
                bound = f", {100 * mb / gbps / ms:.0f}% bound"
                # The same bytes as dense: every step ran the dense kernel (below the policy's
                # break-even), so the ratio is the host's noise, not the policy's.
                same = " = dense path" if p != "dense" and abs(mb - dense_mb) < 0.05 else ""
                cells.append(f"{ms:.2f} ms ({mb:.0f} MB{bound})" if p == "dense"
                             else f"{ms:.2f} ms, {dense / ms:.2f}× ({mb:.0f} MB{bound}{same})")
            lines.append(f"| {depth} | " + " | ".join(cells) + " |")
        base_depth = depths[0]
        base = med[(base_depth, "dense")].mean_ms
        lines += ["", f"Above the dense step at depth {base_depth} ({base:.2f} ms): ms per token and dense ÷ policy "
                  "over that part (a difference of two noisy means: no ratio where either part is under "
                  f"{NOISE_MS} ms).", "",
                  "| depth | " + " | ".join(POLICIES) + " |", "|---" * (len(POLICIES) + 1) + "|"]
        for depth in depths[1:]:
            dense = med[(depth, "dense")].mean_ms - base
            cells = []
            for p in POLICIES:
                part = med[(depth, p)].mean_ms - base
                noisy = min(part, dense) < NOISE_MS
                cells.append(f"{part:.2f} ms" if p == "dense" or noisy else f"{part:.2f} ms, {dense / part:.2f}×")
            lines.append(f"| {depth} | " + " | ".join(cells) + " |")
        lines += ["", "The slowest steps: p90 / max ms per token (median over rounds). A policy whose mean beats "
                  "dense's can still have slower steps (the first decode step: HiP estimates every layer's "
                  "mask, SWA seeds its mass densely).", "",
                  "| depth | " + " | ".join(POLICIES) + " |", "|---" * (len(POLICIES) + 1) + "|"]
        for depth in depths:
            lines.append(f"| {depth} | " + " | ".join(f"{med[(depth, p)].p90_ms:.2f} / {med[(depth, p)].max_ms:.2f}"
                                                      for p in POLICIES) + " |")
        lines.append("")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
