"""/v1/completions `echo` with `logprobs`: the prompt's own tokens are scored (how evaluation
harnesses such as lm-eval score a continuation: echo, logprobs, max_tokens 1).

The prompt logprobs are judged against the independent numpy reference model
(tests/reference/numpy_model.py) on the same GGUF: log-softmax of its logits at every prompt
position, with the server in f32 compute and an f32 KV cache (the reference comparison mode).
"""
import json

import numpy as np
import pytest
import requests

import numpy_model as nm  # tests/reference, put on sys.path by conftest.py

PROMPT = "The Eiffel Tower stands on the Champ de Mars in Paris. It was built between 1887 and 1889"
TOL = 0.01  # nats. Measured 2026-11-26: 1.6e-5 in f32; 0.50 in the default q8 / f16-KV mode


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path):
    from server_fixture import ServerProcess
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--precision", "f32", "--kv-dtype", "f32"]) as s:
        yield s
    assert s.returncode == 0, s.stderr


def completions(server, **body):
    r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_logprobs(server, **body):
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    with requests.post(f"{server.base_url}/v1/completions", json=dict(body, stream=True), stream=True,
                       timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                if choice.get("logprobs"):
                    for k in out:
                        out[k] += choice["logprobs"][k]
    return text, out


@pytest.fixture(scope="module")
def reference(smollm2_path):
    return nm.ReferenceModel(smollm2_path)


def reference_prompt_logprobs(m, ids):
    g = m.greedy(ids, 0, stop_ids=(), topk=1)
    logits = m.logits_from_hidden(g["prompt_hidden"].astype(m.dtype)).astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return [float(logits[i, ids[i + 1]] - logz[i]) for i in range(len(ids) - 1)]


def test_prompt_tokens_scored_like_the_reference(server, reference):
    res = completions(server, prompt=PROMPT, max_tokens=1, echo=True, logprobs=3, temperature=0)
    choice, usage = res["choices"][0], res["usage"]
    lp = choice["logprobs"]
    n_prompt = usage["prompt_tokens"]
    assert len(lp["tokens"]) == n_prompt + usage["completion_tokens"]
    assert choice["text"].startswith(PROMPT)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing precedes it
    for top, got in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]):
        assert len(top) == 3
        assert got <= max(top.values()) + 1e-6  # the prompt token's logprob is never above the best
    ids = requests.post(f"{server.base_url}/tokenize", json={"prompt": PROMPT}, timeout=30).json()["tokens"]
    assert len(ids) == n_prompt
    want = reference_prompt_logprobs(reference, ids)
    got = lp["token_logprobs"][1:n_prompt]
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst <= TOL, f"worst |fathom - reference| = {worst:.4f} nats over {len(want)} prompt tokens"
    # The echoed tokens spell the prompt, and text_offset counts characters along them.
    assert "".join(lp["tokens"][:n_prompt]) == PROMPT
    assert lp["text_offset"][:3] == [0, len(lp["tokens"][0]), len(lp["tokens"][0]) + len(lp["tokens"][1])]


def test_prefix_cache_does_not_skip_scoring(server):
    body = dict(prompt=PROMPT + " as the entrance arch of the World's Fair.", max_tokens=2, echo=True, logprobs=1,
                temperature=0)
    first = completions(server, **body)
    again = completions(server, **body)  # its prompt blocks are in the prefix cache now
    assert again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_stream_and_choices_carry_the_prompt(server):
    body = dict(prompt=PROMPT, max_tokens=4, echo=True, logprobs=2, temperature=0)
    whole = completions(server, **body)["choices"][0]
    text, streamed = streamed_logprobs(server, **body)
    assert text == whole["text"]
    assert streamed == whole["logprobs"]
    many = completions(server, **dict(body, n=3, temperature=1.0, seed=5))
    n_prompt = many["usage"]["prompt_tokens"]
    prompt_part = [c["logprobs"]["token_logprobs"][:n_prompt] for c in many["choices"]]
    assert len(many["choices"]) == 3 and all(p == prompt_part[0] for p in prompt_part)
    assert prompt_part[0] == whole["logprobs"]["token_logprobs"][:n_prompt]


def test_long_prompt_scored_in_bounded_chunks(server):
    # Longer than the rows of logits one step returns for SmolLM2 (16 Mi floats / 49,152 = 341):
    # the prompt prefills in more than one scored chunk, and every position is scored once. (Every
    # row is a full 49k-vocabulary projection: 24 copies, not 40, keep it to two chunks.)
    copies = 24
    long_prompt = " ".join([PROMPT] * copies)
    res = completions(server, prompt=long_prompt, max_tokens=1, echo=True, logprobs=0, temperature=0)
    lp, usage = res["choices"][0]["logprobs"], res["usage"]
    assert usage["prompt_tokens"] > 341 + 50
    assert len(lp["token_logprobs"]) == usage["prompt_tokens"] + 1
    values = lp["token_logprobs"][1:]
    assert all(v is not None and np.isfinite(v) and v <= 0 for v in values)
    # The passage repeats: its later copies are predicted far better than its first.
    period = len(values) // copies
    assert np.mean(values[-period:]) > np.mean(values[:period]) + 1.0
    assert lp["top_logprobs"][1] == {}  # logprobs 0: the token only, no alternatives


def test_prompt_logprobs_in_a_prompt_list(server):
    prompts = [PROMPT, "Hello there"]
    res = completions(server, prompt=prompts, max_tokens=1, echo=True, logprobs=1, temperature=0)
    for i, p in enumerate(prompts):
        choice = res["choices"][i]
        solo = completions(server, prompt=p, max_tokens=1, echo=True, logprobs=1, temperature=0)["choices"][0]
        assert choice["text"].startswith(p)
        # Batched beside another prompt, the same tokens with logprobs equal up to summation order.
        assert choice["logprobs"]["tokens"] == solo["logprobs"]["tokens"]
        assert choice["logprobs"]["text_offset"] == solo["logprobs"]["text_offset"]
        pairs = list(zip(choice["logprobs"]["token_logprobs"], solo["logprobs"]["token_logprobs"]))
        assert pairs[0] == (None, None)
        assert max(abs(a - b) for a, b in pairs[1:]) < 1e-3
