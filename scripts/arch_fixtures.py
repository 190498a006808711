"""Tiny random-weight Qwen2, Qwen3, Phi-3, Llama 3.1, Qwen3-MoE, Mixtral, Mistral, Gemma 2 and gpt-oss models, and transformers' logits for them.

Part of `make fixtures` (scripts/make_fixtures.py calls make_all; .venv-fixtures). For each family it

  1. builds a 2-layer model from a config with `transformers` (random weights, seeded; every weight
     rounded to a bf16 value so that the bf16 files below hold the reference model exactly),
  2. saves it as a Hugging Face directory (<name>-hf/: config.json, bf16 model.safetensors, a byte-level
     tokenizer.json),
  3. writes it as GGUF with the `gguf` package the way llama.cpp's converter lays these
     architectures out (tensor names from gguf's own tables; qwen2/qwen3/phi3 unpermuted, rotating
     NEOX-style; llama's Q and K rows permuted for adjacent-pair rotation and its llama3 scaling as
     the rope_freqs tensor, as the converter writes them (Mixtral too: a `llama` with experts); phi3's
     fused attn_qkv and gate/up ffn_up as the checkpoint stores them; the MoE families' experts as the
     stacked ffn_{gate,up,down}_exps and their router ffn_gate_inp in f32, as the converter writes them),
  4. converts the Hugging Face directory with llama.cpp's own convert_hf_to_gguf.py (the pinned
     llama-cpp-python sdist's vendor/llama.cpp, fetched once into .venv-fixtures/) into
     <name>.llamacpp.gguf: an independent writer of the same model,
  5. stores transformers' f32 logits of every position of two prompts (12 and 120 tokens), its RoPE
     frequencies, how far its f32 logits are from its f64 ones, how far a model missing the
     family's feature is (what the tests must catch), and 32 greedy tokens with their margins after
     a prompt chosen for clear margins.

Output: tests/fixtures/arch/<name>.{gguf,llamacpp.gguf,logits.f32,json} and <name>-hf/. The test is
tests/kernel/test_cuda_arch_fixtures.cpp (CPU backend and the CUDA backend under emulation).
`python scripts/arch_fixtures.py NAME...` makes only the families named.

The MoE families' seeds are chosen so that no token of the two prompts is near a routing tie: the
gap between the k-th and (k+1)-th router logit is at least the family's min_router_gap (0.01-0.02
logits, against the CUDA backend's ~2e-3 error in them) everywhere, so that an implementation's
rounding does not change which experts a token takes (the seed found is kept in FAMILIES); the
smallest gap, also over the greedy run, is in the JSON (router_min_gap).
"""
import copy
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (Gemma2Config, Gemma2ForCausalLM, GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from fixture_lib import (INITIALIZER_RANGE, VOCAB, add_bpe_vocab, f32_vs_f64, finish_gguf, gpt2_byte_chars,
                         logits_of, made_with, randomize_norms, rel_error)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "arch"
# The converter under test: llama.cpp as vendored by this llama-cpp-python release (its sdist).
LLAMA_CPP_PYTHON = "0.3.36"
CONVERTER = ROOT / ".venv-fixtures" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"

PROMPT_LENGTHS = (12, 120)
GREEDY_STEPS = 32
GREEDY_CANDIDATES = 100
END = VOCAB - 1  # "<|end|>", the end-of-text control token

# Shared by every family: ~70-90k parameters (~140-180 KB in bf16 per file).
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
              initializer_range=INITIALIZER_RANGE, max_position_embeddings=256, eos_token_id=END,
              bos_token_id=None, pad_token_id=None)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
LONG_FACTORS = [round(float(x), 4) for x in np.geomspace(1.0, 16.0, 12)]   # rope_dim 24: 12 pairs
SHORT_FACTORS = [round(float(x), 4) for x in np.linspace(1.0, 1.5, 12)]

