"""fathom's forward pass against an independent numpy reference (tests/reference/numpy_model.py).

For each default model and three prompts (token ids from the reference's own tokenizer):
  - `fathom logits` (f32 compute, f32 KV cache) for every prompt position must match the
    reference's logits row by row:  max|fathom - ref| <= REL_TOL * max|ref|  and  Pearson
    correlation >= MIN_CORR.  The reference in float32 against itself in float64 differs by at
    most ~4e-6 * max|ref| on these prompts (tests/reference/README.md); REL_TOL leaves ~250x room
    for another summation order and approximate exp/tanh, and still catches subtle bugs: a
    sliding window of 513 instead of 512 gives 1.9e-2 (correlation 0.99973) on Gemma's long
    prompt, rms eps x10 gives 1.1e-2 on SmolLM2.
  - `fathom generate --temperature 0` must reproduce the reference's 32 greedy tokens. The only
    excused difference is a near tie: at the first differing step the reference's logits for the
    two tokens are within 2 * REL_TOL * max|ref| (either may win under f32 noise); the test then
    checks the common prefix only and says so.
Gemma's third prompt is longer than its 512-token sliding window, so local layers must drop keys.

Reference results are cached in $FATHOM_CACHE/reference/ (conftest.py's cache_dir) keyed by model sha256, prompt ids, the number
of generated tokens and numpy_model.VERSION.
"""
import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import numpy_model as nm  # tests/reference, put on sys.path by conftest.py

N_GEN = 32
REL_TOL = 1e-3
MIN_CORR = 0.99999
TOPK = 8

PASSAGE = (
    "The Eiffel Tower stands on the Champ de Mars in Paris. It was built between 1887 and 1889 as "
    "the entrance arch of the World's Fair that marked the centennial of the French Revolution. "
    "The engineers Maurice Koechlin and Emile Nouguier drew the first design, and the company of "
    "Gustave Eiffel built it. Many artists of the time protested against the tower and called it "
    "useless and monstrous, yet it soon became the symbol of the city. The tower is about 330 "
    "metres tall and was the tallest structure in the world for forty-one years, until the "
    "Chrysler Building in New York was finished in 1930. It has three levels for visitors, with "
    "restaurants on the first and second levels. The top level is 276 metres above the ground. "
    "Visitors can climb the stairs to the second level or take one of the lifts. About seven "
    "million people visit the tower every year, which makes it one of the most visited paid "
    "monuments in the world. The tower is repainted every seven years, and the work needs about "
    "sixty tonnes of paint. At night it is lit by thousands of lamps, and for five minutes every "
    "hour the lights sparkle."
)
SHORT_PASSAGE = PASSAGE[:PASSAGE.index(" Many artists")]

# SmolLM2-Instruct: its ChatML format. Gemma 3 270M here is the pretrained (non-instruct) model
# (its GGUF has no chat template): completion-style prompts, plus one few-shot chat prompt.
PROMPTS = {
    "smollm2": [
        ("capital", nm.chat_prompt("llama", "What is the capital of France?")),
        ("poem", nm.chat_prompt("llama", "Write a short poem about the sea, in four lines.",
                                system="You are a helpful AI assistant named SmolLM, trained by "
                                       "Hugging Face")),
        ("passage", nm.chat_prompt("llama", "Read the text and answer the question.\n\n"
                                   + SHORT_PASSAGE + "\n\nQuestion: Who built the Eiffel Tower?")),
    ],
    "gemma3": [
        ("capital", "<bos>Question: What is the capital of France?\nAnswer:"),
        ("chat", "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                 "<start_of_turn>model\nThe capital of France is Paris.<end_of_turn>\n"
                 "<start_of_turn>user\nWhat is the capital of Italy?<end_of_turn>\n"
                 "<start_of_turn>model\n"),
        # > 512 tokens: the sliding-window layers see only the last 512 positions
        ("long", "<bos>" + "\n\n".join([PASSAGE, PASSAGE, SHORT_PASSAGE])
                 + "\n\nQuestion: Who built the Eiffel Tower?\nAnswer:"),
    ],
}
CASES = [(m, name) for m in PROMPTS for name, _ in PROMPTS[m]]

_models = {}
_sha = {}


def reference_model(name, path):
    """One ReferenceModel per model per process: loading dequantizes every weight."""
    if name not in _models:
        _models[name] = nm.ReferenceModel(path)
    return _models[name]


def file_sha256(path):
    if path not in _sha:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _sha[path] = h.hexdigest()
    return _sha[path]


def prompt_ids(m, model, prompt_name):
    return m.tokenizer.encode(dict(PROMPTS[model])[prompt_name])


def reference(m, model, ids, cache_dir: Path):
    """Cached reference results: final normed hidden states (logits = hidden @ E^T are recomputed,
    so the cache stays small) and the greedy continuation with its top-k logits per step."""
    key = json.dumps([nm.VERSION, list(map(int, ids)), N_GEN, TOPK])
    path = cache_dir / (f"{model}-{file_sha256(m.path)[:16]}-"
                        f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz")
    if path.exists():
        try:
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError):
            pass                                     # unreadable: recompute
    g = m.greedy(ids, N_GEN, stop_ids=(), topk=TOPK)
    res = dict(hidden=g["prompt_hidden"].astype(np.float32),
               greedy=np.array(g["tokens"], dtype=np.int64),
               top_ids=g["top_ids"], top_vals=g["top_vals"], scales=g["scales"])
    tmp = path.with_suffix(f".tmp{np.random.randint(1 << 30)}.npz")
    np.savez(tmp, **res)
    tmp.replace(path)
    return res


