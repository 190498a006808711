"""Decode attention policies through the HTTP API (issue 4): each sparse policy at its loosest
setting (kv_read_ratio 1) gives the dense greedy text; at 1/8 it reads far fewer KV bytes, as
/metrics counts them per policy (dense's count checked against the formula); INT8 KV serves and
reads fewer bytes; n > 1 choices sharing their prompt go through bifurcated attention, which
reads the prompt once per step instead of once per choice and leaves the greedy text unchanged."""
import pytest
import requests

from server_fixture import ServerProcess

PARAGRAPH = ("The history of the lighthouse at the northern cape goes back to the sixteenth century, when "
             "merchants from the city paid for a wooden tower and a fire of coal to warn their ships. ")
LONG_PROMPT = PARAGRAPH * 24 + "\nIn one sentence, the lighthouse was built because"
SPARSE = ["sparq", "hip", "alisa"]
# SmolLM2-135M: 30 layers, 3 kv heads, head dim 64.
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


def kv_read(server, policy):
    return server.metric("fathom_kv_read_bytes_total", {"policy": policy})


def complete(server, prompt, max_tokens, fathom=None, **extra):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    if fathom is not None:
        body["fathom"] = fathom
    r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("policy", SPARSE)
def test_loosest_setting_equals_dense(server, policy):
    dense = complete(server, LONG_PROMPT, 16, {"attention": "dense"})["choices"][0]["text"]
    loose = complete(server, LONG_PROMPT, 16, {"attention": policy, "kv_read_ratio": 1.0})["choices"][0]["text"]
    assert dense and loose == dense


def test_dense_bytes_match_the_formula(server):
    before = kv_read(server, "dense")
    out = complete(server, LONG_PROMPT, 8, {"attention": "dense", "ignore_eos": True})
    n_prompt = out["usage"]["prompt_tokens"]
    # Decode steps attend positions [0, pos] for pos = n_prompt .. n_prompt + 6 (the first token
    # comes from the prefill); K and V rows of head_dim f16 values per kv head and layer.
    steps = range(n_prompt, n_prompt + out["usage"]["completion_tokens"] - 1)
    expected = sum(2 * (pos + 1) * HEAD_DIM * 2 * KV_HEADS * LAYERS for pos in steps)
    assert kv_read(server, "dense") - before == expected


@pytest.mark.parametrize("policy", SPARSE)
def test_sparse_policy_reads_less(server, policy):
    dense_before = kv_read(server, "dense")
    complete(server, LONG_PROMPT, 12, {"attention": "dense", "ignore_eos": True})
    dense = kv_read(server, "dense") - dense_before
    before = kv_read(server, policy)
    # min_keys 0: sparse at this length (~600 keys) even where the measured break-even says dense.
    text = complete(server, LONG_PROMPT, 12, {"attention": policy, "kv_read_ratio": 0.125, "min_keys": 0,
                                              "ignore_eos": True})["choices"][0]["text"]
    sparse = kv_read(server, policy) - before
    assert text.strip()
    # 1/8 of the keys on the sparse layers; HiP keeps 3 of 30 layers dense and SWA attends densely
    # on its first step to seed its attention mass, so allow up to 1/2.
    assert 0 < sparse < 0.5 * dense, (sparse, dense)


@pytest.mark.parametrize("policy", SPARSE)
def test_steps_below_min_keys_are_dense(server, policy):
    # Every decode step of a ~600-token prompt is below min_keys 100000: the dense kernel runs, so
    # the text is dense's and the policy is charged dense's bytes.
    dense_before = kv_read(server, "dense")
    want = complete(server, LONG_PROMPT, 12, {"attention": "dense", "ignore_eos": True})["choices"][0]["text"]
    dense = kv_read(server, "dense") - dense_before
    before = kv_read(server, policy)
    got = complete(server, LONG_PROMPT, 12, {"attention": policy, "min_keys": 100000,
                                             "ignore_eos": True})["choices"][0]["text"]
    assert got == want
    assert kv_read(server, policy) - before == dense


@pytest.mark.parametrize("value", [-1, "auto", 1.5, None, [3]])
def test_bad_min_keys_is_400(server, value):
    r = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2, "fathom": {"attention": "alisa", "min_keys": value}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].endswith("min_keys")