FAMILIES = {
    # Qwen2.5-style: Q/K/V biases, tied embeddings, NEOX RoPE, theta 1e6.
    "qwen2": dict(arch="qwen2", model=Qwen2ForCausalLM, config=Qwen2Config, pre="qwen2", tokenizer="Qwen2Tokenizer",
                  hf=dict(num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, tie_word_embeddings=True,
                          rope_parameters=dict(rope_type="default", rope_theta=1e6)),
                  ablation="the Q/K/V biases left out"),
    # Qwen3-style: per-head QK RMSNorm, explicit head_dim (q_dim 96 != hidden 64), no bias, untied.
    "qwen3": dict(arch="qwen3", model=Qwen3ForCausalLM, config=Qwen3Config, pre="qwen2", tokenizer="Qwen2Tokenizer",
                  hf=dict(num_attention_heads=2, num_key_value_heads=1, head_dim=48, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
                  ablation="the QK norms left out"),
    # Phi-3-mini-4k-style: fused QKV and gate/up, a sliding window (24 here, which the greedy steps
    # outgrow; 2047 there), no longrope.
    "phi3": dict(arch="phi3", model=Phi3ForCausalLM, config=Phi3Config, pre="gpt2", tokenizer="GPT2Tokenizer",
                 hf=dict(num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         sliding_window=24, original_max_position_embeddings=256,
                         rope_parameters=dict(rope_type="default", rope_theta=1e4)),
                 ablation="the sliding window left out"),
    # Phi-3.5/4-mini-style: longrope (original context 64 of 256: the long factors), partial rotary
    # (0.75: 24 of 32 dims), tied embeddings, no window.
    "phi3-longrope": dict(arch="phi3", model=Phi3ForCausalLM, config=Phi3Config, pre="gpt2", tokenizer="GPT2Tokenizer",
                          hf=dict(num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
                                  tie_word_embeddings=True, original_max_position_embeddings=64,
                                  partial_rotary_factor=0.75,
                                  rope_parameters=dict(rope_type="longrope", rope_theta=1e4, partial_rotary_factor=0.75,
                                                       original_max_position_embeddings=64,
                                                       long_factor=LONG_FACTORS, short_factor=SHORT_FACTORS)),
                          ablation="the short factors instead of the long ones"),
    # Llama 3.1-style: llama3 RoPE scaling (original context 64 of 256, factor 8: with theta 5e5 and
    # rope_dim 16 one pair kept, one blended, six divided by 8), GQA 4:2, untied; Llama 3's
    # tokenizer (its Split regex, ignore_merges). Its GGUF permutes Q and K as llama.cpp's converter
    # does; the Hugging Face directory keeps the checkpoint's rotate-half rows.
    "llama": dict(arch="llama", model=LlamaForCausalLM, config=LlamaConfig, pre="llama-bpe",
                  tokenizer="PreTrainedTokenizerFast",
                  hf=dict(num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                          rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=64)),
                  ablation="the llama3 scaling left out"),
    # Qwen3-30B-A3B-style: Qwen3's attention (QK norm, head_dim 48), every layer 4 experts of width
    # 48 with top-2 routing, the top-2 probabilities renormalised (norm_topk_prob, as the released
    # models and llama.cpp's qwen3moe do).
    "qwen3moe": dict(arch="qwen3moe", model=Qwen3MoeForCausalLM, config=Qwen3MoeConfig, pre="qwen2",
                     tokenizer="Qwen2Tokenizer",
                     hf=dict(num_attention_heads=2, num_key_value_heads=1, head_dim=48, rms_norm_eps=1e-6,
                             tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=1e6),
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[]),
                     ablation="the top-2 weights not renormalised", min_router_gap=0.02, seed=41104),
    # Mixtral-8x7B-style: a llama (GGUF `llama`, Q/K permuted) whose every MLP is 4 experts of
    # intermediate_size with top-2 routing (softmax over the top-2 logits), no sliding window.
    "mixtral": dict(arch="llama", model=MixtralForCausalLM, config=MixtralConfig, pre="gpt2", tokenizer="GPT2Tokenizer",
                    hf=dict(num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            sliding_window=None, rope_parameters=dict(rope_type="default", rope_theta=1e6),
                            num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0),
                    ablation="top-1 routing instead of top-2", min_router_gap=0.01, seed=8105),
    # Mistral-7B-v0.1-style: a llama with one sliding window on every layer (24 here, 4096 there),
    # GQA 4:2. llama.cpp's converter drops the window (its GGUF runs without one, so the other format
    # the tests compare with is the Hugging Face directory); ours writes llama.attention.sliding_window.
    "mistral": dict(arch="llama", model=MistralForCausalLM, config=MistralConfig, pre="gpt2", tokenizer="GPT2Tokenizer",
                    hf=dict(num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            sliding_window=24, rope_parameters=dict(rope_type="default", rope_theta=1e4)),
                    ablation="the sliding window left out", converter_drops_window=True),
    # Gemma-2-style: attention and final logit soft-capping (caps of 20 and 10 here, about twice and
    # three times the spread of this model's logits, which they bend; 50 and 30 there), every other
    # layer a 24-token sliding window starting with the first, head_dim 48 (q_dim 96 != hidden 64) and
    # query_pre_attn_scalar = head_dim (all sizes but the 27B), post-attention/MLP norms, GeGLU, the
    # embedding times sqrt(hidden), norms stored as w - 1 in the checkpoint (the GGUF adds 1, as
    # llama.cpp's converter does; fathom adds it when it reads the directory). Gemma 3, whose
    # directory fixture needs no transformers, is scripts/gemma3_fixtures.py's.
    "gemma2": dict(arch="gemma2", model=Gemma2ForCausalLM, config=Gemma2Config, pre="gpt2", tokenizer="GPT2Tokenizer",
                   hf=dict(num_attention_heads=2, num_key_value_heads=1, head_dim=48, rms_norm_eps=1e-6,
                           tie_word_embeddings=True, sliding_window=24, query_pre_attn_scalar=48,
                           attn_logit_softcapping=20.0, final_logit_softcapping=10.0,
                           rope_parameters=dict(rope_type="default", rope_theta=1e4)),
                   ablation="the soft-capping left out"),
    # gpt-oss-style: attention sinks, Q/K/V/O biases, every other layer a 24-token window (128
    # there), 4 experts of 80 with top-2 routing (softmax over the top-2 biased router logits),
    # expert biases, the clamped SwiGLU (gate and up interleaved in gate_up_proj), untruncated YaRN
    # (factor 4 over an original 64 of 256; theta 150000), head_dim 32 (q_dim 128 != hidden 64).
    # Weights bf16; its gpt-oss.mxfp4.gguf has the released layout's MXFP4 gate and up experts
    # (scripts/gpt_oss_mxfp4_fixture.py writes them as a directory too: gpt-oss-mxfp4-hf/). fathom
    # transposes and splits the directory's fused experts at load (engine/model/hf_gpt_oss.h).
    "gpt-oss": dict(arch="gpt-oss", model=GptOssForCausalLM, config=GptOssConfig, pre="gpt2", tokenizer="GPT2Tokenizer",
                    hf=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                            tie_word_embeddings=False, sliding_window=24,
                            num_local_experts=4, num_experts_per_tok=2,
                            rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0,
                                                 beta_slow=1.0, truncate=False, original_max_position_embeddings=64)),
                    ablation="the attention sinks left out", min_router_gap=0.02, seed=8300, gguf_only=True),
}
MOE = ("qwen3moe", "mixtral", "gpt-oss")


