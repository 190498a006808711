"""gpt-oss's MXFP4 fixture as a Hugging Face directory: the released checkpoints' expert layout.

tests/fixtures/arch/gpt-oss.mxfp4.gguf (scripts/arch_fixtures.py) holds the experts' gate and up
matrices as GGML MXFP4 blocks (its down matrices stay bf16: their rows of 80 are not whole blocks of
32). This script lays those blocks out as the released gpt-oss checkpoints store them, undoing what
llama.cpp's converter (convert_hf_to_gguf.py, GptOssModel.repack_mxfp4 / transform_nibble_layout)
does to them:

  GGML  ffn_gate_exps / ffn_up_exps [E, inter, hidden/32 blocks of 17 bytes]: the e8m0 scale byte,
        then 16 bytes, element j in byte j's low nibble and element j + 16 in its high one
  HF    mlp.experts.gate_up_proj_blocks [E, 2 inter, hidden/32, 16] u8: element 2j in byte j's low
        nibble, 2j + 1 in its high one; mlp.experts.gate_up_proj_scales [E, 2 inter, hidden/32] u8;
        rows interleaved: 2i is gate row i, 2i + 1 up row i (transformers' gate = [..., ::2])

Every other tensor is the bf16 directory's (tests/fixtures/arch/gpt-oss-hf/), as are its tokenizer
files; config.json gains the released checkpoints' quantization_config. The GGUF's own bf16 and f32
tensors are checked to be the directory's (transposed and split as the converter lays them out), so
the directory is the GGUF's model exactly and its logits must be the GGUF's:
tests/fixtures/arch/gpt-oss.mxfp4.logits.f32 (transformers with those blocks dequantized).

numpy, gguf and safetensors' file format only (no torch); deterministic: the same bytes every run.
Output: tests/fixtures/arch/gpt-oss-mxfp4-hf/. Usage: python scripts/gpt_oss_mxfp4_fixture.py
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ARCH = ROOT / "tests" / "fixtures" / "arch"
SRC, GGUF_FILE, OUT = ARCH / "gpt-oss-hf", ARCH / "gpt-oss.mxfp4.gguf", ARCH / "gpt-oss-mxfp4-hf"
QUANTIZATION = {"quant_method": "mxfp4",  # as the released config.json says it (the converted modules)
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}
BLOCK_BYTES = 17  # GGML's block_mxfp4


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), in the file's order."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {name: (h["dtype"], h["shape"], data[base + h["data_offsets"][0]:base + h["data_offsets"][1]])
            for name, h in header.items()}


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, raw bytes); written in name order, the header padded to 8 bytes."""
    header, offset = {}, 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def bf16_to_f32(raw, shape):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)


def hf_blocks(ggml):
    """GGML MXFP4 rows [..., nb * 17] -> (blocks [..., nb, 16], scales [..., nb]) in transformers' order."""
    b = ggml.reshape(*ggml.shape[:-1], -1, BLOCK_BYTES)
    scales, qs = b[..., 0], b[..., 1:]
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # GGML: element j low, j + 16 high
    blocks = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)  # HF: 2j low, 2j + 1 high
    return blocks, scales.astype(np.uint8)


def ggml_blocks(blocks, scales):
    """The inverse, as llama.cpp's converter repacks (checked against the GGUF's bytes)."""
    values = np.empty((*blocks.shape[:-1], 32), dtype=np.uint8)
    values[..., 0::2], values[..., 1::2] = blocks & 0x0F, blocks >> 4
    qs = values[..., :16] | (values[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).reshape(*scales.shape[:-1], -1)


def main():
    tensors = read_safetensors(SRC / "model.safetensors")
    config = json.loads((SRC / "config.json").read_text())
    reader = gguf.GGUFReader(GGUF_FILE)
    gg = {t.name: t for t in reader.tensors}
    n_layers, n_experts = config["num_hidden_layers"], config["num_local_experts"]
    inter, hidden = config["intermediate_size"], config["hidden_size"]
    for il in range(n_layers):
        p, blk = f"model.layers.{il}.mlp.experts.", f"blk.{il}."
        gate, up = (gg[blk + f"ffn_{x}_exps.weight"] for x in ("gate", "up"))
        assert gate.tensor_type == up.tensor_type == gguf.GGMLQuantizationType.MXFP4
        rows = [np.asarray(t.data).reshape(n_experts, inter, -1) for t in (gate, up)]
        blocks, scales = zip(*(hf_blocks(r) for r in rows))
        assert all(np.array_equal(ggml_blocks(b, s), r) for b, s, r in zip(blocks, scales, rows))
        gate_up_blocks = np.stack(blocks, axis=2).reshape(n_experts, 2 * inter, hidden // 32, 16)  # rows 2i, 2i + 1
        gate_up_scales = np.stack(scales, axis=2).reshape(n_experts, 2 * inter, hidden // 32)
        # The directory's other expert tensors are the GGUF's: down transposed, biases split.
        dtype, shape, raw = tensors.pop(p + "gate_up_proj")
        assert dtype == "BF16" and shape == [n_experts, hidden, 2 * inter]
        down, gg_down = bf16_to_f32(tensors[p + "down_proj"][2], tensors[p + "down_proj"][1]), gg[blk + "ffn_down_exps.weight"]
        assert gg_down.tensor_type == gguf.GGMLQuantizationType.BF16
        assert np.array_equal(down.transpose(0, 2, 1), bf16_to_f32(np.asarray(gg_down.data).tobytes(), (n_experts, hidden, inter)))
        bias = bf16_to_f32(tensors[p + "gate_up_proj_bias"][2], (n_experts, 2 * inter))
        assert np.array_equal(bias[:, 0::2], np.asarray(gg[blk + "ffn_gate_exps.bias"].data).reshape(n_experts, inter))
        assert np.array_equal(bias[:, 1::2], np.asarray(gg[blk + "ffn_up_exps.bias"].data).reshape(n_experts, inter))
        tensors[p + "gate_up_proj_blocks"] = ("U8", gate_up_blocks.shape, gate_up_blocks.tobytes())
        tensors[p + "gate_up_proj_scales"] = ("U8", gate_up_scales.shape, gate_up_scales.tobytes())

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    write_safetensors(OUT / "model.safetensors", tensors)
    config["quantization_config"] = QUANTIZATION
    (OUT / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(SRC / name, OUT / name)
    print(f"{OUT.relative_to(ROOT)}: {sum(f.stat().st_size for f in OUT.iterdir())} bytes")


if __name__ == "__main__":
    sys.exit(main())
