#!/usr/bin/env python3
"""Tiny random-weight models and transformers' logits for them: every fixture of tests/fixtures/.

`make fixtures` runs this in its own environment (.venv-fixtures, scripts/requirements-fixtures.txt:
torch and transformers are not needed by `make test`). The architecture fixtures (qwen2, qwen3, phi3:
tests/fixtures/arch/) are scripts/arch_fixtures.py's; this file makes the RoPE scaling ones. For each
RoPE variant it

  1. builds a 2-layer LlamaForCausalLM from a config with `transformers` (random weights, seeded),
  2. writes it as GGUF with the `gguf` package the way llama.cpp's converter lays a llama out
     (Q and K rows permuted for adjacent-pair RoPE; for llama3 scaling the `rope_freqs` tensor of
     per-frequency divisors and no scaling type, as Llama 3.1 files carry it),
  3. stores transformers' f32 logits of every position of two prompts (the long one goes past
     original_max_position_embeddings), its RoPE inverse frequencies and attention scaling, and
     how far its own f32 logits are from its f64 ones (the noise floor of any f32 implementation).

Output: tests/fixtures/rope/<variant>.gguf, <variant>.logits.f32 (rows of `vocab` f32, prompt after
prompt), and <variant>.json (shapes, prompts, reference figures). The test is
tests/kernel/test_cuda_rope_scaling.cpp (CPU backend and the CUDA backend under emulation).
"""
import argparse
import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import arch_fixtures
import embedding_fixtures
import gemma3_fixtures
import gpt_oss_mxfp4_fixture
import moe_identity_fixtures
from fixture_lib import (INITIALIZER_RANGE, VOCAB, add_bpe_vocab, f32_vs_f64, finish_gguf, gpt2_byte_chars,
                         logits_of, made_with, randomize_norms, rel_error)

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rope"

# Small enough to commit (~300 KB of f32 weights per variant), wide enough that RoPE matters:
# head_dim 32 gives 16 frequencies whose wavelengths (2*pi*10000^(2i/32): 6, 11, 20, 35, 63, 112, ...)
# straddle original_max_position_embeddings = 64, so llama3's kept / blended / divided bands and
# YaRN's ramp all have members (initializer_range: fixture_lib).
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-5,
            initializer_range=INITIALIZER_RANGE, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            bos_token_id=0, eos_token_id=127)
ORIGINAL_CONTEXT = 64
THETA = 10000.0
PROMPT_LENGTHS = (12, 160)  # 160 = 2.5 x the original context
# llama3 also at position ~10,000 (the check): the last LONG_ROWS positions of a LONG_PROMPT
# token prompt, in f64. transformers computes the RoPE angle pos * inv_freq in f32 whatever the
# model's dtype (off by up to 5e-4 rad at 10,000, where fathom's angles are double): the test's
# tolerance there allows for it.
LONG_PROMPT, LONG_ROWS = 10016, 16

VARIANTS = {
    # Llama 3.1's rule (its values: factor 8, low 1, high 4), as llama.cpp writes it: rope_freqs.
    "llama3": dict(rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": ORIGINAL_CONTEXT},
                   max_positions=512, gguf_style="rope_freqs"),
    # The same model, the rule given by metadata keys instead of the tensor (same reference).
    "llama3-keys": dict(same_as="llama3", gguf_style="llama3_keys"),
    "linear": dict(rope={"rope_type": "linear", "factor": 4.0}, max_positions=256, gguf_style="linear"),
    "yarn": dict(rope={"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": ORIGINAL_CONTEXT},
                 max_positions=256, gguf_style="yarn"),
}


def build_model(name, spec, seed):
    rope = dict(spec["rope"], rope_theta=THETA)
    cfg = LlamaConfig(**BASE, max_position_embeddings=spec["max_positions"], rope_parameters=rope)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    randomize_norms(model)
    return model


def llama_cpp_permute(w, n_head):
    """HF's rotate_half pairs (i, i + d/2) -> GGUF llama's adjacent pairs (2i, 2i + 1), per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_freq_factors(rope, head_dim):
    """Divisor of each inverse frequency, as llama.cpp's converter computes rope_freqs."""
    inv = 1.0 / (THETA ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    orig, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path, model, spec, style):
    cfg = model.config
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"rope fixture {path.stem}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rope = spec["rope"]
    if style == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif style == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif style == "llama3_keys":  # no GGUF enum value: the keys fathom reads for the rule
        arch = "llama"
        w.add_string(f"{arch}.rope.scaling.type", "llama3")
        w.add_float32(f"{arch}.rope.scaling.factor", rope["factor"])
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        w.add_float32(f"{arch}.rope.scaling.low_freq_factor", rope["low_freq_factor"])
        w.add_float32(f"{arch}.rope.scaling.high_freq_factor", rope["high_freq_factor"])
    # Byte-level BPE over the first 127 bytes, plus an end-of-text control token; the test feeds ids.
    byte_chars = gpt2_byte_chars()
    tokens = [byte_chars[b] for b in range(cfg.vocab_size - 1)] + ["<|end|>"]
    add_bpe_vocab(w, tokens, {cfg.vocab_size - 1}, [f"{byte_chars[ord('a')]} {byte_chars[ord('b')]}"], "default",
                  bos=cfg.bos_token_id, eos=cfg.eos_token_id)

    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    if style == "rope_freqs":
        w.add_tensor("rope_freqs.weight", llama3_freq_factors(rope, cfg.head_dim))
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], nh))
        w.add_tensor(b + "attn_k.weight", llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], nkv))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    finish_gguf(w)