def build_model(spec, seed, hf_overrides=None):
    cfg = spec["config"](**COMMON, **{**spec["hf"], **(hf_overrides or {})})
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "num_experts_per_tok"):  # the per-expert loop (the grouped_mm one refuses f64)
        cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = spec["model"](cfg).eval()
    randomize_norms(model)
    gemma = spec["arch"] == "gemma2"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".bias", "_bias")):  # transformers starts them at 0: a bias read wrongly would not show
                p.normal_(0.0, 0.5)
            if name.endswith(".sinks"):  # gpt-oss: logits of the size of the keys'
                p.normal_(0.0, 1.0)
        for p in model.parameters():  # bf16 values: the bf16 files hold this model exactly
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        if gemma:  # Gemma scales by 1 + w, which the converters store: 1 + w a bf16 value too
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_((p + 1).to(torch.bfloat16).to(torch.float32) - 1)
    return model


def same_weights(spec, model, hf_overrides):
    """The model with another config (the reference's or an ablation's) and the same weights."""
    other = build_model(spec, 0, hf_overrides)
    other.load_state_dict(model.state_dict())
    return other


def byte_vocab():
    """Bytes 0..125, "ab" (one merge), and the end-of-text control token: VOCAB tokens."""
    chars = gpt2_byte_chars()
    return [chars[b] for b in range(VOCAB - 2)] + ["ab", "<|end|>"]


