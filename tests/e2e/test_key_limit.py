"""limits.max_requests_per_key: one API key's client cannot take every seat. With a limit of 1, a
second request of key A while A's stream runs is refused at once (HTTP 429 rate_limit_exceeded,
gRPC RESOURCE_EXHAUSTED; the two protocols share the count), key B is served meanwhile, and A is
served again once its stream ends. Real clients: the official openai client and grpcio."""
import json
import time

import grpc
import openai
import pytest

from server_fixture import ServerProcess

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
MODEL = "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("key_limit") / "config.json"
    cfg.write_text(json.dumps({"http": {"api_keys": [KEY_A, KEY_B]}, "limits": {"max_requests_per_key": 1}}))
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--config", str(cfg), "--grpc-port", "-1"]) as s:
        yield s


def client(server, key):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def short(server, key):
    return client(server, key).completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)


def test_one_keys_running_stream_does_not_stop_another_key(server, pb):
    stream = client(server, KEY_A).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2000,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
    first = next(iter(stream))  # A's request is running
    assert first.choices[0].text is not None
    try:
        with pytest.raises(openai.RateLimitError) as e:
            short(server, KEY_A)
        assert e.value.body["code"] == "rate_limit_exceeded"
        assert short(server, KEY_B).choices[0].text is not None, "another key is served meanwhile"
        ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        req = pb.msg.GenerateRequest(text="Hi", max_tokens=2)
        with pytest.raises(grpc.RpcError) as err:
            list(pb.svc.FathomStub(ch).Generate(req, metadata=[("authorization", f"Bearer {KEY_A}")], timeout=60))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, "HTTP and gRPC share the key's count"
        assert list(pb.svc.FathomStub(ch).Generate(req, metadata=[("authorization", f"Bearer {KEY_B}")], timeout=60))
        ch.close()
    finally:
        stream.close()
    # The stream's slot comes back once its handler has ended (the server notices the close).
    deadline = time.monotonic() + 10
    while True:
        try:
            short(server, KEY_A)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "key A was not served again after its stream ended"
            time.sleep(0.1)
