#!/usr/bin/env python3
"""A small random-weight model with SmolLM2's tokenizer, for the engine's mechanics tests.

The tests of scheduling, KV tiers, cache-or-recompute and forks (tests/unit/test_engine.cpp,
tests/kernel/test_cuda_policies.cpp's engine runs) assert that one configuration gives exactly the
tokens of another: any deterministic model of the real architecture shows a wrong KV byte, and a
small one runs them ~15x faster than SmolLM2 (the CUDA ones under emulation). This one is
SmolLM2-135M's file with its tokenizer, chat template and types kept (so prompts have the same
token counts and every tier size in blocks stays as the tests reason about it) and its transformer
replaced: 5 layers (HiP leaves the first 3 dense), width 128, 2 query heads and 1 KV head of 64,
seeded Gaussian weights scaled so that attention is peaked (a wrong key changes the output).

    make_small_model.py SRC.gguf DST.gguf     (scripts/setup.sh runs it; ~5 s)
"""
import sys

import gguf
import numpy as np

from gguf_util import copy_tokenizer

LAYERS, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN = 5, 128, 2, 1, 64, 256
SEED = 46
Q = gguf.GGMLQuantizationType


def main(src, dst):
    r = gguf.GGUFReader(src)
    arch = "llama"
    if str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8") != arch:
        sys.exit(f"{src}: expected a llama file")
    w = gguf.GGUFWriter(dst, arch)
    w.add_name("SmolLM2 tokenizer, small random-weight transformer (fathom engine tests)")
    # Everything the tokenizer and chat template need, as the source has it.
    vocab = copy_tokenizer(r, w)
    w.add_context_length(8192)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)

    rng = np.random.default_rng(SEED)

    def matrix(rows, cols, gain=1.6):
        return rng.normal(0.0, gain / np.sqrt(cols), (rows, cols)).astype(np.float32)

    def add(name, data, qtype):
        raw = gguf.quants.quantize(data, qtype) if qtype != Q.F32 else data
        w.add_tensor(name, raw, raw_shape=raw.shape if qtype != Q.F32 else None, raw_dtype=qtype)

    def norm(n):
        return rng.uniform(0.8, 1.2, n).astype(np.float32)

    add("token_embd.weight", rng.normal(0.0, 0.2, (vocab, DIM)).astype(np.float32), Q.Q8_0)  # tied output
    add("output_norm.weight", norm(DIM), Q.F32)
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", norm(DIM), Q.F32)
        add(b + "attn_q.weight", matrix(q_dim, DIM, 3.0), Q.Q4_1)
        add(b + "attn_k.weight", matrix(kv_dim, DIM, 3.0), Q.Q4_1)
        add(b + "attn_v.weight", matrix(kv_dim, DIM), Q.Q4_1)
        add(b + "attn_output.weight", matrix(DIM, q_dim), Q.Q4_1)
        add(b + "ffn_norm.weight", norm(DIM), Q.F32)
        add(b + "ffn_gate.weight", matrix(FFN, DIM), Q.Q4_1)
        add(b + "ffn_up.weight", matrix(FFN, DIM), Q.Q4_1)
        add(b + "ffn_down.weight", matrix(DIM, FFN), Q.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