def save_hf(model, spec, out):
    """config.json, bf16 model.safetensors and a byte-level BPE tokenizer.json."""
    out.mkdir(parents=True, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)  # a copy: .to() would round inv_freq too
    tokens = byte_vocab()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens[:-1])}, merges=[("a", "b")]))
    if spec["pre"] == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif spec["pre"] == "llama-bpe":
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens[:-1])}, merges=[("a", "b")],
                                   ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[END], special=True)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class=spec["tokenizer"], eos_token=tokens[END], bos_token=None, pad_token=None, unk_token=None,
        model_max_length=COMMON["max_position_embeddings"], add_prefix_space=False), indent=1) + "\n")


def rope_dims(cfg):
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0))


def longrope_attn_factor(cfg):
    """What llama.cpp's converter writes (and transformers computes without a `factor`)."""
    scale = cfg.max_position_embeddings / cfg.rope_parameters["original_max_position_embeddings"]
    return float(np.sqrt(1 + np.log(scale) / np.log(cfg.rope_parameters["original_max_position_embeddings"])))


def llama_permute(weights, n_head):
    """llama.cpp's converter's Q/K row order: each head's rotate-half pairs (i, i + d/2) made adjacent."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def llama3_rope_freqs(cfg):
    """The rope_freqs tensor llama.cpp's converter writes for llama3 scaling (its arithmetic: float32
    frequencies, Python floats between): each pair's divisor."""
    rope = cfg.rope_parameters
    dim = cfg.hidden_size // cfg.num_attention_heads
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def write_gguf(path, model, spec, mxfp4_experts=False):
    """GGUF as llama.cpp's converter writes this family with --outtype bf16: 2-D tensors bf16, 1-D f32
    (gpt-oss with mxfp4_experts: its experts' gate and up matrices MXFP4, as released)."""
    cfg, arch = model.config, spec["arch"]
    rope = cfg.rope_parameters
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"arch fixture {path.stem}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch in ("qwen3", "qwen3moe", "gemma2", "gpt-oss"):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if arch == "gemma2":
        w.add_sliding_window(cfg.sliding_window)
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if arch == "llama" and experts:  # Mixtral: what llama.cpp's converter writes for it
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(rope_dims(cfg))
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "gpt-oss":  # what llama.cpp's converter writes for it
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_sliding_window(cfg.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(rope.get("original_max_position_embeddings",
                                                 cfg.original_max_position_embeddings))
        w.add_rope_dimension_count(rope_dims(cfg))
        w.add_sliding_window(cfg.sliding_window or 0)
        if rope.get("rope_type") == "longrope":
            w.add_rope_scaling_attn_factors(longrope_attn_factor(cfg))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if arch == "llama" and not experts:  # the Llama 3.1 and Mistral families
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        w.add_key_length(cfg.hidden_size // cfg.num_attention_heads)
        w.add_value_length(cfg.hidden_size // cfg.num_attention_heads)
        if rope.get("rope_type") == "llama3":
            w.add_tensor("rope_freqs.weight", llama3_rope_freqs(cfg))
    if getattr(cfg, "sliding_window", None) and arch == "llama":  # Mistral's, every layer
        w.add_sliding_window(cfg.sliding_window)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    add_bpe_vocab(w, byte_vocab(), {END}, ["a b"], spec["pre"], eos=END)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper().replace("-", "_")], cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if arch != "gpt-oss" and (".mlp.gate." in hf_name or ".mlp.experts." in hf_name):
            add_moe_tensor(w, hf_name, t)
            continue
        if arch == "gpt-oss" and (".mlp.experts." in hf_name or ".mlp.router." in hf_name):
            add_gpt_oss_moe_tensor(w, hf_name, t, mxfp4_experts)
            continue
        if hf_name.endswith(".sinks"):  # f32, as the converter writes 1-D tensors
            w.add_tensor(f"blk.{hf_name.split('.')[2]}.attn_sinks.weight", t.detach().to(torch.float32).numpy())
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise KeyError(f"{hf_name}: not in gguf's {arch} tensor table")
        data = t.detach().to(torch.float32).numpy()
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = llama_permute(data, cfg.num_attention_heads)
        if arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = llama_permute(data, cfg.num_key_value_heads)
        if arch == "gemma2" and hf_name.endswith("norm.weight"):  # Gemma scales by 1 + w
            data = data + 1
        if data.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, data)
    finish_gguf(w)


def add_moe_tensor(w, hf_name, t):
    """transformers' MoE layout -> llama.cpp's: the router (n_experts, dim) as f32 ffn_gate_inp; the
    experts' gate_up_proj (n_experts, 2 ffn, dim) split into ffn_gate_exps and ffn_up_exps, down_proj
    (n_experts, dim, ffn) as ffn_down_exps, bf16 (GGUF dims reversed: [dim, ffn, n_experts])."""
    bid = int(hf_name.split(".")[2])
    data = t.detach().to(torch.float32).numpy()

    def bf16(name, x):
        w.add_tensor(f"blk.{bid}.{name}.weight", gguf.quants.quantize(np.ascontiguousarray(x), gguf.GGMLQuantizationType.BF16),
                     raw_dtype=gguf.GGMLQuantizationType.BF16)
    if hf_name.endswith(".mlp.gate.weight"):
        w.add_tensor(f"blk.{bid}.ffn_gate_inp.weight", data)
    elif hf_name.endswith(".mlp.experts.gate_up_proj"):
        ffn = data.shape[1] // 2
        bf16("ffn_gate_exps", data[:, :ffn, :])
        bf16("ffn_up_exps", data[:, ffn:, :])
    elif hf_name.endswith(".mlp.experts.down_proj"):
        bf16("ffn_down_exps", data)
    else:
        raise KeyError(f"{hf_name}: an MoE tensor the fixture does not lay out")


def add_gpt_oss_moe_tensor(w, hf_name, t, mxfp4=False):
    """gpt-oss's MoE layout -> llama.cpp's: the router's weight and bias (f32), gate_up_proj (n_experts,
    dim, 2 ffn: gate and up interleaved) transposed and split into ffn_gate_exps / ffn_up_exps, down_proj
    (n_experts, ffn, dim) transposed into ffn_down_exps, and their biases split the same way (f32)."""
    bid = int(hf_name.split(".")[2])
    data = t.detach().to(torch.float32).numpy()

    def bf16(name, x):
        w.add_tensor(f"blk.{bid}.{name}.weight", gguf.quants.quantize(np.ascontiguousarray(x), gguf.GGMLQuantizationType.BF16),
                     raw_dtype=gguf.GGMLQuantizationType.BF16)

    def f32(name, x):
        w.add_tensor(f"blk.{bid}.{name}", np.ascontiguousarray(x, dtype=np.float32))

    def gate_or_up(name, x):
        if not mxfp4:
            return bf16(name, x)
        w.add_tensor(f"blk.{bid}.{name}.weight", gguf.quants.quantize(np.ascontiguousarray(x), gguf.GGMLQuantizationType.MXFP4),
                     raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    if hf_name.endswith(".mlp.router.weight"):
        f32("ffn_gate_inp.weight", data)
    elif hf_name.endswith(".mlp.router.bias"):
        f32("ffn_gate_inp.bias", data)
    elif hf_name.endswith(".mlp.experts.gate_up_proj"):
        data = data.transpose(0, 2, 1)  # (n_experts, 2 ffn, dim)
        gate_or_up("ffn_gate_exps", data[:, ::2, :])
        gate_or_up("ffn_up_exps", data[:, 1::2, :])
    elif hf_name.endswith(".mlp.experts.gate_up_proj_bias"):
        f32("ffn_gate_exps.bias", data[:, ::2])
        f32("ffn_up_exps.bias", data[:, 1::2])
    elif hf_name.endswith(".mlp.experts.down_proj"):
        bf16("ffn_down_exps", data.transpose(0, 2, 1))
    elif hf_name.endswith(".mlp.experts.down_proj_bias"):
        f32("ffn_down_exps.bias", data)
    else:
        raise KeyError(f"{hf_name}: a gpt-oss MoE tensor the fixture does not lay out")


def mxfp4_reference(spec, model):
    """The model with its experts' gate and up weights as MXFP4 stores them (quantized and dequantized
    by the gguf package): the exact reference of the MXFP4 file (down_proj stays bf16: its rows of 80
    are not whole 32-element blocks)."""
    other = same_weights(spec, model, None)
    with torch.no_grad():
        for layer in other.model.layers:
            p = layer.mlp.experts.gate_up_proj  # (n_experts, dim, 2 ffn)
            rows = p.detach().transpose(1, 2).contiguous().numpy()  # (n_experts, 2 ffn, dim): GGUF rows
            q = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.MXFP4)
            back = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(rows.shape)
            p.copy_(torch.from_numpy(back).transpose(1, 2))
    return other


def router_min_gap(model, sequences):
    """The smallest gap between the k-th and (k+1)-th router logit over every token of `sequences`
    and every layer: how close a routing is to a tie."""
    gaps, hooks = [], []
    k = model.config.num_experts_per_tok

    def hook(_module, _inputs, output):
        top = torch.topk(output[0].to(torch.float64), k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))
    for layer in model.model.layers:
        router = layer.mlp.router if hasattr(layer.mlp, "router") else layer.mlp.gate  # gpt-oss's, the others'
        hooks.append(router.register_forward_hook(hook))
    try:
        logits_of(model, sequences)
    finally:
        for h in hooks:
            h.remove()
    return min(gaps)


