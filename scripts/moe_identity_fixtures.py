"""A dense model and the same model as a one-expert mixture of experts: their logits must agree.

From tests/fixtures/arch/qwen3.gguf (scripts/arch_fixtures.py) this writes
  qwen3-q8.gguf         the dense qwen3 with its 64-column matrices (Q/K/V, gate, up, output)
                        quantized to Q8_0 (the others, 80- or 96-column, stay bf16)
  qwen3-q8-as-moe.gguf  the same tensors as a qwen3moe of 1 expert used by every token: the MLP's
                        gate/up/down as ffn_{gate,up,down}_exps of one expert, a router of one row
With one expert the router's weight is 1 for every token, so the MoE layer is the dense MLP: on the
CPU the logits are bitwise the dense model's at either precision (the packed Q8_0 expert kernels
included), on CUDA the grouped GEMV gives what quant_gemv does. The test is
tests/kernel/test_cuda_arch_fixtures.cpp (OneExpertIsTheDenseModel).

  .venv-fixtures/bin/python scripts/moe_identity_fixtures.py   (part of `make fixtures`' arch step)
"""
from pathlib import Path

import gguf
import numpy as np
from gguf.scripts.gguf_new_metadata import MetadataDetails

ARCH = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "arch"


def copy_keys(reader, writer, arch, extra):
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        name = arch + field.name[len("qwen3"):] if field.name.startswith("qwen3.") else field.name
        writer.add_key_value(name, MetadataDetails(val_type, field.contents(), sub_type=sub_type).value, val_type,
                             sub_type=sub_type)
    for key, (value, val_type) in extra.items():
        writer.add_key_value(key, value, val_type)


def weights(reader):
    """name -> (f32 array in numpy's row-major shape, stored type)"""
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        out[t.name] = (gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32), t.tensor_type)
    return out


def add(writer, name, x, stored):
    if x.ndim == 1:
        writer.add_tensor(name, x)
        return
    q = gguf.GGMLQuantizationType.Q8_0 if x.shape[-1] % 64 == 0 else stored
    writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(x), q), raw_dtype=q)


def main():
    reader = gguf.GGUFReader(str(ARCH / "qwen3.gguf"))
    w = weights(reader)
    ffn = int(reader.fields["qwen3.feed_forward_length"].contents())
    layers = int(reader.fields["qwen3.block_count"].contents())

    dense = gguf.GGUFWriter(str(ARCH / "qwen3-q8.gguf"), "qwen3")
    copy_keys(reader, dense, "qwen3", {})
    for name, (x, stored) in w.items():
        add(dense, name, x, stored)
    dense.write_header_to_file(), dense.write_kv_data_to_file(), dense.write_tensors_to_file(), dense.close()

    moe = gguf.GGUFWriter(str(ARCH / "qwen3-q8-as-moe.gguf"), "qwen3moe")
    U32 = gguf.GGUFValueType.UINT32
    copy_keys(reader, moe, "qwen3moe", {"qwen3moe.expert_count": (1, U32), "qwen3moe.expert_used_count": (1, U32),
                                        "qwen3moe.expert_feed_forward_length": (ffn, U32)})
    experts = {"ffn_gate": "ffn_gate_exps", "ffn_up": "ffn_up_exps", "ffn_down": "ffn_down_exps"}
    for name, (x, stored) in w.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[2] in experts:
            add(moe, f"blk.{parts[1]}.{experts[parts[2]]}.weight", x[None], stored)
        else:
            add(moe, name, x, stored)
    dim = w["token_embd.weight"][0].shape[1]
    for il in range(layers):
        moe.add_tensor(f"blk.{il}.ffn_gate_inp.weight", np.full((1, dim), 0.5, np.float32))
    moe.write_header_to_file(), moe.write_kv_data_to_file(), moe.write_tensors_to_file(), moe.close()


if __name__ == "__main__":
    main()
