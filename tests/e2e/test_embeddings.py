"""POST /v1/embeddings and gRPC Embed against transformers' embeddings of the same models.

The references (tests/fixtures/arch/<name>.embeddings.json, scripts/embedding_fixtures.py) are
transformers' final hidden states of the qwen2 and qwen3 fixtures' Hugging Face directories, pooled
(mean, first position, last position) and L2-normalised; fathom serves the GGUF of the same bf16
weights. Clients are the official `openai` package (which asks for base64 and decodes it) and grpcio.
"""
import json
import urllib.error
import urllib.request

import gguf
import grpc
import numpy as np
import openai
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from server_fixture import ServerProcess

ARCH = "tests/fixtures/arch"
# Max |fathom - transformers| per component of a unit embedding: measured 1.2e-4 (cls) to 2.6e-4 (last)
# on qwen3 (f32 compute over the bf16 weights; transformers' own f32 vs f64 is 3e-7); held to ten
# times that.
TOLERANCE = 2e-3


def reference(repo_root, name):
    return json.loads((repo_root / ARCH / f"{name}.embeddings.json").read_text())


def post(server, body):
    req = urllib.request.Request(f"{server.base_url}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def serve(fathom_bin, model, *args):
    return ServerProcess(fathom_bin, model, extra_args=["--grpc-port", "-1", *args])


@pytest.fixture(scope="module", params=["mean", "cls", "last"])
def pooled_qwen3(request, fathom_bin, repo_root):
    with serve(fathom_bin, repo_root / ARCH / "qwen3.gguf", "--embedding-pooling", request.param) as s:
        yield request.param, s


def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_matches_transformers(pooled_qwen3, repo_root):
    how, server = pooled_qwen3
    ref = reference(repo_root, "qwen3")
    with oai(server) as client:
        got = client.embeddings.create(model="qwen3", input=ref["prompts"])  # token-id inputs, base64 on the wire
    assert [d.index for d in got.data] == list(range(len(ref["prompts"])))
    assert got.usage.prompt_tokens == sum(len(p) for p in ref["prompts"]) == got.usage.total_tokens
    want = np.array(ref["embeddings"][how])
    have = np.array([d.embedding for d in got.data])
    assert have.shape == want.shape
    np.testing.assert_allclose(np.linalg.norm(have, axis=1), 1.0, atol=1e-5)
    err = np.abs(have - want).max()
    print(f"qwen3 {how}: max |fathom - transformers| {err:.2e}")
    assert err < TOLERANCE, f"{how}: max |fathom - transformers| {err:.2e}"
    # The other poolings are far: the test tells them apart.
    for other in {"mean", "cls", "last"} - {how}:
        assert np.abs(have - np.array(ref["embeddings"][other])).max() > 10 * TOLERANCE


def test_float_and_base64_agree_and_batches_are_invariant(pooled_qwen3, repo_root):
    _, server = pooled_qwen3
    prompts = reference(repo_root, "qwen3")["prompts"]
    with oai(server) as client:
        as_float = client.embeddings.create(model="qwen3", input=prompts, encoding_format="float")
        as_b64 = client.embeddings.create(model="qwen3", input=prompts)
        alone = [client.embeddings.create(model="qwen3", input=[p], encoding_format="float").data[0].embedding
                 for p in prompts]
    # Two requests, not bit-identical: a repeated last-token input starts from its cached prefix, and a
    # step's matmuls round by its row count. A misread base64 would be off by far more than 1e-6.
    np.testing.assert_allclose([d.embedding for d in as_float.data], [d.embedding for d in as_b64.data], atol=1e-6)
    np.testing.assert_allclose([d.embedding for d in as_float.data], alone, atol=1e-5)


def test_qwen2_mean_and_text_inputs(fathom_bin, repo_root):
    ref = reference(repo_root, "qwen2")
    with serve(fathom_bin, repo_root / ARCH / "qwen2.gguf", "--embedding-pooling", "mean") as server:
        with oai(server) as client:
            got = client.embeddings.create(model="qwen2", input=ref["prompts"])
            texts = client.embeddings.create(model="qwen2", input=["ab ab", "a"], encoding_format="float")
        status, tokenized = 0, None
        req = urllib.request.Request(f"{server.base_url}/tokenize", data=json.dumps({"prompt": "ab ab"}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            status, tokenized = r.status, json.loads(r.read())["tokens"]
        by_ids = post(server, {"input": [tokenized]})[1]["data"][0]["embedding"]
    err = np.abs(np.array([d.embedding for d in got.data]) - np.array(ref["embeddings"]["mean"])).max()
    assert err < TOLERANCE, f"qwen2 mean: {err:.2e}"
    assert status == 200 and len(texts.data) == 2 and texts.usage.prompt_tokens == len(tokenized) + 1
    np.testing.assert_allclose(texts.data[0].embedding, by_ids, atol=1e-6)


def test_many_inputs_run_in_waves(fathom_bin, repo_root):
    """More inputs than the engine's queue holds (--max-queue 8): they go in waves, none refused."""
    rng = np.random.default_rng(7)
    inputs = [rng.integers(0, 126, int(n)).tolist() for n in rng.integers(1, 40, 300)]
    with serve(fathom_bin, repo_root / ARCH / "qwen3.gguf", "--embedding-pooling", "last", "--max-queue", "8",
               "--max-num-seqs", "16") as server:
        status, body = post(server, {"input": inputs, "encoding_format": "float"})
        assert status == 200, body
        few = post(server, {"input": inputs[:5], "encoding_format": "float"})[1]
    assert len(body["data"]) == 300 and body["usage"]["prompt_tokens"] == sum(map(len, inputs))
    np.testing.assert_allclose([d["embedding"] for d in body["data"][:5]], [d["embedding"] for d in few["data"]],
                               atol=1e-5)


@pytest.mark.parametrize("pooled_qwen3", ["mean"], indirect=True)  # one pooling is enough
def test_bad_requests_are_400s_and_the_server_keeps_serving(pooled_qwen3):
    _, server = pooled_qwen3
    cases = [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input"),  # no BOS in this vocabulary: no tokens
        ({"input": [[]]}, "input"),
        ({"input": 5}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1, 2], [3, 99999]]}, "input"),
        ({"input": [[-1]]}, "input"),
        ({"input": [[1]] * 2049}, "input"),
        ({"input": list(range(5)) * 60}, "input"),  # 300 tokens: past the 256-token context
        ({"input": "a", "dimensions": 8}, "dimensions"),
        ({"input": "a", "dimensions": "64"}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "user": 3}, "user"),
        ({"input": "a", "temperature": 0.5}, "temperature"),
        ({"input": "a", "model": "nope"}, None),
    ]
    for body, param in cases:
        status, reply = post(server, body)
        assert status in (400, 404), (body, status, reply)
        if param:
            assert reply["error"]["param"] == param, (body, reply)
    assert post(server, {"input": list(range(5)) * 60})[1]["error"]["code"] == "context_length_exceeded"
    status, reply = post(server, {"input": "ab", "dimensions": 64})  # the model's own width is fine
    assert status == 200 and len(reply["data"][0]["embedding"]) == 64


