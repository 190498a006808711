#!/usr/bin/env python3
"""Random-weight GGUFs in the shapes of models people run, for benchmarks at real sizes.

Each file has a real model's shape, tensor names, per-tensor quantization layout and tokenizer
(llama.cpp's test vocabularies, which scripts/setup.sh fetches), and random weights: the text is
meaningless and the timings are true, since every kernel reads every byte as it would for the
real model. Nothing is downloaded; the files go to the model cache, never into git.

Weights are random bytes in the quantized format, with the block scales (f16 d, dmin) set so
that each weight is ~N(0, 0.03)-sized and a forward pass stays finite; llama.cpp's llama-server
loads the same files, so both servers are timed on identical bytes.

    bench_models.py [--out DIR] [--shapes llama-3.2-1b,llama-3.1-8b,qwen3-4b,qwen3-30b-a3b]
                    [--layouts q4_k_m,q8_0,f16]

Writes DIR/<shape>-<layout>.gguf (default DIR: $FATHOM_CACHE/bench-models, FATHOM_CACHE
defaulting to ~/.cache/fathom) and skips files that exist. Sizes: llama-3.2-1b q4_k_m ~0.8 GB,
llama-3.1-8b q4_k_m ~4.9 GB, f16 2.5 / 16 GB; qwen3-30b-a3b q4_k_m ~18 GB (a mixture of experts:
a token reads ~3 B of its ~30 B weights).
"""
import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_util import copy_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    arch: str          # general.architecture
    vocab_file: str    # llama.cpp's models/ggml-vocab-<name>.gguf
    vocab: int         # embedding rows (the tokenizer is padded to this)
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool         # output projection = token_embd
    rope_base: float
    qk_norm: bool = False  # Qwen 3: RMSNorm of each head's q and k
    experts: int = 0       # MoE: experts per layer (0: a dense MLP of width ffn)
    experts_used: int = 0  # the router's top-k
    expert_ffn: int = 0    # each expert's MLP width


SHAPES = {
    # Llama-3.2-1B / Llama-3.1-8B (meta-llama config.json), Qwen3-4B (Qwen config.json).
    "llama-3.2-1b": Shape("llama", "llama-bpe", 128256, 2048, 16, 32, 8, 64, 8192, True, 500000.0),
    "llama-3.1-8b": Shape("llama", "llama-bpe", 128256, 4096, 32, 32, 8, 128, 14336, False, 500000.0),
    "qwen3-4b": Shape("qwen3", "qwen2", 151936, 2560, 36, 32, 8, 128, 9728, True, 1000000.0, qk_norm=True),
    # Qwen3-30B-A3B (Qwen config.json): every layer's MLP is 128 experts of width 768, 8 a token.
    "qwen3-30b-a3b": Shape("qwen3moe", "qwen2", 151936, 2048, 48, 32, 4, 128, 6144, False, 1000000.0,
                           qk_norm=True, experts=128, experts_used=8, expert_ffn=768),
}

# f16 scale fields per quantized block: (block elements, block bytes, {byte offset: value}).
# Values make the dequantized weight ~0.03 in size with mean ~0 (Q4_K: dmin = 7.5 d cancels the
# mean of sc * q over random 6-bit sc and 4-bit q; Q6_K: q - 32 is centred, sc a random int8).
SCALES = {
    Q.Q8_0: (32, 34, {0: 4e-4}),
    Q.Q4_K: (256, 144, {0: 1e-4, 2: 7.5e-4}),
    Q.Q6_K: (256, 210, {208: 2e-5}),
}

