"""A tiny Gemma 3 as a Hugging Face directory and as the GGUF llama.cpp's converter makes of it.

transformers' Gemma 3 is not among the arch fixtures (scripts/arch_fixtures.py): this builds one
without torch, from numpy and the `gguf` package alone (`make fixtures` runs it in its arch step;
`/path/to/venv/bin/python scripts/gemma3_fixtures.py` with gguf and numpy is enough). It writes

  gemma3-hf/   config.json (and generation_config.json) in the layout of Gemma 3's released text checkpoints (transformers 4:
               rope_theta and rope_scaling of the global layers, rope_local_base_freq of the sliding
               ones, sliding_window_pattern, query_pre_attn_scalar, null soft-caps), a bf16
               model.safetensors whose RMSNorm weights are w (the model multiplies by 1 + w), the
               arch fixtures' byte-level tokenizer (gemma2-hf's)
  gemma3.gguf  the same weights as llama.cpp's Gemma3Model converter writes them (convert_hf_to_gguf.py:
               every *norm.weight + 1 in f32, the gguf package's gemma3 tensor names, the
               gemma3.* keys it writes for this config: rope.freq_base of the global layers, linear
               rope.scaling, attention.sliding_window, key_length)
  gemma3-mm-hf/
               the same text model as Gemma 3's vision checkpoints (4B, 12B, 27B) lay it out:
               config.json as google/gemma-3-4b-it's (Gemma3ForConditionalGeneration, model_type
               gemma3; a text_config naming only what differs from transformers' Gemma3TextConfig
               defaults, a small SigLIP vision_config, the image token keys), the text weights
               under language_model.model.* beside a few tiny vision tower and projector tensors
               (vision_tower.*, multi_modal_projector.*), the same tokenizer and generation config.
               fathom serves its text model: its logits are gemma3-hf's (Gemma3.ConditionalGeneration...)
  gemma3.logits.f32 and gemma3.json
               the logits of every position of the arch fixtures' two prompts (12 and 120 tokens, from
               gemma2.json) by tests/reference/numpy_model.py in float64 from the GGUF: an
               implementation sharing no code with fathom, of llama.cpp's gemma3 (5 sliding layers
               of base 10000 to 1 global of rope.freq_base, linearly scaled; QK norms; post norms;
               GeGLU; embedding × √dim)

6 layers (5 sliding, the 6th global: fewer would have no global layer), hidden 32, 2 query heads
and 1 KV head of head_dim 24 (q_dim 48 != hidden), ffn 48, a 24-token window (the long prompt
outgrows it), global RoPE theta 1e6 scaled linearly by 8. Weights are bf16 values, the norms' 1 + w
too (as arch_fixtures.py makes Gemma 2's), so both files hold the same model exactly. Deterministic:
running it again writes the same bytes. The test is tests/kernel/test_cuda_arch_fixtures.cpp
(Gemma3.DirectoryMatchesItsGgufAndTheReference).
"""
import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "arch"
sys.path.insert(0, str(ROOT / "tests" / "reference"))
import numpy_model  # noqa: E402
from gguf_util import finish_gguf, rel_error  # noqa: E402  (scripts/, the directory of this file)

NAME = "gemma3"
VOCAB = 128
END = VOCAB - 1  # "<|end|>", the tokenizer's end-of-text control token
SEED = 3003
INIT = 0.2  # the arch fixtures' initializer_range: attention scores O(1)
CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": None,
    "cache_implementation": "hybrid",
    "eos_token_id": END,
    "final_logit_softcapping": None,
    "head_dim": 24,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "initializer_range": INIT,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "model_type": "gemma3_text",
    "num_attention_heads": 2,
    "num_hidden_layers": 6,
    "num_key_value_heads": 1,
    "pad_token_id": None,
    "query_pre_attn_scalar": 24,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000.0,
    "sliding_window": 24,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": VOCAB,
}