def run_fathom(fathom_bin, *args, timeout=900):
    r = subprocess.run([str(fathom_bin), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, (f"fathom {' '.join(map(str, args))[:200]} exited {r.returncode}\n"
                               f"stderr: {r.stderr[-3000:]}")
    return r.stdout


def row_stats(a, b):
    """Per row: max |a - b|, max |b|, Pearson correlation (float64)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = np.abs(a64 - b64).max(axis=1)
    scale = np.abs(b64).max(axis=1)
    ac = a64 - a64.mean(axis=1, keepdims=True)
    bc = b64 - b64.mean(axis=1, keepdims=True)
    corr = (ac * bc).sum(1) / np.sqrt((ac * ac).sum(1) * (bc * bc).sum(1))
    return d, scale, corr


@pytest.mark.parametrize("model,prompt", CASES)
def test_logits_match_reference(model, prompt, fathom_bin, model_paths, cache_dir, tmp_path):
    m = reference_model(model, model_paths[model])
    ids = prompt_ids(m, model, prompt)
    ref = reference(m, model, ids, cache_dir)
    vocab = m.cfg.vocab
    out = tmp_path / "logits.f32"
    run_fathom(fathom_bin, "logits", "--model", model_paths[model],
               "--prompt-ids", ",".join(map(str, ids)), "--out", out)
    size = out.stat().st_size
    assert size == len(ids) * vocab * 4, (
        f"logits file has {size} bytes, expected {len(ids)} tokens x {vocab} vocab x 4")
    got = np.memmap(out, dtype="<f4", mode="r", shape=(len(ids), vocab))
    d, scale, corr = [], [], []
    for i in range(0, len(ids), 64):
        want = m.logits_from_hidden(ref["hidden"][i:i + 64].astype(m.dtype))
        have = np.asarray(got[i:i + 64])
        assert np.isfinite(have).all(), f"non-finite logits in rows {i}..{i + len(have) - 1}"
        di, si, ci = row_stats(have, want)
        d.append(di), scale.append(si), corr.append(ci)
    d, scale, corr = np.concatenate(d), np.concatenate(scale), np.concatenate(corr)
    rel = d / scale
    w = int(np.argmax(rel))
    c = int(np.argmin(corr))
    summary = (f"{model}/{prompt}: {len(ids)} positions; worst row {w}: max|d|={d[w]:.3e}, "
               f"max|ref|={scale[w]:.2f}, rel={rel[w]:.3e} (tol {REL_TOL:g}); lowest correlation "
               f"{corr[c]:.8f} at row {c} (min {MIN_CORR}); rows over tol: "
               f"{np.flatnonzero(rel > REL_TOL)[:20].tolist()}")
    print(summary)
    assert rel.max() <= REL_TOL and corr.min() >= MIN_CORR, summary


@pytest.mark.parametrize("model,prompt", CASES)
def test_greedy_matches_reference(model, prompt, fathom_bin, model_paths, cache_dir):
    m = reference_model(model, model_paths[model])
    ids = prompt_ids(m, model, prompt)
    ref = reference(m, model, ids, cache_dir)
    stdout = run_fathom(fathom_bin, "generate", "--model", model_paths[model],
                        "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", N_GEN,
                        "--temperature", "0", "--json",
                        # f32 compute and f32 KV: the reference comparison mode
                        "--precision", "f32", "--kv-dtype", "f32")
    try:
        res = json.loads(stdout)
    except json.JSONDecodeError:
        lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
        assert lines, f"no JSON object in fathom generate output: {stdout[-2000:]!r}"
        res = json.loads(lines[-1])
    assert res["prompt_tokens"] == len(ids), f"prompt_tokens {res['prompt_tokens']} != {len(ids)}"
    got = [int(t) for t in res["token_ids"]]
    want = ref["greedy"].tolist()
    stops = m.stop_ids()
    tok = m.tokenizer
    text = f"\n  fathom:    {tok.decode(got)!r}\n  reference: {tok.decode(want)!r}"
    assert len(got) <= N_GEN, f"{len(got)} tokens generated, asked for {N_GEN}" + text
    for i, (g, r) in enumerate(zip(got, want)):
        if g == r:
            continue
        ids_i, vals_i = ref["top_ids"][i].tolist(), ref["top_vals"][i]
        margin = float(vals_i[0] - vals_i[ids_i.index(g)]) if g in ids_i else float("inf")
        tie = 2 * REL_TOL * float(ref["scales"][i])
        assert margin <= tie, (f"{model}/{prompt}: greedy token {i} is {g}, reference {r}; "
                               f"reference logit gap {margin:.4f} > tie tolerance {tie:.4f}" + text)
        print(f"{model}/{prompt}: near tie at step {i} (gap {margin:.4f} <= {tie:.4f}); "
              f"compared the first {i} tokens only")
        return
    # fathom may stop at an end-of-generation token (included or not); otherwise all N_GEN
    if len(got) < N_GEN:
        assert (got and got[-1] in stops) or want[len(got)] in stops, (
            f"{model}/{prompt}: fathom stopped after {len(got)} tokens without an "
            f"end-of-generation token; reference continues with {want[len(got)]}" + text)
    print(f"{model}/{prompt}: {len(got)} greedy tokens identical:{text}")