def llama_cpp_converter():
    """llama.cpp's convert_hf_to_gguf.py from the pinned sdist (fetched with pip once)."""
    if (CONVERTER / "convert_hf_to_gguf.py").exists():
        return CONVERTER
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp], check=True)
        top = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
        with tarfile.open(next(Path(tmp).glob("*.tar.gz"))) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(top) and m.name[len(top):].startswith(wanted)]
            tar.extractall(CONVERTER.parents[2], members=members, filter="data")
    return CONVERTER


# The converter names the pre-tokenizer by hashing how the vocabulary splits a test text, and knows
# only published vocabularies': told this fixture's instead. Its SentencePiece attempt (Qwen2 tries it
# first) imports sentencepiece before finding there is no tokenizer.model: it goes straight to the
# FileNotFoundError that sends it to the byte-level BPE vocabulary.
CONVERT = """
import runpy, sys
src, hf_dir, out, pre = sys.argv[1:]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base


def no_sentencepiece(self):
    raise FileNotFoundError("tokenizer.model")


conversion.base.TextModel._create_vocab_sentencepiece = no_sentencepiece
# Gemma's vocabulary is SentencePiece only (no fallback): this fixture's byte-level one instead.
conversion.base.TextModel._set_vocab_sentencepiece = lambda self, add_to_gguf=True: self._set_vocab_gpt2()
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "bf16"]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert_with_llama_cpp(hf_dir, out, pre):
    r = subprocess.run([sys.executable, "-c", CONVERT, str(llama_cpp_converter()), str(hf_dir), str(out), pre],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {hf_dir}:\n{r.stderr[-4000:]}")


def compare_ggufs(ours, theirs, arch):
    """How the converter's file differs from ours: tensors (name, type, shape, bytes) and <arch>.* keys."""
    a, b = gguf.GGUFReader(str(ours)), gguf.GGUFReader(str(theirs))
    ta = {t.name: t for t in a.tensors}
    tb = {t.name: t for t in b.tensors}
    tensors = sorted(set(ta) ^ set(tb))
    for n in set(ta) & set(tb):
        x, y = ta[n], tb[n]
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape) or x.data.tobytes() != y.data.tobytes():
            tensors.append(n)

    def keys(r):
        return {k: f.contents() for k, f in r.fields.items() if k.startswith(arch + ".")}
    ka, kb = keys(a), keys(b)
    def same(x, y):
        return x == y if isinstance(x, str) or isinstance(y, str) else np.allclose(x, y, rtol=1e-7, atol=0)
    differ = sorted(k for k in set(ka) | set(kb) if k not in ka or k not in kb or not same(ka[k], kb[k]))
    return dict(tensors_that_differ=sorted(tensors), arch_keys_that_differ={k: [ka.get(k), kb.get(k)] for k in differ})


