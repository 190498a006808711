"""gRPC front end (proto/fathom.proto) against the real binary, beside HTTP in one process.

Python stubs are generated from the proto at test time with grpc_tools.protoc, so the test
always speaks the proto in the tree. The HTTP API is the reference: the same request at
temperature 0 must give the same text, tokens and usage over both protocols.
"""
import json
import signal
import subprocess
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server_fixture import ServerProcess

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--grpc-port", "-1"]) as s:
        assert s.grpc_port, "the serve command did not print 'fathom: gRPC listening on HOST:PORT'"
        yield s


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    grpc.channel_ready_future(ch).result(timeout=30)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(pb, channel):
    return pb.svc.FathomStub(channel)


def http_post(server, path, body):
    req = urllib.request.Request(f"{server.base_url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def http_get(server, path):
    with urllib.request.urlopen(f"{server.base_url}{path}", timeout=60) as r:
        return r.read().decode()


def generate(stub, pb, timeout=300, **fields):
    """All messages of one Generate stream."""
    sampling = fields.pop("sampling", {})
    req = pb.msg.GenerateRequest(sampling=pb.msg.SamplingParameters(**sampling), **fields)
    return list(stub.Generate(req, timeout=timeout))


def text_of(messages, choice=0):
    return "".join(m.text for m in messages if m.choice == choice)


def ids_of(messages, choice=0):
    return [t for m in messages if m.choice == choice for t in m.token_ids]


def finish_of(messages, choice=0):
    reasons = [m.finish_reason for m in messages if m.choice == choice and m.finish_reason]
    assert len(reasons) == 1, f"choice {choice}: expected exactly one finish_reason, got {reasons}"
    return reasons[0]


def test_generate_stream_equals_http(stub, pb, server):
    messages = generate(stub, pb, text=PROMPT, max_tokens=24, sampling={"temperature": 0.0})
    assert len(messages) > 2, "Generate must stream, one message per step"
    ref = http_post(server, "/v1/completions",
                    {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.0})
    assert text_of(messages) == ref["choices"][0]["text"]
    assert finish_of(messages) == ref["choices"][0]["finish_reason"]
    final = messages[-1]
    assert final.HasField("usage"), "the last message carries the usage"
    assert final.finish_reason, "the last message carries the finish reason"
    assert final.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert final.usage.completion_tokens == ref["usage"]["completion_tokens"]
    assert len(ids_of(messages)) == final.usage.completion_tokens
    assert not any(m.HasField("usage") for m in messages[:-1])


def test_token_ids_in_gives_the_same_result(stub, pb):
    ids = list(stub.Tokenize(pb.msg.TokenizeRequest(text=PROMPT, add_special=True)).token_ids)
    by_text = generate(stub, pb, text=PROMPT, max_tokens=12, sampling={"temperature": 0.0})
    by_ids = generate(stub, pb, token_ids=pb.msg.TokenIds(ids=ids), max_tokens=12, sampling={"temperature": 0.0})
    assert text_of(by_ids) == text_of(by_text)
    assert ids_of(by_ids) == ids_of(by_text)
    assert by_ids[-1].usage.prompt_tokens == len(ids)


def test_streamed_tokens_decode_to_the_text(stub, pb, server):
    messages = generate(stub, pb, text=PROMPT, max_tokens=16, ignore_eos=True, sampling={"temperature": 0.0})
    decoded = http_post(server, "/detokenize", {"tokens": ids_of(messages)})["text"]
    assert decoded == text_of(messages)
    assert finish_of(messages) == "length"
    assert messages[-1].usage.completion_tokens == 16


def test_constraints_as_over_http(stub, pb):
    """The same output constraints as HTTP's response_format / fathom.grammar."""
    grammar = 'root ::= "answer: " ("yes" | "no") "."'
    for seed in range(3):
        messages = generate(stub, pb, text="Is the sky blue?", max_tokens=16,
                            sampling={"temperature": 1.0, "seed": seed},
                            constraint=pb.msg.OutputConstraint(grammar=grammar))
        assert text_of(messages) in ("answer: yes.", "answer: no.")
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                         "additionalProperties": False})
    messages = generate(stub, pb, text="Reply in JSON:", max_tokens=24, sampling={"temperature": 1.0, "seed": 1},
                        constraint=pb.msg.OutputConstraint(json_schema=schema, strict=True))
    assert json.loads(text_of(messages)) in ({"ok": True}, {"ok": False})
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, pb, text="x", max_tokens=4, constraint=pb.msg.OutputConstraint(json_schema='{"type": "nope"}'))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad in ('{"type": "array", "uniqueItems": true}', "not json", "[" * 200 + "]" * 200):
        with pytest.raises(grpc.RpcError) as err:
            generate(stub, pb, text="x", max_tokens=4, constraint=pb.msg.OutputConstraint(json_schema=bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "constraint.json_schema" in err.value.details()


def test_default_max_tokens_is_the_http_default(stub, pb):
    """Without max_tokens, gRPC generates limits.default_max_tokens (256), as HTTP does."""
    messages = generate(stub, pb, text=PROMPT, ignore_eos=True, sampling={"temperature": 0.0})
    assert messages[-1].usage.completion_tokens == 256
    assert finish_of(messages) == "length"


def test_logprobs_when_asked(stub, pb):
    messages = generate(stub, pb, text=PROMPT, max_tokens=6, sampling={"temperature": 0.0, "logprobs": 3})
    n_tokens = 0
    for m in messages:
        assert len(m.logprobs) == len(m.token_ids)
        for tid, lp in zip(m.token_ids, m.logprobs):
            n_tokens += 1
            assert lp.id == tid
            assert lp.logprob <= 0.0
            assert len(lp.top) == 3
            tops = [t.logprob for t in lp.top]
            assert tops == sorted(tops, reverse=True)
            # Greedy without penalties picks the most likely token of the raw distribution.
            assert lp.top[0].id == tid
            assert lp.top[0].logprob == pytest.approx(lp.logprob, abs=1e-5)
    assert n_tokens == messages[-1].usage.completion_tokens > 0


def test_no_logprobs_unless_asked(stub, pb):
    messages = generate(stub, pb, text=PROMPT, max_tokens=4, sampling={"temperature": 0.0})
    assert all(len(m.logprobs) == 0 for m in messages)


def test_stop_string_matches_http(stub, pb, server):
    ref = http_post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.0})
    full = ref["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 3, f"reference completion too short to pick a stop string: {full!r}"
    stop = " " + words[2]
    messages = generate(stub, pb, text=PROMPT, max_tokens=24, stop=[stop], sampling={"temperature": 0.0})
    http = http_post(server, "/v1/completions",
                     {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.0, "stop": [stop]})
    assert text_of(messages) == http["choices"][0]["text"]
    assert stop not in text_of(messages)
    assert finish_of(messages) == "stop"


def test_n_choices(stub, pb):
    messages = generate(stub, pb, text=PROMPT, n=3, max_tokens=8, ignore_eos=True,
                        sampling={"temperature": 0.8, "seed": 7})
    assert {m.choice for m in messages} == {0, 1, 2}
    for c in range(3):
        assert finish_of(messages, c) == "length"
        assert len(ids_of(messages, c)) == 8
    assert messages[-1].usage.completion_tokens == 24
    assert sum(1 for m in messages if m.HasField("usage")) == 1


def test_same_seed_same_text(stub, pb):
    kw = dict(text=PROMPT, max_tokens=12, sampling={"temperature": 1.0, "seed": 1234})
    assert text_of(generate(stub, pb, **kw)) == text_of(generate(stub, pb, **kw))


@pytest.mark.parametrize("fields, code", [
    (dict(text=""), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(token_ids={"ids": []}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(token_ids={"ids": [1, 10_000_000]}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(token_ids={"ids": [-1]}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, model="no-such-model"), grpc.StatusCode.NOT_FOUND),
    (dict(text=PROMPT, sampling={"temperature": 5.0}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, sampling={"temperature": -0.5}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, sampling={"top_p": 0.0}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, sampling={"logprobs": 1000}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, sampling={"logit_bias": {10_000_000: 1.0}}), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, attention="bogus"), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, max_tokens=10_000_000), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, n=100_000), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(text=PROMPT, stop=[""]), grpc.StatusCode.INVALID_ARGUMENT),
])
def test_errors(stub, pb, fields, code):
    fields = dict(fields)
    if "token_ids" in fields:
        fields["token_ids"] = pb.msg.TokenIds(**fields["token_ids"])
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, pb, timeout=60, **fields)
    assert err.value.code() == code, err.value.details()
    assert err.value.details(), "an error carries a message"