# Gemma 3 4B's config.json as released (google/gemma-3-4b-it, transformers 4.50), with this text
# model's shape: text_config names only what differs from Gemma3TextConfig's defaults (rms_norm_eps
# 1e-6, rope_theta 1e6, rope_local_base_freq 10000, sliding_window_pattern 6, hidden_activation,
# no soft-caps, tied are left to them, as the 4B's leaves them). The vision model is tiny and not
# served; the image token ids are byte tokens of this vocabulary (it has no image tokens).
MM_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 124,
    "eoi_token_index": 125,
    "eos_token_id": [END],
    "image_token_index": 126,
    "initializer_range": INIT,
    "mm_tokens_per_image": 4,
    "model_type": "gemma3",
    "text_config": {k: CONFIG[k] for k in (
        "head_dim", "hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
        "num_hidden_layers", "num_key_value_heads", "query_pre_attn_scalar", "rope_scaling", "sliding_window",
        "vocab_size")} | {"model_type": "gemma3_text"},
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 8,
        "image_size": 28,
        "intermediate_size": 16,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def bf16_round(x):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def bf16_bytes(x):
    assert np.array_equal(bf16_round(x), x), "not a bfloat16 value"
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def weights(rng):
    """transformers' Gemma 3 state dict (tied: no lm_head), float32 arrays of bfloat16 values; norms
    stored as w, with 1 + w a bfloat16 value in [0.8, 1.2] (away from 1, so reading them wrongly shows)."""
    c = CONFIG
    dim, hd, ffn = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def matrix(rows, cols):
        return bf16_round(rng.normal(0.0, INIT, (rows, cols)).astype(np.float32))

    def norm(n):
        one_plus_w = bf16_round(rng.uniform(0.8, 1.2, n).astype(np.float32))
        w = one_plus_w - np.float32(1)  # exact: both within a factor of 2 of 1
        assert np.array_equal(bf16_round(w), w) and np.array_equal(w + np.float32(1), one_plus_w)
        return w

    sd = {"model.embed_tokens.weight": matrix(VOCAB, dim)}
    for il in range(c["num_hidden_layers"]):
        p = f"model.layers.{il}."
        sd[p + "input_layernorm.weight"] = norm(dim)
        sd[p + "self_attn.q_proj.weight"] = matrix(q, dim)
        sd[p + "self_attn.k_proj.weight"] = matrix(kv, dim)
        sd[p + "self_attn.v_proj.weight"] = matrix(kv, dim)
        sd[p + "self_attn.o_proj.weight"] = matrix(dim, q)
        sd[p + "self_attn.q_norm.weight"] = norm(hd)
        sd[p + "self_attn.k_norm.weight"] = norm(hd)
        sd[p + "post_attention_layernorm.weight"] = norm(dim)
        sd[p + "pre_feedforward_layernorm.weight"] = norm(dim)
        sd[p + "mlp.gate_proj.weight"] = matrix(ffn, dim)
        sd[p + "mlp.up_proj.weight"] = matrix(ffn, dim)
        sd[p + "mlp.down_proj.weight"] = matrix(dim, ffn)
        sd[p + "post_feedforward_layernorm.weight"] = norm(dim)
    sd["model.norm.weight"] = norm(dim)
    return sd