def greedy(model, prompt):
    """GREEDY_STEPS greedy ids after `prompt`, and each step's top-1 minus top-2 logit / max|logit|."""
    ids, margins, cache, step = [], [], None, list(prompt)
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            out = model(torch.tensor([step]), cache=cache, use_cache=True)
            row, cache = out.logits[0, -1].to(torch.float64), out.cache
            top = torch.topk(row, 2).values
            margins.append(float((top[0] - top[1]) / row.abs().max()))
            ids.append(int(row.argmax()))
            step = ids[-1:]
    return ids, margins


def clear_greedy_prompt(model, rng):
    """Of GREEDY_CANDIDATES random 12-token prompts, the one whose greedy continuation has the widest
    smallest margin: on a random model many steps are near ties, which an implementation's rounding
    (the CUDA backend's f16 GEMM inputs: ~1e-2 of max|logit|) may break either way."""
    best = None
    for _ in range(GREEDY_CANDIDATES):
        prompt = rng.integers(0, VOCAB - 2, 12).tolist()
        ids, margins = greedy(model, prompt)
        if best is None or min(margins) > min(best[2]):
            best = (prompt, ids, margins)
    return best


def ablated(name, spec, model):
    """The same weights without the family's feature: how far its logits are is what the tests catch."""
    if name == "qwen2":
        other = same_weights(spec, model, None)
        with torch.no_grad():
            for n, p in other.named_parameters():
                if n.endswith(".bias"):
                    p.zero_()
        return other
    if name == "qwen3":
        other = same_weights(spec, model, None)
        for layer in other.model.layers:
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()
        return other
    if name == "phi3":
        return same_weights(spec, model, dict(sliding_window=None))
    if name == "llama":
        return same_weights(spec, model, dict(rope_parameters=dict(rope_type="default", rope_theta=5e5)))
    if name == "qwen3moe":
        return same_weights(spec, model, dict(norm_topk_prob=False))
    if name == "mixtral":
        return same_weights(spec, model, dict(num_experts_per_tok=1))
    if name == "mistral":
        return same_weights(spec, model, dict(sliding_window=None))
    if name == "gemma2":
        return same_weights(spec, model, dict(attn_logit_softcapping=None, final_logit_softcapping=None))
    if name == "gpt-oss":
        other = same_weights(spec, model, None)
        with torch.no_grad():
            for layer in other.model.layers:
                layer.self_attn.sinks.fill_(-1e4)  # weighs nothing in any softmax
        return other
    rope = dict(spec["hf"]["rope_parameters"], long_factor=SHORT_FACTORS)
    return same_weights(spec, model, dict(rope_parameters=rope))


