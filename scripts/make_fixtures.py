#!/usr/bin/env python3
"""Tiny random-weight Llama models with RoPE scaling, and transformers' logits for them.

`make fixtures` runs this in its own environment (.venv-fixtures, scripts/requirements-fixtures.txt:
torch and transformers are not needed by `make test`). For each variant it

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
import importlib.metadata
import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rope"

# Small enough to commit (~300 KB of f32 weights per variant), wide enough that RoPE matters:
# head_dim 32 gives 16 frequencies whose wavelengths (2*pi*10000^(2i/32): 6, 11, 20, 35, 63, 112, ...)
# straddle original_max_position_embeddings = 64, so llama3's kept / blended / divided bands and
# YaRN's ramp all have members. initializer_range 0.2 makes attention scores O(1) (std ~ (8 * 0.2)^2),
# so a wrong rotation changes which keys a query attends to instead of averaging away.
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-5,
            initializer_range=0.2, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
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
    with torch.no_grad():  # norm weights away from 1, so that reading them wrongly shows
        for mod in model.modules():
            if type(mod).__name__ == "LlamaRMSNorm":
                mod.weight.uniform_(0.8, 1.2)
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
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (cfg.vocab_size - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges([f"{byte_chars[ord('a')]} {byte_chars[ord('b')]}"])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)

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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gpt2_byte_chars():
    """GPT-2's printable stand-in of each byte (the alphabet byte-level BPE vocabularies use)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def rel_error(got, want):
    """max over rows of max|got - want| / max|want| (the test's measure)."""
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


def logits_of(model, prompts):
    with torch.no_grad():
        return np.concatenate([model(torch.tensor([p])).logits[0].numpy() for p in prompts])


def reference(model, prompts):
    """f32 logits; how far they are from f64 (noise); how far unscaled RoPE is (what the test catches)."""
    f32 = logits_of(model, prompts)
    f64 = logits_of(model.to(torch.float64), prompts)
    model.to(torch.float32)
    plain_cfg = LlamaConfig(**{**model.config.to_dict(), "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": THETA}})
    plain_cfg._attn_implementation = "eager"
    plain = LlamaForCausalLM(plain_cfg).eval()
    plain.load_state_dict(model.state_dict())
    unscaled = logits_of(plain, prompts)
    return f32.astype("<f4"), rel_error(f32, f64), rel_error(unscaled, f32)


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
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
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
        write_gguf(args.out / f"{name}.gguf", model, spec, spec["gguf_style"])
        if src:
            logits_file = f"{src}.logits.f32"  # the same model: the same reference
            noise, unscaled, long = refs[src]
        else:
            logits_file = f"{name}.logits.f32"
            logits, noise, unscaled = reference(model, prompts)
            logits.tofile(args.out / logits_file)
            long = long_reference(model, name, rng, args.out) if name == "llama3" else None
            refs[name] = (noise, unscaled, long)
        rot = model.model.rotary_emb
        meta = dict(
            gguf=f"{name}.gguf", logits=logits_file, vocab=BASE["vocab_size"],
            prompts=prompts, rope_parameters=dict(spec["rope"], rope_theta=THETA),
            max_position_embeddings=spec["max_positions"], gguf_style=spec["gguf_style"],
            hf_inv_freq=[float(x) for x in rot.inv_freq.to(torch.float64)],
            hf_attention_scaling=float(rot.attention_scaling),
            f32_vs_f64_rel=noise, unscaled_rope_rel=unscaled, long=long,
            made_with=dict(transformers=transformers.__version__, torch=torch.__version__,
                           gguf=importlib.metadata.version("gguf")))
        (args.out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        if long:
            print(f"{name}: at positions {long['first_row']}.., transformers' f32 is "
                  f"{long['transformers_f32_vs_f64_rel']:.2e} from its f64 reference")
        print(f"{name}: attention scaling {meta['hf_attention_scaling']:.6f}, f32 vs f64 {noise:.2e}, "
              f"unscaled RoPE {unscaled:.2e} (max|d| / max|ref| over rows)")


if __name__ == "__main__":
    main()
