"""tests/reference/gguf_file.py, the references' fast GGUF reader, gives what PyPI gguf's GGUFReader
gives: every key's value and length, every tensor's name, dims, type and dequantized values, over
the architecture fixtures (their vocabularies, merges, F32, BF16, Q8_0 and MXFP4 tensors). A long
vocabulary is the same code path (GGUFReader alone takes ~5 s on SmolLM2's 49k tokens): it was
compared once, with both default models, when gguf_file.py was written."""
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize
from gguf_file import GgufFile, read_gguf_metadata

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "tests" / "fixtures" / "arch").glob("*.gguf"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_gguf_file_reads_what_ggufreader_reads(path):
    fast, ref = GgufFile(path), GGUFReader(str(path))
    keys = {k for k in ref.fields if not k.startswith("GGUF.")}  # GGUFReader's own header entries
    assert set(fast.fields) == keys
    assert set(read_gguf_metadata(path)) == keys
    for k in keys:
        got, want = fast.fields[k].contents(), ref.fields[k].contents()
        assert len(fast.fields[k].data) == len(ref.fields[k].data), k
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            np.testing.assert_array_equal(np.float32(got), np.float32(want), err_msg=k)
        else:
            assert got == want, k
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors]
    for got, want in zip(fast.tensors, ref.tensors):
        assert got.shape == [int(d) for d in want.shape] and got.tensor_type == want.tensor_type, got.name
        np.testing.assert_array_equal(dequantize(got.data, got.tensor_type).ravel(),
                                      dequantize(want.data, want.tensor_type).ravel(), err_msg=got.name)