def make(name, spec, seed, prompts, out):
    model = build_model(spec, seed)
    if name in MOE:  # a seed whose prompts' routings are clear of ties
        for attempt in range(1, 100):
            if router_min_gap(model, prompts) >= spec["min_router_gap"]:
                break
            seed += 1000
            model = build_model(spec, seed)
        else:
            raise RuntimeError(f"{name}: no seed with router gaps >= {spec['min_router_gap']}")
    hf_dir = out / f"{name}-hf"
    save_hf(model, spec, hf_dir)
    write_gguf(out / f"{name}.gguf", model, spec)
    convert_with_llama_cpp(hf_dir, out / f"{name}.llamacpp.gguf", spec["pre"])
    converter = compare_ggufs(out / f"{name}.gguf", out / f"{name}.llamacpp.gguf", spec["arch"])

    # fathom fixes the RoPE at load (llama.cpp's rule: longrope's long factors when the context
    # exceeds the original); transformers switches per sequence length. The reference is the model with
    # the long factors at every length; it is the checkpoint itself for the long prompt.
    reference, short_inv_freq = model, None
    rope = spec["hf"]["rope_parameters"]
    if rope.get("rope_type") == "longrope":
        reference = same_weights(spec, model, dict(rope_parameters=dict(rope, short_factor=rope["long_factor"])))
        short_inv_freq = [float(x) for x in model.model.rotary_emb.inv_freq.to(torch.float64)]
        as_checkpoint = rel_error(logits_of(model, prompts[1:]), logits_of(reference, prompts[1:]))
        assert as_checkpoint == 0.0, f"{name}: the long prompt's logits differ from the checkpoint's ({as_checkpoint})"
    logits, noise = f32_vs_f64(reference, prompts)
    logits.tofile(out / f"{name}.logits.f32")
    ablation = rel_error(logits_of(ablated(name, spec, reference), prompts), logits)
    greedy_prompt, ids, margins = clear_greedy_prompt(reference, np.random.default_rng(seed))
    rot = reference.model.rotary_emb
    meta = dict(
        arch=spec["arch"], gguf=f"{name}.gguf", llamacpp_gguf=f"{name}.llamacpp.gguf", hf_dir=f"{name}-hf",
        logits=f"{name}.logits.f32", vocab=VOCAB, prompts=prompts,
        converter_drops_window=spec.get("converter_drops_window", False),
        hf_inv_freq=[float(x) for x in rot.inv_freq.to(torch.float64)],
        hf_attention_scaling=float(rot.attention_scaling), hf_short_inv_freq=short_inv_freq,
        f32_vs_f64_rel=noise, ablation=dict(what=spec["ablation"], rel=ablation),
        greedy=dict(prompt=greedy_prompt, ids=ids, margins=margins),
        llamacpp=dict(llama_cpp_python=LLAMA_CPP_PYTHON, **converter),
        made_with=made_with())
    if name == "gpt-oss":  # the released layout: MXFP4 experts
        write_gguf(out / f"{name}.mxfp4.gguf", reference, spec, mxfp4_experts=True)
        mx = logits_of(mxfp4_reference(spec, reference), prompts).astype("<f4")
        mx.tofile(out / f"{name}.mxfp4.logits.f32")
        meta.update(mxfp4=dict(gguf=f"{name}.mxfp4.gguf", logits=f"{name}.mxfp4.logits.f32",
                               vs_bf16_rel=rel_error(mx, logits)))
    if name in MOE:
        meta.update(seed=seed, router_min_gap=dict(prompts=router_min_gap(reference, prompts),
                                                   greedy=router_min_gap(reference, [greedy_prompt + ids])))
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: f32 vs f64 {noise:.2e}, {spec['ablation']} {ablation:.2e}, greedy min margin "
          f"{min(margins):.3f}, llama.cpp's GGUF differs in {converter}")


def make_all(out=OUT, only=None):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4848)
    prompts = [rng.integers(0, VOCAB - 2, n).tolist() for n in PROMPT_LENGTHS]
    for seed, (name, spec) in enumerate(FAMILIES.items()):  # a family's seed is its place in FAMILIES
        if not only or name in only:
            make(name, spec, spec.get("seed", 100 + seed), prompts, out)


if __name__ == "__main__":
    unknown = set(sys.argv[1:]) - set(FAMILIES)
    if unknown:
        sys.exit(f"unknown families {sorted(unknown)} (known: {', '.join(FAMILIES)})")
    make_all(only=sys.argv[1:])
