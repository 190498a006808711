"""Mixture-of-experts models through the server: the tiny qwen3moe, Mixtral and gpt-oss fixtures
(tests/fixtures/arch, scripts/arch_fixtures.py) answer completions, streamed the same as not, and
/metrics counts the expert weight bytes their steps read. Logits against transformers:
tests/kernel/test_cuda_arch_fixtures.cpp."""
import openai
import pytest

from server_fixture import ServerProcess

ARCH = "tests/fixtures/arch"


@pytest.fixture(scope="module", params=["qwen3moe.gguf", "mixtral.gguf", "qwen3moe-hf", "mixtral-hf",
                                                   "gpt-oss-hf", "gpt-oss-mxfp4-hf"])
def moe_server(request, fathom_bin, repo_root):
    with ServerProcess(fathom_bin, repo_root / ARCH / request.param, extra_args=["--grpc-port", "-1"]) as s:
        yield s


def test_completions_stream_alike_and_count_expert_bytes(moe_server):
    client = openai.OpenAI(base_url=f"{moe_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    before = moe_server.metric("fathom_expert_weight_bytes_total")
    args = dict(model=client.models.list().data[0].id, prompt="abab cd", max_tokens=12, temperature=0)
    whole = client.completions.create(**args)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert whole.usage.completion_tokens > 0
    assert streamed == whole.choices[0].text
    assert moe_server.metric("fathom_expert_weight_bytes_total") > before
