"""transformers' embeddings of the architecture fixtures: the reference of fathom's /v1/embeddings.

Part of `make fixtures` (scripts/make_fixtures.py; .venv-fixtures). For the qwen2 and qwen3 fixtures
(tests/fixtures/arch/<name>-hf, written by scripts/arch_fixtures.py) it loads the Hugging Face
directory with `transformers` in f32, takes the final hidden states (`last_hidden_state`: after the
final norm, as sentence-transformers and llama.cpp pool them) of three prompts, pools them three ways
(mean over the positions, the first position — CLS —, the last position), L2-normalises each, and
stores them with how far the f32 result is from the same model's f64 one.

Output: tests/fixtures/arch/<name>.embeddings.json. The test is tests/e2e/test_embeddings.py.
"""
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel

from fixture_lib import made_with

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "arch"
FAMILIES = ("qwen2", "qwen3")
POOLINGS = ("mean", "cls", "last")


def pooled(hidden, how):
    """hidden: [positions][dim] -> the unit-norm pooled vector."""
    v = hidden.mean(axis=0) if how == "mean" else hidden[0] if how == "cls" else hidden[-1]
    return v / max(np.linalg.norm(v), 1e-12)


def embeddings(model, prompts):
    with torch.no_grad():
        hidden = [model(torch.tensor([p])).last_hidden_state[0].to(torch.float64).numpy() for p in prompts]
    return {how: np.array([pooled(h, how) for h in hidden]) for how in POOLINGS}


def make(name, out=OUT):
    meta = json.loads((out / f"{name}.json").read_text())
    prompts = [meta["prompts"][0][:3]] + meta["prompts"]  # 3, 12 and 120 tokens
    model = AutoModel.from_pretrained(out / meta["hf_dir"], dtype=torch.float32).eval()
    f32 = embeddings(model, prompts)
    f64 = embeddings(model.to(torch.float64), prompts)
    noise = max(float(np.abs(f32[h] - f64[h]).max()) for h in POOLINGS)
    result = dict(gguf=meta["gguf"], hf_dir=meta["hf_dir"], prompts=prompts,
                  embeddings={h: f32[h].astype(np.float32).tolist() for h in POOLINGS},
                  f32_vs_f64_max_abs=noise, made_with=made_with())
    (out / f"{name}.embeddings.json").write_text(json.dumps(result) + "\n")
    print(f"{name}: embeddings of {len(prompts)} prompts, f32 vs f64 max |diff| {noise:.2e}")


def make_all(out=OUT):
    for name in FAMILIES:
        make(name, out)


if __name__ == "__main__":
    make_all()
