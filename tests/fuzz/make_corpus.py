#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_gguf: small valid GGUF files made with the `gguf`
package's GGUFWriter (v3, and the same bytes relabelled v2), covering every metadata value
type, nested arrays, a non-default alignment and tensors of several ggml types.

usage: make_corpus.py OUT_DIR [MODEL.gguf ...]   (models contribute their first 64 KiB)
"""
import pathlib
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def add_every_value_type(w: gguf.GGUFWriter) -> None:
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", 2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.strs", ["a", "bc", "<|im_start|>"])
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.0])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_key_value("t.u8s", [1, 2, 3], V.ARRAY, sub_type=V.UINT8)


def write(path: pathlib.Path, arch: str, tensors: dict, alignment: int | None = None,
          every_type: bool = False, version: int = 3) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "</s>", "a", "b"])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0])
    if every_type:
        add_every_value_type(w)
    for name, (array, raw_type) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:  # v2 has the same little-endian layout; only the version field differs
        data = bytearray(path.read_bytes())
        data[4:8] = version.to_bytes(4, "little")
        path.write_bytes(bytes(data))


def quantized_bytes(n_rows: int, row_bytes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n_rows, row_bytes), dtype=np.uint8)


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    f32 = np.arange(12, dtype=np.float32).reshape(3, 4)
    f16 = np.arange(8, dtype=np.float16)
    tensors = {
        "w.f32": (f32, None),
        "w.f16": (f16, None),
        "w.q4_0": (quantized_bytes(2, 18, 1), Q.Q4_0),   # 2 rows of 32 elements
        "w.q8_0": (quantized_bytes(1, 34, 2), Q.Q8_0),
        "w.q4_k": (quantized_bytes(1, 144, 3), Q.Q4_K),  # 1 row of 256 elements
    }
    write(out / "full_v3.gguf", "llama", tensors, every_type=True)
    write(out / "full_v2.gguf", "llama", tensors, every_type=True, version=2)
    write(out / "align64.gguf", "gemma3", {"a": (f32, None), "b": (f16, None)}, alignment=64)
    write(out / "metadata_only.gguf", "llama", {}, every_type=True)
    write(out / "one_tensor.gguf", "llama", {"x": (np.ones(4, dtype=np.float32), None)})
    for model in sys.argv[2:]:
        p = pathlib.Path(model)
        if p.exists():
            with p.open("rb") as f:
                (out / ("head_" + p.stem + ".gguf")).write_bytes(f.read(65536))


if __name__ == "__main__":
    main()