def test_serving_after_errors(stub, pb):
    with pytest.raises(grpc.RpcError):
        generate(stub, pb, timeout=60, text="")
    messages = generate(stub, pb, text=PROMPT, max_tokens=2, sampling={"temperature": 0.0})
    assert messages[-1].usage.completion_tokens >= 1


def test_model_name_accepted(stub, pb, server):
    model_id = json.loads(http_get(server, "/v1/models"))["data"][0]["id"]
    messages = generate(stub, pb, text=PROMPT, model=model_id, max_tokens=2, sampling={"temperature": 0.0})
    assert messages[-1].HasField("usage")


@pytest.mark.parametrize("text, add_special", [(PROMPT, True), (PROMPT, False), ("", True),
                                               ("héllo <|im_start|> wörld\n\n  x", True)])
def test_tokenize_equals_http(stub, pb, server, text, add_special):
    got = list(stub.Tokenize(pb.msg.TokenizeRequest(text=text, add_special=add_special)).token_ids)
    ref = http_post(server, "/tokenize", {"prompt": text, "add_special": add_special})["tokens"]
    assert got == ref


def test_tokenize_unknown_model(stub, pb):
    with pytest.raises(grpc.RpcError) as err:
        stub.Tokenize(pb.msg.TokenizeRequest(text="x", model="no-such-model"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_list_models(stub, pb, server):
    models = stub.ListModels(pb.msg.ListModelsRequest()).models
    assert len(models) == 1
    http_models = json.loads(http_get(server, "/v1/models"))["data"]
    assert models[0].id == http_models[0]["id"]
    assert models[0].context_length > 0
    assert models[0].architecture == "llama"


@pytest.mark.parametrize("service", ["", "fathom.v1.Fathom"])
def test_health_serving(channel, service):
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def metric_value(text, sample):
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def test_calls_and_errors_are_counted_as_http_requests_are(stub, pb, server):
    """fathom_grpc_requests_total{method, code} and fathom_errors_total{protocol="grpc", code}."""
    ok = 'fathom_grpc_requests_total{code="ok",method="/fathom.v1.Fathom/Tokenize"}'
    bad = 'fathom_grpc_requests_total{code="invalid_argument",method="/fathom.v1.Fathom/Generate"}'
    errors = 'fathom_errors_total{code="invalid_argument",protocol="grpc"}'
    before = http_get(server, "/metrics")
    stub.Tokenize(pb.msg.TokenizeRequest(text="hi"), timeout=60)
    with pytest.raises(grpc.RpcError):
        generate(stub, pb, timeout=60, text="")
    after = http_get(server, "/metrics")
    for sample in (ok, bad, errors):
        assert metric_value(after, sample) == metric_value(before, sample) + 1, sample


def test_client_cancel_frees_the_request(stub, pb, server):
    before = metric_value(http_get(server, "/metrics"), 'fathom_request_finished_total{reason="cancelled"}')
    # 4,000 tokens: still generating when the cancel comes, however long this process is starved.
    call = stub.Generate(pb.msg.GenerateRequest(text=PROMPT, max_tokens=4000, ignore_eos=True,
                                                sampling=pb.msg.SamplingParameters(temperature=0.0)), timeout=300)
    got = 0
    for _ in call:
        got += 1
        if got == 2:
            call.cancel()
            break
    deadline = time.time() + 30
    while True:
        metrics = http_get(server, "/metrics")
        cancelled = metric_value(metrics, 'fathom_request_finished_total{reason="cancelled"}') > before
        running = metric_value(metrics, "fathom_requests_running")
        if (cancelled and running == 0) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert cancelled, "the engine request of a cancelled gRPC stream was not finished as cancelled"
    assert running == 0, "fathom_requests_running still counts the cancelled request"


def test_sigterm_drains_grpc_streams(fathom_bin, smollm2_path, pb):
    """SIGTERM mid-stream: the stream still finishes, health turns NOT_SERVING, new calls get
    UNAVAILABLE, and the process exits 0. The stream is long (1,024 tokens, ~2.5 s alone) so that
    it is still draining when the new call arrives: once it ends, the gRPC server shuts down, and a
    call racing that shutdown may be CANCELLED by gRPC itself (seen with 48 tokens on a fast host,
    and once with 256 under `make test`'s two busy workers)."""
    tokens = 1024
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--grpc-port", "-1"]) as s:
        ch = grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
        stub = pb.svc.FathomStub(ch)
        health = health_pb2_grpc.HealthStub(ch)
        call = stub.Generate(pb.msg.GenerateRequest(text=PROMPT, max_tokens=tokens, ignore_eos=True,
                                                    sampling=pb.msg.SamplingParameters(temperature=0.0)),
                             timeout=300)
        stream = iter(call)
        messages = [next(stream)]
        s.send_signal(signal.SIGTERM)

        deadline = time.time() + 30
        status = None
        while time.time() < deadline:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            except grpc.RpcError:
                status = None  # already shut down: also not serving
            if status != health_pb2.HealthCheckResponse.SERVING:
                break
            time.sleep(0.05)
        assert status != health_pb2.HealthCheckResponse.SERVING, "health still SERVING while draining"
        with pytest.raises(grpc.RpcError) as err:
            generate(stub, pb, timeout=30, text=PROMPT, max_tokens=1)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()

        messages += list(stream)
        assert finish_of(messages) == "length"
        assert messages[-1].usage.completion_tokens == tokens
        ch.close()
        assert s.wait(120) == 0, s.stderr


def test_api_keys_hold_for_grpc_too(fathom_bin, smollm2_path, pb):
    """With API keys configured, every Fathom call without the key (or with a wrong one) is
    UNAUTHENTICATED, as HTTP answers 401; the right key works; health stays open."""
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--grpc-port", "-1", "--api-key", "sekrit"]) as s:
        ch = grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
        stub = pb.svc.FathomStub(ch)
        req = pb.msg.GenerateRequest(text=PROMPT, max_tokens=2, sampling=pb.msg.SamplingParameters(temperature=0.0))
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "sekrit")]):
            for call in (lambda md: list(stub.Generate(req, metadata=md, timeout=60)),
                         lambda md: stub.Tokenize(pb.msg.TokenizeRequest(text="hi"), metadata=md, timeout=60),
                         lambda md: stub.ListModels(pb.msg.ListModelsRequest(), metadata=md, timeout=60)):
                with pytest.raises(grpc.RpcError) as err:
                    call(metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (metadata, err.value.details())
        good = [("authorization", "Bearer sekrit")]
        assert len(text_of(list(stub.Generate(req, metadata=good, timeout=120)))) > 0
        assert stub.Tokenize(pb.msg.TokenizeRequest(text="hi"), metadata=good, timeout=60).token_ids
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        ch.close()


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
           "additionalProperties": False}


