#!/usr/bin/env python3
"""Two random-weight models of the same active size for bench_decode's MoE-vs-dense A/B: a
Mixtral-style `llama` with 8 experts of FFN, top-2, and a dense `llama` whose MLP is 2·FFN wide
(the same bytes read per decoded token: the MoE adds only its router). Q8_0 matrices, f32 norms.

  .venv-fixtures/bin/python bench/moe_models.py OUT_DIR   ->  OUT_DIR/{moe,dense}.gguf
  build/bench_decode --model OUT_DIR/moe.gguf --threads 2 --depths 0 --decode-tokens 64

Needs only numpy and gguf (scripts/requirements-fixtures.txt).
"""
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fixture_lib import VOCAB, add_bpe_vocab, finish_gguf, gpt2_byte_chars  # noqa: E402

DIM, FFN, LAYERS, HEADS, KV_HEADS, EXPERTS, USED = 1024, 1024, 8, 16, 4, 8, 2


def q8(w, name, x):
    w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def write(path, experts):
    rng = np.random.default_rng(48)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN if experts else USED * FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    if experts:
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(USED)
    tokens = [gpt2_byte_chars()[b] for b in range(VOCAB - 2)] + ["ab", "<|end|>"]
    add_bpe_vocab(w, tokens, {VOCAB - 1}, ["a b"], "gpt2", eos=VOCAB - 1)
    s = 1 / np.sqrt(DIM)
    q8(w, "token_embd.weight", rng.normal(0, 1, (VOCAB, DIM)))
    q8(w, "output.weight", rng.normal(0, s, (VOCAB, DIM)))
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    hd = DIM // HEADS
    for il in range(LAYERS):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", np.ones(DIM, np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(DIM, np.float32))
        q8(w, b + "attn_q.weight", rng.normal(0, s, (DIM, DIM)))
        q8(w, b + "attn_k.weight", rng.normal(0, s, (KV_HEADS * hd, DIM)))
        q8(w, b + "attn_v.weight", rng.normal(0, s, (KV_HEADS * hd, DIM)))
        q8(w, b + "attn_output.weight", rng.normal(0, s, (DIM, DIM)))
        if experts:
            w.add_tensor(b + "ffn_gate_inp.weight", rng.normal(0, s, (EXPERTS, DIM)).astype(np.float32))
            q8(w, b + "ffn_gate_exps.weight", rng.normal(0, s, (EXPERTS, FFN, DIM)))
            q8(w, b + "ffn_up_exps.weight", rng.normal(0, s, (EXPERTS, FFN, DIM)))
            q8(w, b + "ffn_down_exps.weight", rng.normal(0, 1 / np.sqrt(FFN), (EXPERTS, DIM, FFN)))
        else:
            q8(w, b + "ffn_gate.weight", rng.normal(0, s, (USED * FFN, DIM)))
            q8(w, b + "ffn_up.weight", rng.normal(0, s, (USED * FFN, DIM)))
            q8(w, b + "ffn_down.weight", rng.normal(0, 1 / np.sqrt(USED * FFN), (DIM, USED * FFN)))
    finish_gguf(w)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write(out / "moe.gguf", True)
    write(out / "dense.gguf", False)