def test_options_under_both_names_of_a_policy_are_400(server):
    r = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2,
                            "fathom": {"attention": "alisa", "alisa": {"pool": 5}, "swa": {"pool": 3}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "fathom.swa"


def layer_steps(server, policy):
    text = requests.get(f"{server.base_url}/metrics", timeout=30).text
    prefix, suffix = 'fathom_attention_layer_steps_total{kernel="', f'",policy="{policy}"}}'
    return {line[len(prefix):line.index(suffix)]: float(line.split()[-1])
            for line in text.splitlines() if line.startswith(prefix) and suffix in line}


def test_auto_counts_what_it_chose(server):
    before = layer_steps(server, "auto")
    out = complete(server, LONG_PROMPT, 8, {"attention": "auto", "ignore_eos": True})
    after = layer_steps(server, "auto")
    chose = {k: after[k] - before.get(k, 0) for k in after}
    # Every decode layer step ran either ALISA (above its measured break-even) or dense.
    assert set(k for k, v in chose.items() if v > 0) <= {"alisa", "dense"}, chose
    assert sum(chose.values()) == LAYERS * (out["usage"]["completion_tokens"] - 1)
    # auto resolves to ALISA at the server's default ratio (1/4), whose break-even was measured at
    # start-up (auto is the default policy) and is exported.
    break_even = server.metric("fathom_attention_break_even_keys", {"kv_read_ratio": "0.25", "policy": "alisa"})
    assert break_even == float("inf") or break_even in [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    # Below the break-even every step is dense; above it, ALISA.
    want = "dense" if break_even > out["usage"]["prompt_tokens"] + 8 else "alisa"
    assert chose.get(want, 0) == sum(chose.values()), (chose, break_even)
    forced = complete(server, LONG_PROMPT, 8, {"attention": "auto", "min_keys": 0, "ignore_eos": True})
    # "swa", ALISA's old name, is still accepted (deprecated) and is the same policy.
    before_alisa = kv_read(server, "alisa")
    assert forced["choices"][0]["text"] == complete(
        server, LONG_PROMPT, 8, {"attention": "swa", "min_keys": 0, "ignore_eos": True,
                                 "swa": {"pool": 7}})["choices"][0]["text"]
    assert kv_read(server, "alisa") > before_alisa


def test_a_sparse_default_policy_is_measured_at_start_up(fathom_bin, smollm2_path):
    # `--attention auto` at 1/4 as the server's default: the server measures ALISA's break-even
    # before serving, so it is on /metrics before any request and no request's first step pays for
    # the measurement.
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--attention", "auto", "--kv-read-ratio", "0.25"]) as s:
        break_even = s.metric("fathom_attention_break_even_keys", {"kv_read_ratio": "0.25", "policy": "alisa"})
        assert break_even == float("inf") or 256 <= break_even <= 32768
        assert "auto decodes sparse from" in s.stderr, s.stderr
    assert s.returncode == 0, s.stderr


def test_the_default_is_exact_dense_attention(fathom_bin, smollm2_path):
    # Out of the box the output is the model's own: dense attention, nothing to measure, and a long
    # request's decode steps all run dense's kernel; a sparse policy is a request's explicit choice.
    with ServerProcess(fathom_bin, smollm2_path) as s:
        before = layer_steps(s, "dense")
        out = complete(s, LONG_PROMPT, 8, {"ignore_eos": True})
        assert out["usage"]["completion_tokens"] == 8
        after = layer_steps(s, "dense")
        assert after.get("dense", 0) > before.get("dense", 0) and set(after) == {"dense"}, after
        assert not any(k for k in layer_steps(s, "auto").values()), "no step ran auto"
    assert s.returncode == 0, s.stderr
    assert "loaded" in s.stderr and "decodes sparse from" not in s.stderr, s.stderr


def test_measured_min_keys_is_accepted(server):
    out = complete(server, LONG_PROMPT, 4, {"attention": "sparq", "min_keys": "measured"})
    assert out["choices"][0]["text"] is not None


def test_explicit_parameters_are_accepted(server):
    out = complete(server, LONG_PROMPT, 4, {"attention": "sparq", "sparq": {"r": 8, "k": 64, "l": 16,
                                                                           "reallocation": False}})
    assert out["choices"][0]["text"] is not None
    out = complete(server, LONG_PROMPT, 4, {"attention": "hip", "hip": {"mask_k": 64, "sink": 4, "window": 32,
                                                                       "refresh": 2, "dense_layers": 1}})
    assert out["choices"][0]["text"] is not None


def test_hip_mask_per_kv_head_reads_less_than_per_query_head(server):
    # SmolLM2's 3 query heads per kv head: one shared mask estimates with a third of the key reads
    # and attends one selection per kv head instead of the union of three.
    def hip_bytes(per_kv_head):
        before = kv_read(server, "hip")
        text = complete(server, LONG_PROMPT, 12, {"attention": "hip", "min_keys": 0, "ignore_eos": True,
                                                  "hip": {"per_kv_head": per_kv_head, "mask_k": 64}})
        assert text["choices"][0]["text"].strip()
        return kv_read(server, "hip") - before

    per_head, per_kv_head = hip_bytes(False), hip_bytes(True)
    assert 0 < per_kv_head < per_head, (per_kv_head, per_head)


def test_sparq_key_spread_can_be_turned_off(server):
    # SparQ weights step 1 by the keys' spread by default, reading one M2 row of the K moments per
    # kv head and layer-step more; the paper's rule stays one option away and reads exactly that less.
    def sparq_bytes(options):
        before = kv_read(server, "sparq")
        out = complete(server, LONG_PROMPT, 8, {"attention": "sparq", "min_keys": 0, "ignore_eos": True} | options)
        assert out["usage"]["completion_tokens"] == 8
        return kv_read(server, "sparq") - before

    default, spread, paper = sparq_bytes({}), sparq_bytes({"sparq": {"key_spread": True}}), \
        sparq_bytes({"sparq": {"key_spread": False}})
    assert default == spread
    # SmolLM2: 30 layers, 3 kv heads of 64 dims; 7 decode steps after the prefill's token.
    assert spread - paper == 7 * 30 * 3 * 64 * 4, (spread, paper)
    r = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2,
                            "fathom": {"attention": "sparq", "sparq": {"key_spread": "no"}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].endswith("key_spread")


@pytest.mark.parametrize("value", [1, "yes", None])
def test_bad_hip_per_kv_head_is_400(server, value):
    r = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2,
                            "fathom": {"attention": "hip", "hip": {"per_kv_head": value}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].endswith("per_kv_head")


@pytest.fixture(scope="module")
def int8_server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--kv-dtype", "int8"]) as s:
        yield s
    assert s.returncode == 0, s.stderr


def test_int8_kv_serves_every_policy_and_reads_less(int8_server):
    before = kv_read(int8_server, "dense")
    out = complete(int8_server, LONG_PROMPT, 8, {"attention": "dense", "ignore_eos": True})
    assert out["choices"][0]["text"].strip()
    n_prompt = out["usage"]["prompt_tokens"]
    steps = range(n_prompt, n_prompt + out["usage"]["completion_tokens"] - 1)
    # One byte per element plus an 8-byte (scale, min) pair per row.
    expected = sum(2 * (pos + 1) * (HEAD_DIM + 8) * KV_HEADS * LAYERS for pos in steps)
    assert kv_read(int8_server, "dense") - before == expected
    dense = out["choices"][0]["text"]
    for policy in SPARSE:
        loose = complete(int8_server, LONG_PROMPT, 8,
                         {"attention": policy, "kv_read_ratio": 1.0, "ignore_eos": True})["choices"][0]["text"]
        assert loose == dense, policy


@pytest.fixture(scope="module")
def unshared_server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--no-bifurcated"]) as s:
        yield s
    assert s.returncode == 0, s.stderr


def test_bifurcated_choices_read_the_prompt_once(server, unshared_server):
    def run(s):
        before = kv_read(s, "dense")
        out = complete(s, LONG_PROMPT, 10, {"attention": "dense", "ignore_eos": True}, n=8)
        return [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])], kv_read(s, "dense") - before

    shared_texts, shared_bytes = run(server)
    alone_texts, alone_bytes = run(unshared_server)
    assert shared_texts == alone_texts
    assert len(set(shared_texts)) == 1  # greedy: every choice is the same text
    # 8 choices reading a ~600-token prompt: once per step instead of 8 times (their own
    # suffixes are a few tokens), so well under half.
    assert shared_bytes < 0.3 * alone_bytes, (shared_bytes, alone_bytes)