def test_chat_input_with_a_named_tool_gives_a_call_that_validates(stub, pb):
    """Chat messages and function tools, as /v1/chat/completions: the call arrives parsed on the
    choice's last message; a round trip with the call and its result continues the chat."""
    import jsonschema
    ask = pb.msg.ChatMessage(role="user", content="What is the weather in Paris?")
    tool = pb.msg.FunctionTool(name="get_weather", description="Weather in a city", parameters=json.dumps(WEATHER),
                               strict=True)
    for seed in range(3):
        messages = generate(stub, pb, chat=pb.msg.ChatMessages(messages=[ask]), tools=[tool],
                            tool_choice="get_weather", max_tokens=48, sampling={"temperature": 1.0, "seed": seed})
        last = messages[-1]
        assert last.finish_reason == "tool_calls" and len(last.tool_calls) == 1
        call = last.tool_calls[0]
        assert call.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), WEATHER)
        assert text_of(messages) == call.arguments  # the raw text streamed is the arguments
    follow = [ask, pb.msg.ChatMessage(role="assistant", tool_calls=[call]),
              pb.msg.ChatMessage(role="tool", tool_call_id=call.id, content=json.dumps({"temperature": 21}))]
    messages = generate(stub, pb, chat=pb.msg.ChatMessages(messages=follow), tools=[tool], tool_choice="none",
                        max_tokens=16, sampling={"temperature": 0})
    assert text_of(messages) and not messages[-1].tool_calls


