"""Dequantization of real GGUF tensors: fathom's ref and cpu (SIMD) dequantizers, through
tools/dump_tensor, against gguf-py's numpy dequantization (gguf.quants.dequantize), bit-exact.

- For both default models, for every tensor type present: 2-3 real tensors (the smallest, a
  middle one and the largest under a size cap).
- Types the models lack (Q4_0, Q5_1, Q5_K, F16, BF16, plus random-byte blocks of every
  quantized type, the only data of Q2_K, Q3_K, IQ4_NL and IQ4_XS; MXFP4 both ways): a small GGUF written with gguf.GGUFWriter into tmp_path, from random data
  quantized with gguf.quants.quantize where gguf-py can quantize the type, else from random
  block bytes with finite f16 scales.

The binary is $FATHOM_BUILD/dump_tensor (default build/), relative to the repo root.
"""
import functools
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf_file import GgufFile  # tests/reference, on the path by conftest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("FATHOM_BUILD", "build")
DUMP = BUILD / "dump_tensor"
MODELS = [
    ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf",
    ROOT / "models" / "gemma-3-270m-q4_k_m.gguf",
]
MAX_ELEMENTS = 40_000_000  # the cap for "the largest" tensor (gemma's 168M-element token_embd is skipped)


@functools.lru_cache(maxsize=None)
def _reader(path: Path):
    # The tensors' bytes by tests/reference/gguf_file.py (checked against gguf's GGUFReader by
    # test_gguf_file.py), whose metadata parse takes ~20 s for the two models at collection.
    return GgufFile(path)


def _require_binary():
    if not DUMP.exists():
        pytest.fail(f"{DUMP} not built (cmake --build <dir> --target dump_tensor)")


def _dump(model: Path, name: str, out: Path, cpu: bool) -> np.ndarray:
    cmd = [str(DUMP), str(model), name, str(out)] + (["--cpu"] if cpu else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(cmd)} failed: {res.stderr}"
    data = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return data


def _expected(tensor) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(-1)


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str):
    assert got.size == want.size, f"{what}: {got.size} elements, expected {want.size}"
    gb, wb = got.view(np.uint32), want.view(np.uint32)
    if not np.array_equal(gb, wb):
        bad = np.flatnonzero(gb != wb)
        i = bad[0]
        pytest.fail(f"{what}: {bad.size} of {got.size} elements differ; first at {i}: got {got[i]!r} "
                    f"(0x{gb[i]:08x}) want {want[i]!r} (0x{wb[i]:08x})")


def _pick(tensors):
    """Smallest, middle and largest (under MAX_ELEMENTS) tensors of one type, by element count."""
    ts = sorted((t for t in tensors if int(t.n_elements) <= MAX_ELEMENTS), key=lambda t: (int(t.n_elements), t.name))
    picks = {ts[0].name: ts[0], ts[len(ts) // 2].name: ts[len(ts) // 2], ts[-1].name: ts[-1]} if ts else {}
    return list(picks.values())


def _model_cases():
    cases = []
    for model in MODELS:
        if not model.exists():
            continue
        reader = _reader(model)
        by_type = {}
        for t in reader.tensors:
            by_type.setdefault(t.tensor_type, []).append(t)
        for ttype, ts in sorted(by_type.items(), key=lambda kv: kv[0].name):
            for t in _pick(ts):
                cases.append(pytest.param(model, t.name, id=f"{model.stem[:10]}-{ttype.name}-{t.name}"))
    return cases


@pytest.mark.parametrize("model,name", _model_cases())
def test_model_tensor_bit_exact(model, name, tmp_path):
    _require_binary()
    reader = _reader(model)
    tensor = next(t for t in reader.tensors if t.name == name)
    want = _expected(tensor)
    for cpu in (False, True):
        got = _dump(model, name, tmp_path / "out.f32", cpu)
        _assert_bits_equal(got, want, f"{name} ({tensor.tensor_type.name}, {'cpu' if cpu else 'ref'})")


def _finite_f16(rng, n):
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp_all_ones = (h >> 10) & 0x1F == 0x1F
    h[exp_all_ones] &= 0xBFFF  # clear the top exponent bit: finite
    return h


# Byte offsets of the f16 fields inside one block.
F16_FIELDS = {T.Q4_0: [0], T.Q5_0: [0], T.Q8_0: [0], T.Q4_1: [0, 2], T.Q5_1: [0, 2],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
              T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_NL: [0], T.IQ4_XS: [0]}


def _random_blocks(rng, qtype, rows, cols) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    nblocks = rows * cols // block
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint16).astype(np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = _finite_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // block * size)


def _synthetic_tensors(rng):
    """name -> (data as stored, raw dtype or None for F16/F32 arrays)."""
    rows, cols = 48, 512
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10, size=(rows, 1))).astype(np.float32)
    x[3, :64] = 0.0  # an all-zero block
    out = {}
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.MXFP4):
        out[f"quantized_{qtype.name}"] = (gguf.quants.quantize(x, qtype), qtype)
    out["quantized_F16"] = (x.astype(np.float16), None)
    out["quantized_F32"] = (x, None)
    for qtype in F16_FIELDS:
        out[f"random_{qtype.name}"] = (_random_blocks(rng, qtype, rows, cols), qtype)
    # MXFP4: random nibbles, E8M0 scales from subnormal (e < 2) to 2^20 (finite values).
    mx = rng.integers(0, 256, size=(rows * cols // 32, 17), dtype=np.uint16).astype(np.uint8)
    mx[:, 0] = rng.integers(0, 148, size=rows * cols // 32, dtype=np.uint16).astype(np.uint8)
    out["random_MXFP4"] = (mx.reshape(rows, cols // 32 * 17), T.MXFP4)
    bf = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint32).astype(np.uint16)
    bf[((bf >> 7) & 0xFF) == 0xFF] &= 0xBFFF  # finite bf16
    out["random_BF16"] = (bf.view(np.uint8).reshape(rows, cols * 2), T.BF16)
    out["random_F16"] = (_finite_f16(rng, rows * cols).view(np.float16).reshape(rows, cols), None)
    return out


def test_synthetic_types_bit_exact(tmp_path):
    _require_binary()
    rng = np.random.default_rng(1234)
    tensors = _synthetic_tensors(rng)
    path = tmp_path / "synthetic.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (data, raw_dtype) in tensors.items():
        if raw_dtype is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = gguf.GGUFReader(str(path))
    seen = set()
    for tensor in reader.tensors:
        want = _expected(tensor)
        assert np.all(np.isfinite(want)), tensor.name
        seen.add(tensor.tensor_type)
        for cpu in (False, True):
            got = _dump(path, tensor.name, tmp_path / "out.f32", cpu)
            _assert_bits_equal(got, want, f"{tensor.name} ({tensor.tensor_type.name}, {'cpu' if cpu else 'ref'})")
    assert {T.Q4_0, T.Q5_1, T.Q5_K, T.F16, T.BF16, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4} <= seen


def test_missing_tensor_is_an_error(tmp_path):
    _require_binary()
    model = MODELS[0]
    assert model.exists(), f"{model} missing: run make setup"
    res = subprocess.run([str(DUMP), str(model), "no.such.tensor", str(tmp_path / "o.f32")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "no.such.tensor" in res.stderr