FILE_TYPES = {"q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "f16": gguf.LlamaFileType.MOSTLY_F16}


def use_more_bits(i, n):
    """llama.cpp's rule for the layers whose attn_v / ffn_down get more bits in *_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(layout, name, layer, layers):
    """The quantization type llama-quantize gives `name` in `layout` (its Q4_K_M rule, simplified)."""
    if layout == "f16":
        return Q.F16
    if layout == "q8_0":
        return Q.Q8_0
    if name in ("output", "token_embd.tied"):
        return Q.Q6_K
    if name in ("attn_v", "ffn_down", "ffn_down_exps") and use_more_bits(layer, layers):
        return Q.Q6_K
    return Q.Q4_K


def random_matrix(rng, shape, qtype):
    """Weights of shape [...][rows][cols] in qtype as the bytes GGUF stores (uint8 [...][rows][row
    bytes], or f16)."""
    *outer, cols = shape
    if qtype == Q.F16:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.03).astype(np.float16)
    block, block_bytes, scales = SCALES[qtype]
    nb = cols // block
    raw = rng.integers(0, 256, (*outer, nb, block_bytes), dtype=np.uint8)
    for offset, value in scales.items():
        raw[..., offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return raw.reshape(*outer, nb * block_bytes)


def write(path, shape_name, layout, vocab_dir, seed=0):
    s = SHAPES[shape_name]
    vocab_path = vocab_dir / f"ggml-vocab-{s.vocab_file}.gguf"
    if not vocab_path.exists():
        sys.exit(f"{vocab_path}: missing (scripts/setup.sh fetches llama.cpp's test vocabularies)")
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), s.arch)
    w.add_name(f"{shape_name} shape, random weights ({layout}; fathom benchmarks)")
    vocab = copy_tokenizer(gguf.GGUFReader(str(vocab_path)), w, pad_to=s.vocab)
    assert vocab == s.vocab, f"{vocab_path} has more tokens ({vocab}) than the shape's {s.vocab}"
    w.add_context_length(131072 if s.arch == "llama" else 40960)
    w.add_embedding_length(s.dim)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-5 if s.arch == "llama" else 1e-6)
    w.add_vocab_size(s.vocab)
    w.add_file_type(FILE_TYPES[layout])
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_expert_feed_forward_length(s.expert_ffn)

    # (name, shape as [rows][cols], type) in llama.cpp's order; norms are F32 ones.
    tensors = [("token_embd.weight", (s.vocab, s.dim),
                tensor_type(layout, "token_embd.tied" if s.tied else "token_embd", 0, s.layers))]
    tensors.append(("output_norm.weight", (s.dim,), Q.F32))
    if not s.tied:
        tensors.append(("output.weight", (s.vocab, s.dim), tensor_type(layout, "output", 0, s.layers)))
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        b = f"blk.{i}."
        t = lambda n: tensor_type(layout, n, i, s.layers)  # noqa: E731
        tensors += [(b + "attn_norm.weight", (s.dim,), Q.F32),
                    (b + "attn_q.weight", (q_dim, s.dim), t("attn_q")),
                    (b + "attn_k.weight", (kv_dim, s.dim), t("attn_k")),
                    (b + "attn_v.weight", (kv_dim, s.dim), t("attn_v")),
                    (b + "attn_output.weight", (s.dim, q_dim), t("attn_output"))]
        if s.qk_norm:
            tensors += [(b + "attn_q_norm.weight", (s.head_dim,), Q.F32),
                        (b + "attn_k_norm.weight", (s.head_dim,), Q.F32)]
        tensors.append((b + "ffn_norm.weight", (s.dim,), Q.F32))
        if s.experts:  # the router stays f32 in every layout (llama-quantize skips ffn_gate_inp)
            e, f = s.experts, s.expert_ffn
            tensors += [(b + "ffn_gate_inp.weight", (e, s.dim), Q.F32),
                        (b + "ffn_gate_exps.weight", (e, f, s.dim), t("ffn_gate_exps")),
                        (b + "ffn_up_exps.weight", (e, f, s.dim), t("ffn_up_exps")),
                        (b + "ffn_down_exps.weight", (e, s.dim, f), t("ffn_down_exps"))]
        else:
            tensors += [(b + "ffn_gate.weight", (s.ffn, s.dim), t("ffn_gate")),
                        (b + "ffn_up.weight", (s.ffn, s.dim), t("ffn_up")),
                        (b + "ffn_down.weight", (s.dim, s.ffn), t("ffn_down"))]

    def data(name, shape, qtype):
        if name.endswith("ffn_gate_inp.weight"):  # random router logits: tokens spread over experts
            return rng.standard_normal(shape, dtype=np.float32)
        if qtype == Q.F32:
            return np.ones(shape, np.float32)
        return random_matrix(rng, shape, qtype)

    # Header first, then each tensor generated and written in turn (an 8B file never sits in memory).
    for name, shape, qtype in tensors:
        if qtype == Q.F32 or qtype == Q.F16:
            dtype = np.float32 if qtype == Q.F32 else np.float16
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            w.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
        else:
            block, block_bytes, _ = SCALES[qtype]
            *outer, cols = shape
            nbytes = int(np.prod(outer)) * cols // block * block_bytes
            w.add_tensor_info(name, (*outer, cols // block * block_bytes), np.dtype(np.uint8), nbytes,
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype in tensors:
        w.write_tensor_data(data(name, shape, qtype))
    w.close()
    os.replace(tmp, path)


def main():
    cache = Path(os.environ.get("FATHOM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fathom")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=cache / "bench-models")
    ap.add_argument("--shapes", default="llama-3.2-1b")
    ap.add_argument("--layouts", default="q4_k_m")
    ap.add_argument("--vocab-dir", type=Path,
                    default=cache / "llama-cpp-python-0.3.36" / "src" / "vendor" / "llama.cpp" / "models")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for shape in a.shapes.split(","):
        if shape not in SHAPES:
            sys.exit(f"unknown shape {shape} (known: {', '.join(SHAPES)})")
        for layout in a.layouts.split(","):
            if layout not in FILE_TYPES:
                sys.exit(f"unknown layout {layout} (known: {', '.join(FILE_TYPES)})")
            path = a.out / f"{shape}-{layout}.gguf"
            if path.exists():
                print(f"{path}: exists")
                continue
            write(path, shape, layout, a.vocab_dir)
            print(f"{path}: {path.stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