@pytest.mark.parametrize("fields", [
    {"text": "hi", "tool_choice": "auto"},
    {"tool_choice": "nope"},
    {"tools": [{"name": "bad name"}]},
    {"tools": [{"name": "f", "parameters": '{"type": "array", "uniqueItems": true}'}], "tool_choice": "required"},
    {"chat": [], "text": None},
])
def test_bad_tool_fields_are_invalid_argument(stub, pb, fields):
    fields = dict(fields)
    if "tools" in fields:
        fields["tools"] = [pb.msg.FunctionTool(**t) for t in fields["tools"]]
    if "text" not in fields:
        fields["chat"] = pb.msg.ChatMessages(messages=[pb.msg.ChatMessage(role="user", content="hi")])
    elif fields["text"] is None:
        fields = {"chat": pb.msg.ChatMessages(messages=[])}
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, pb, max_tokens=4, **fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()


def test_a_reasoning_models_thinking_arrives_apart_on_the_last_message(pb, fathom_bin, smollm2_path, repo_root):
    """With a reasoning model's template (Qwen 3's), the choice's last message carries the <think>
    span as reasoning_content, as /v1/chat/completions splits it; `text` streams the raw output."""
    template = repo_root / "tests" / "fixtures" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--grpc-port", "-1", "--chat-template", template]) as s:
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as ch:
            stub = pb.svc.FathomStub(ch)
            grammar = 'root ::= "<think>" [a-z ]{3,12} "</think>\\n\\nParis"'
            ask = pb.msg.ChatMessage(role="user", content="Capital of France?")
            messages = generate(stub, pb, chat=pb.msg.ChatMessages(messages=[ask]), max_tokens=24,
                                constraint=pb.msg.OutputConstraint(grammar=grammar), sampling={"temperature": 0})
            text = text_of(messages)
            assert text.startswith("<think>") and text.endswith("</think>\n\nParis")
            assert messages[-1].reasoning_content == text[len("<think>"):text.index("</think>")]
            http = http_post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Capital of France?"}],
                                                          "max_tokens": 24, "temperature": 0, "guided_grammar": grammar})
            assert http["choices"][0]["message"]["reasoning_content"] == messages[-1].reasoning_content


def test_a_grpc_port_in_use_stops_start_up(fathom_bin, smollm2_path, server):
    # gRPC's default SO_REUSEPORT would let a second server share the port, the kernel splitting
    # connections between the two: the second must fail to start instead.
    r = subprocess.run([str(fathom_bin), "serve", "--model", str(smollm2_path), "--port", "0", "--grpc-port",
                        str(server.grpc_port), "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"cannot listen for gRPC on 127.0.0.1:{server.grpc_port}" in r.stderr, r.stderr[-2000:]