def test_generative_model_without_pooling_is_refused(server, client):
    """SmolLM2's file names no pooling and the server was not told one: a clear 400, and the server
    keeps generating."""
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="smollm2-135m-instruct-q4_1", input="hello")
    assert e.value.code == "embeddings_not_served" and "--embedding-pooling" in str(e.value)
    done = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt="Hi", max_tokens=2)
    assert done.choices[0].text


def with_metadata(src, dst, **extra):
    """A copy of GGUF `src` with metadata added: pooling_type=N (the architecture's key), add_eos=True."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    new = {}
    if "pooling_type" in extra:
        key = f"{reader.fields['general.architecture'].contents()}.pooling_type"
        new[key] = MetadataDetails(gguf.GGUFValueType.UINT32, extra["pooling_type"])
    if "add_eos" in extra:
        new["tokenizer.ggml.add_eos_token"] = MetadataDetails(gguf.GGUFValueType.BOOL, extra["add_eos"])
    copy_with_new_metadata(reader, writer, new, [])


def with_pooling_type(src, dst, value):
    with_metadata(src, dst, pooling_type=value)


def test_the_files_own_pooling(fathom_bin, repo_root, tmp_path):
    """<arch>.pooling_type, as llama.cpp's converter writes it for embedding models: 3 = last token,
    served without any flag; 4 (rank: a reranker's head) refuses to load, naming it."""
    ref = reference(repo_root, "qwen3")
    last = tmp_path / "qwen3-last.gguf"
    with_pooling_type(repo_root / ARCH / "qwen3.gguf", last, 3)
    with serve(fathom_bin, last) as server:
        status, body = post(server, {"input": ref["prompts"], "encoding_format": "float"})
    assert status == 200, body
    err = np.abs(np.array([d["embedding"] for d in body["data"]]) - np.array(ref["embeddings"]["last"])).max()
    assert err < TOLERANCE
    rank = tmp_path / "qwen3-rank.gguf"
    with_pooling_type(repo_root / ARCH / "qwen3.gguf", rank, 4)
    with pytest.raises(RuntimeError) as e:
        with serve(fathom_bin, rank):
            pass
    assert "pooling_type = 4" in str(e.value) and "rank" in str(e.value)


@pytest.mark.parametrize("pooled_qwen3", ["last"], indirect=True)  # one pooling is enough
def test_grpc_embed_equals_http(pooled_qwen3, repo_root, pb):
    _, server = pooled_qwen3
    prompts = reference(repo_root, "qwen3")["prompts"]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb.svc.FathomStub(channel)
        req = pb.msg.EmbedRequest(inputs=[pb.msg.EmbedInput(token_ids=pb.msg.TokenIds(ids=p)) for p in prompts]
                                  + [pb.msg.EmbedInput(text="ab ab")])
        got = stub.Embed(req, timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(pb.msg.EmbedRequest(inputs=[pb.msg.EmbedInput(text="a")], dimensions=3), timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(pb.msg.EmbedRequest(inputs=[pb.msg.EmbedInput(token_ids=pb.msg.TokenIds(ids=[1 << 20]))]),
                       timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    http = post(server, {"input": prompts + ["ab ab"], "encoding_format": "float"})[1]
    assert got.usage.prompt_tokens == http["usage"]["prompt_tokens"]
    np.testing.assert_allclose([list(e.values) for e in got.embeddings], [d["embedding"] for d in http["data"]],
                               atol=1e-6)


def test_a_vocabulary_that_asks_for_eos_gets_it_after_text(fathom_bin, repo_root, tmp_path):
    """tokenizer.ggml.add_eos_token (Qwen3-Embedding's files): a text input ends in EOS, as its
    Hugging Face tokenizer ends it; token-id inputs stay as sent."""
    eos = tmp_path / "qwen3-eos.gguf"
    with_metadata(repo_root / ARCH / "qwen3.gguf", eos, pooling_type=3, add_eos=True)
    with serve(fathom_bin, eos) as server:
        req = urllib.request.Request(f"{server.base_url}/tokenize", data=json.dumps({"prompt": "ab ab"}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            ids = json.loads(r.read())["tokens"]
        end = 127  # the fixture vocabulary's <|end|>, its EOS
        assert end not in ids
        text = post(server, {"input": "ab ab", "encoding_format": "float"})[1]
        with_end = post(server, {"input": [ids + [end]], "encoding_format": "float"})[1]
        without = post(server, {"input": [ids], "encoding_format": "float"})[1]
    assert text["usage"]["prompt_tokens"] == len(ids) + 1
    np.testing.assert_allclose(text["data"][0]["embedding"], with_end["data"][0]["embedding"], atol=1e-6)
    assert np.abs(np.array(text["data"][0]["embedding"]) - without["data"][0]["embedding"]).max() > 1e-3