def reference(model, prompts):
    """f32 logits; how far they are from f64 (noise); how far unscaled RoPE is (what the test catches)."""
    f32, noise = f32_vs_f64(model, prompts)
    plain_cfg = LlamaConfig(**{**model.config.to_dict(), "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": THETA}})
    plain_cfg._attn_implementation = "eager"
    plain = LlamaForCausalLM(plain_cfg).eval()
    plain.load_state_dict(model.state_dict())
    unscaled = logits_of(plain, prompts)
    return f32, noise, rel_error(unscaled, f32)


def long_reference(model, name, rng, out):
    """The last LONG_ROWS logits of a LONG_PROMPT-token prompt in f64 (and how far f32 is from them)."""
    ids = rng.integers(0, BASE["vocab_size"] - 1, LONG_PROMPT).tolist()
    with torch.no_grad():
        f64 = model.to(torch.float64)(torch.tensor([ids])).logits[0, -LONG_ROWS:].numpy()
        model.to(torch.float32)
        f32 = model(torch.tensor([ids])).logits[0, -LONG_ROWS:].numpy()
    f64.astype("<f4").tofile(out / f"{name}.long.logits.f32")
    return dict(prompt=ids, first_row=LONG_PROMPT - LONG_ROWS, logits=f"{name}.long.logits.f32",
                transformers_f32_vs_f64_rel=rel_error(f32, f64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["rope", "arch", "embed"], help="one set of fixtures (default: all)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the RoPE fixtures go")
    args = ap.parse_args()
    if args.only in (None, "rope"):
        make_rope_fixtures(args.out)
    if args.only in (None, "arch"):
        arch_fixtures.make_all(arch_fixtures.OUT)
        moe_identity_fixtures.main()  # reads the arch step's qwen3.gguf
        gemma3_fixtures.main()  # reads gemma2.json's prompts and gemma2-hf's tokenizer
        gpt_oss_mxfp4_fixture.main()  # reads gpt-oss.mxfp4.gguf and gpt-oss-hf
    if args.only in (None, "embed"):  # after arch: it reads the arch fixtures' Hugging Face directories
        embedding_fixtures.make_all(embedding_fixtures.OUT)


def make_rope_fixtures(out):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(48)
    prompts = [rng.integers(0, BASE["vocab_size"] - 1, n).tolist() for n in PROMPT_LENGTHS]
    built, refs = {}, {}
    for seed, (name, spec) in enumerate(VARIANTS.items()):
        src = spec.get("same_as")
        if src:
            model, full = built[src]
            spec = dict(full, gguf_style=spec["gguf_style"])
        else:
            model = build_model(name, spec, seed)
            built[name] = (model, spec)
        write_gguf(out / f"{name}.gguf", model, spec, spec["gguf_style"])
        if src:
            logits_file = f"{src}.logits.f32"  # the same model: the same reference
            noise, unscaled, long = refs[src]
        else:
            logits_file = f"{name}.logits.f32"
            logits, noise, unscaled = reference(model, prompts)
            logits.tofile(out / logits_file)
            long = long_reference(model, name, rng, out) if name == "llama3" else None
            refs[name] = (noise, unscaled, long)
        rot = model.model.rotary_emb
        meta = dict(
            gguf=f"{name}.gguf", logits=logits_file, vocab=BASE["vocab_size"],
            prompts=prompts, rope_parameters=dict(spec["rope"], rope_theta=THETA),
            max_position_embeddings=spec["max_positions"], gguf_style=spec["gguf_style"],
            hf_inv_freq=[float(x) for x in rot.inv_freq.to(torch.float64)],
            hf_attention_scaling=float(rot.attention_scaling),
            f32_vs_f64_rel=noise, unscaled_rope_rel=unscaled, long=long,
            made_with=made_with())
        (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        if long:
            print(f"{name}: at positions {long['first_row']}.., transformers' f32 is "
                  f"{long['transformers_f32_vs_f64_rel']:.2e} from its f64 reference")
        print(f"{name}: attention scaling {meta['hf_attention_scaling']:.6f}, f32 vs f64 {noise:.2e}, "
              f"unscaled RoPE {unscaled:.2e} (max|d| / max|ref| over rows)")


if __name__ == "__main__":
    main()