def multimodal_weights(sd, rng):
    """The text model's tensors under language_model.model.* (the released vision checkpoints'
    names) and a few of a tiny SigLIP tower and of the projector into the text model's width."""
    v = MM_CONFIG["vision_config"]
    vdim, patch = v["hidden_size"], v["patch_size"]
    patches = (v["image_size"] // patch) ** 2
    out = {"language_model." + name: w for name, w in sd.items()}
    tower = "vision_tower.vision_model."
    for name, shape in ((tower + "embeddings.patch_embedding.weight", (vdim, 3, patch, patch)),
                        (tower + "embeddings.patch_embedding.bias", (vdim,)),
                        (tower + "embeddings.position_embedding.weight", (patches, vdim)),
                        (tower + "encoder.layers.0.self_attn.q_proj.weight", (vdim, vdim)),
                        (tower + "post_layernorm.weight", (vdim,)),
                        ("multi_modal_projector.mm_input_projection_weight", (vdim, CONFIG["hidden_size"])),
                        ("multi_modal_projector.mm_soft_emb_norm.weight", (vdim,))):
        out[name] = bf16_round(rng.normal(0.0, INIT, shape).astype(np.float32))
    return out


def write_safetensors(path, sd):
    """bf16 safetensors as transformers' save_pretrained writes it (names sorted, header padded to 8)."""
    header, data = {"__metadata__": {"format": "pt"}}, bytearray()
    for name in sorted(sd):
        raw = bf16_bytes(sd[name])
        header[name] = {"dtype": "BF16", "shape": list(sd[name].shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data))


def byte_vocab():
    """The arch fixtures' vocabulary: bytes 0..125, "ab" (one merge), the end-of-text control token."""
    chars = numpy_model._bytes_to_unicode()
    return [chars[b] for b in range(VOCAB - 2)] + ["ab", "<|end|>"]


def write_gguf(path, sd):
    """What llama.cpp's converter (Gemma3Model, --outtype bf16) writes for this directory."""
    c = CONFIG
    w = gguf.GGUFWriter(str(path), NAME)
    w.add_name("arch fixture gemma3")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])  # the global layers'
    assert c["rope_scaling"]["rope_type"] == "linear"  # applied to the global layers only
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
    w.add_sliding_window(c["sliding_window"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    tokens = byte_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i == END else gguf.TokenType.NORMAL for i in range(VOCAB)])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(END)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, c["num_hidden_layers"])
    for hf_name, data in sd.items():
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        if name is None:
            raise KeyError(f"{hf_name}: not in gguf's gemma3 tensor table")
        if hf_name.endswith("norm.weight"):  # Gemma3RMSNorm multiplies by 1 + w: the converter adds 1
            w.add_tensor(name, data + np.float32(1))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
    finish_gguf(w)


def logits(model, prompts):
    return np.concatenate([model.forward(p) for p in prompts]).astype(np.float64)


def main(out=OUT):
    prompts = json.loads((out / "gemma2.json").read_text())["prompts"]  # the arch fixtures' two prompts
    sd = weights(np.random.default_rng(SEED))
    hf = out / f"{NAME}-hf"
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    # generation_config.json as transformers derives it from config.json (without its version).
    (hf / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "eos_token_id": END, "use_cache": True}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / "gemma2-hf" / f, hf / f)
    write_safetensors(hf / "model.safetensors", sd)
    write_gguf(out / f"{NAME}.gguf", sd)

    mm = out / f"{NAME}-mm-hf"
    shutil.rmtree(mm, ignore_errors=True)
    mm.mkdir()
    (mm / "config.json").write_text(json.dumps(MM_CONFIG, indent=2, sort_keys=True) + "\n")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / f, mm / f)
    write_safetensors(mm / "model.safetensors", multimodal_weights(sd, np.random.default_rng(SEED + 1)))

    reader = gguf.GGUFReader(str(out / f"{NAME}.gguf"))
    ref = numpy_model.ReferenceModel(out / f"{NAME}.gguf", np.float64, reader=reader)
    want = logits(ref, prompts)
    want.astype("<f4").tofile(out / f"{NAME}.logits.f32")
    noise = rel_error(logits(numpy_model.ReferenceModel(out / f"{NAME}.gguf", np.float32, reader=reader), prompts), want)
    # What the tests must catch: the norms read as stored (w) instead of 1 + w.
    for name in ref.w:
        if name.endswith("norm.weight"):
            ref.w[name] = ref.w[name] - 1
    ablation = rel_error(logits(ref, prompts), want)
    meta = dict(
        arch=NAME, gguf=f"{NAME}.gguf", hf_dir=f"{NAME}-hf", logits=f"{NAME}.logits.f32", vocab=VOCAB,
        prompts=prompts, reference="tests/reference/numpy_model.py, float64, from the GGUF",
        f32_vs_f64_rel=noise, ablation=dict(what="the norms read as stored (w, not 1 + w)", rel=ablation),
        made_with=dict(gguf=importlib.metadata.version("gguf"), numpy=np.__version__,
                       reference=numpy_model.VERSION))
    (out / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{NAME}: reference f32 vs f64 {noise:.2e}, {meta['ablation']['what']} {ablation:.2e}")


if __name__ == "__main__":
    main()
