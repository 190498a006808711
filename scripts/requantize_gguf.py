#!/usr/bin/env python3
"""A GGUF's model in another weight type: every quantized matrix dequantized (gguf's reference
dequantizers) and written as F16, Q8_0 or F32; metadata (tokenizer, chat template, hyper-parameters)
copied as it is. For the draft-model benchmark (docs/speculative.md): the same model at two
precisions, the harder-quantized one drafting for the other.

    requantize_gguf.py SRC.gguf DST.gguf [--type f16|q8_0|f32]
"""
import argparse

import gguf
import numpy as np

from gguf_util import field_value, finish_gguf

Q = gguf.GGMLQuantizationType
TYPES = {"f16": Q.F16, "q8_0": Q.Q8_0, "f32": Q.F32}
FILE_TYPES = {Q.F16: gguf.LlamaFileType.MOSTLY_F16, Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
              Q.F32: gguf.LlamaFileType.ALL_F32}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", choices=TYPES, default="f16")
    a = ap.parse_args()
    want = TYPES[a.type]
    r = gguf.GGUFReader(a.src)
    arch = field_value(r.fields["general.architecture"])[0]
    w = gguf.GGUFWriter(a.dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        value, vtype, sub = field_value(field)
        w.add_key_value(name, value, vtype, sub_type=sub)
    w.add_file_type(FILE_TYPES[want])
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # rows first, as numpy holds them
        if t.tensor_type in (Q.F32, Q.F16) and len(shape) == 1:
            w.add_tensor(t.name, np.asarray(t.data))  # norms and biases stay as they are
            continue
        data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) == 1 or want == Q.F32:
            w.add_tensor(t.name, data)
        elif want == Q.F16:
            w.add_tensor(t.name, data.astype(np.float16))
        else:
            w.add_tensor(t.name, gguf.quants.quantize(data, want), raw_shape=gguf.quant_shape_to_byte_shape(data.shape, want),
                         raw_dtype=want)
    finish_gguf(w)


if __name__ == "__main__":
    main()
