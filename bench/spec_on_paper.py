#!/usr/bin/env python3
"""Sparse self-speculation on paper: Llama-3-8B on one H100 SXM (no GPU ran any of this).

A decode step costs max(bytes / 3.35 TB/s, FLOPs / 989 TFLOP/s) (H100 SXM HBM3 and dense BF16
peaks). Bytes: the BF16 weights once a step (8.03 B parameters, 16.06 GB) plus each sequence's
attention bytes as counted by fathom's CUDA kernels (bench/results/estimates/cuda_bytes.md, the
headline table, parsed from the file: dense, SparQ 1/8, HiP with a cached mask). FLOPs: 2 per
parameter and row plus attention's 4·S·d per query head, layer and row.
- plain step of B sequences: weights + B dense attentions, B rows;
- draft step (the same model through a sparse policy): weights + B sparse attentions, B rows;
- verify step of k drafts: weights + B dense attentions (the k + 1 rows of a sequence share one
  read of its KV, as fathom's verify kernel does), B·(k + 1) rows.
Batches: 1, and the most sequences whose f16 KV fits 80 GB beside the weights (MagicDec's 32-256
ran on 8 GPUs). A round of k drafts, each kept with chance α, emits Σ_{i≤k} α^i tokens a sequence; the table gives
the best k ≤ 8 and its speed-up over plain steps (tokens per time). α is a parameter: what a sparse
draft's agreement is at these lengths was not measured here.

    python3 bench/spec_on_paper.py > bench/results/estimates/speculation_h100.md
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BW, PEAK = 3.35e12, 989e12
PARAMS, LAYERS, Q_HEADS, KV_HEADS, D = 8.03e9, 32, 32, 8, 128
WEIGHT_BYTES = 2 * PARAMS
HBM = 80e9


def fitting_batch(S):
    """Sequences of S tokens whose f16 K and V fit the 80 GB beside the weights."""
    return int((HBM - WEIGHT_BYTES) // (S * LAYERS * KV_HEADS * D * 2 * 2))


def headline():
    """{S: {"dense": s, "sparq": s, "hip": s}} attention seconds a step, from cuda_bytes.md."""
    text = (ROOT / "bench/results/estimates/cuda_bytes.md").read_text()
    table = text[text.index("## Headline"):]
    out = {}
    for line in table.splitlines():
        m = re.match(r"\| (\d+)k \| [\d.]+ µs \| ([\d.]+) µs \| ([\d.]+) µs \| ([\d.]+) µs \|", line)
        if m:
            out[int(m.group(1)) * 1024] = {k: float(v) * 1e-6 for k, v in zip(("dense", "sparq", "hip"), m.groups()[1:])}
    return out


def step(batch, rows_each, attention_s, S):
    """Seconds of one step: `batch` sequences of `rows_each` rows, `attention_s` of KV reading each."""
    bytes_ = WEIGHT_BYTES + batch * attention_s * BW
    flops = batch * rows_each * (2 * PARAMS + 4 * S * D * Q_HEADS * LAYERS)
    return max(bytes_ / BW, flops / PEAK)


def best(alpha, batch, S, att, policy):
    plain = step(batch, 1, att["dense"], S)
    draft = step(batch, 1, att[policy], S)
    best_k, best_gain = 0, 1.0
    for k in range(1, 9):
        tokens = sum(alpha ** i for i in range(k + 1))
        gain = tokens * plain / (k * draft + step(batch, k + 1, att["dense"], S))
        if gain > best_gain:
            best_k, best_gain = k, gain
    return best_k, best_gain


def main():
    att = headline()
    print("# Sparse self-speculation on paper: Llama-3-8B, one H100 SXM\n")
    print("**No GPU ran this: every figure is arithmetic** over bytes fathom's CUDA kernels count "
          "(bench/results/estimates/cuda_bytes.md) and the H100's peaks. Regenerate: "
          "`python3 bench/spec_on_paper.py > bench/results/estimates/speculation_h100.md` "
          "(its docstring has the model).\n")
    alphas = (0.7, 0.8, 0.9)
    print("| S | batch | plain step | draft: policy, step | " + " | ".join(f"α {a}: best k, speed-up" for a in alphas) + " |")
    print("|---|---:|---:|---|" + "---|" * len(alphas))
    for S in sorted(att):
        for batch in (1, fitting_batch(S)):
            plain = step(batch, 1, att[S]["dense"], S)
            for policy, name in (("sparq", "SparQ 1/8"), ("hip", "HiP cached")):
                cells = [f"{k}, {g:.2f}×" if k else "none, 1.00×" for k, g in (best(a, batch, S, att[S], policy) for a in alphas)]
                print(f"| {S // 1024}k | {batch} | {plain * 1e3:.1f} ms | {name}, {step(batch, 1, att[S][policy], S) * 1e3:.1f} ms | "
                      + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
