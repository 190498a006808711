"""HTTP error handling: every malformed or refused request gets the right status and the OpenAI
error shape {"error": {"message", "type", "param", "code"}}, and the server keeps serving.

The module's server runs with an API key and a small body limit; a second, short-lived server
checks 429 (queue full) and the SIGTERM drain (503 for new requests, running streams finish,
exit status 0).
"""
import concurrent.futures as cf
import json
import signal
import subprocess
import threading
import time

import openai
import pytest
import requests

from server_fixture import ServerProcess

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 65536


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path,
                       extra_args=["--api-key", KEY, "--max-body-bytes", MAX_BODY, "--max-tokens-limit", 1000]) as s:
        yield s
    assert s.returncode == 0, s.stderr


@pytest.fixture(autouse=True)
def still_serving(request):
    """After every test of this module, the server still answers a real generation."""
    yield
    if "server" not in request.fixturenames:
        return
    server = request.getfixturevalue("server")
    assert server.alive(), server.stderr
    r = requests.post(f"{server.base_url}/v1/completions", headers=AUTH, timeout=300,
                      json={"prompt": "Hello", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text


def send(server, path="/v1/completions", body=None, raw=None, headers=AUTH, method="POST"):
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.request(method, f"{server.base_url}{path}", data=data, timeout=300,
                            headers={"Content-Type": "application/json", **headers})


def assert_error(r, status, param=None, phrase=None):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if phrase is not None:
        assert phrase.lower() in err["message"].lower(), err
    return err


# -- malformed and invalid requests ---------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"{", b"not json", b"", b'{"prompt": "x",}', b"\xff\xfe{}", b"[" * 50000,
                                 b'"just a string"', b"[1, 2]",
                                 b'{"prompt": "x", "max_tokens": 1}\x00{"garbage'])  # a NUL must not end the JSON
def test_malformed_json(server, raw):
    err = assert_error(send(server, raw=raw), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": ["a", 5]}, "prompt"),  # a list mixing a string and a number
    ("/v1/completions", {"prompt": ["a", []]}, "prompt"),
    ("/v1/completions", {"prompt": [1, -3]}, "prompt"),
    ("/v1/completions", {"prompt": [10 ** 9]}, "prompt"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": 5}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": "2"}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 1000}, "n"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x", "seed": 1.5}, "seed"),
    ("/v1/completions", {"prompt": "x", "seed": 2 ** 63}, "seed"),  # OpenAI's seed is an int64
    ("/v1/completions", {"prompt": "x", "logprobs": 100}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1000}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "fathom": {"attention": "bogus"}}, "fathom.attention"),
    ("/v1/completions", {"prompt": "x", "fathom": {"kv_read_ratio": 1.5}}, "fathom.kv_read_ratio"),
    ("/v1/completions", {"prompt": "x", "fathom": {"sparq": {"k": 0}}}, "fathom.sparq.k"),
    ("/v1/completions", {"prompt": "x", "fathom": {"bogus": 1}}, "fathom.bogus"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}, 3]}, "messages[1]"),
    ("/v1/chat/completions", {"messages": [{"role": 7, "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
])
def test_invalid_fields(server, path, body, param):
    err = assert_error(send(server, path, body), 400, param=param)
    assert err["type"] == "invalid_request_error"


def test_max_tokens_beyond_context(server):
    ctx = send(server, "/v1/models", method="GET").json()["data"][0]["max_model_len"]
    err = assert_error(send(server, body={"prompt": "Hello there", "max_tokens": ctx}), 400, param="max_tokens",
                       phrase="context")
    assert err["code"] == "context_length_exceeded"  # OpenAI's code: clients match on it


def test_max_tokens_beyond_limit(server):
    assert_error(send(server, body={"prompt": "Hello", "max_tokens": 1001}), 400, param="max_tokens", phrase="1000")


def test_prompt_longer_than_context(server):
    ctx = send(server, "/v1/models", method="GET").json()["data"][0]["max_model_len"]
    err = assert_error(send(server, body={"prompt": [1] * (ctx + 5), "max_tokens": 1}), 400, param="prompt",
                       phrase="context")
    assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "max_tokns": 4}, "max_tokns"),  # a typo is not silently dropped
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "guided_regex": "a+"}, "guided_regex"),
    ("/v1/responses", {"input": "x", "temperatur": 0}, "temperatur"),
])
def test_an_unknown_field_is_a_400_naming_it(server, path, body, field):
    err = assert_error(send(server, path, body), 400, param=field, phrase=field)
    assert err["code"] == "unknown_parameter"


def test_cors_is_off_by_default(server):
    """No http.cors_origins: a preflight is refused and no response carries CORS headers."""
    origin = "https://app.example"
    p = requests.options(f"{server.base_url}/v1/completions", timeout=10,
                         headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert p.status_code == 403 and "Access-Control-Allow-Origin" not in p.headers
    r = requests.get(f"{server.base_url}/v1/models", headers={"Origin": origin}, timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers  # (this module's server wants a key: 401)


def test_unknown_model(server):
    err = assert_error(send(server, body={"model": "gpt-4o", "prompt": "x"}), 404, param="model")
    assert err["code"] == "model_not_found"


def test_unknown_route(server):
    assert_error(send(server, "/v1/audio/speech", {"input": "x"}), 404)
    assert_error(send(server, "/nothing/here", method="GET"), 404)


def test_oversized_body(server):
    body = json.dumps({"prompt": "a" * (MAX_BODY + 1000)}).encode()
    err = assert_error(send(server, raw=body), 413)
    assert err["code"] == "request_too_large"


# -- API keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}])
def test_api_key_required(server, headers):
    for path, method in [("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/v1/models", "GET"),
                         ("/tokenize", "POST")]:
        err = assert_error(send(server, path, {"prompt": "x"}, headers=headers, method=method), 401)
        assert err["code"] == "invalid_api_key"


def test_health_and_metrics_open_without_key(server):
    assert requests.get(f"{server.base_url}/health", timeout=10).status_code == 200
    assert requests.get(f"{server.base_url}/metrics", timeout=10).status_code == 200


def test_openai_client_errors(server):
    good = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0, timeout=300)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.NotFoundError) as e:
        good.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        good.chat.completions.create(model="smollm2-135m-instruct-q4_1", messages=[], max_tokens=1)
    assert e.value.body["param"] == "messages"
    assert good.models.list().data[0].id == "smollm2-135m-instruct-q4_1"


# -- queue full and drain (own server) --------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server(fathom_bin, smollm2_path):
    s = ServerProcess(fathom_bin, smollm2_path, extra_args=["--max-num-seqs", 2, "--max-queue", 1,
                                                            "--drain-timeout-ms", 120000])
    s.start()
    yield s
    s.stop()


def completion(server, max_tokens, stream=False):
    body = {"prompt": "Count slowly:", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "fathom": {"ignore_eos": True}}
    return requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300, stream=stream)


def test_queue_full_is_429(small_server):
    # Both slots (max_num_seqs 2) held by long streams, one request waiting (max_queue 1): the queue
    # is full for as long as the streams run (4,000 tokens, closed below), so the checks below do
    # not race the engine.
    streams = [completion(small_server, 4000, stream=True) for _ in range(2)]
    lines = [s.iter_lines() for s in streams]  # kept alive: a dropped iterator closes its socket
    for s, it in zip(streams, lines):
        assert s.status_code == 200
        next(it)  # first token arrived: the stream is running
    with cf.ThreadPoolExecutor(1) as pool:
        queued = pool.submit(completion, small_server, 4)
        deadline = time.monotonic() + 30
        while True:  # /ready turns 503 "overloaded" once the request waits; /live stays 200
            ready = requests.get(f"{small_server.base_url}/ready", timeout=5)
            assert requests.get(f"{small_server.base_url}/live", timeout=5).status_code == 200
            if ready.status_code == 503:
                break
            assert ready.json()["status"] == "ready" and time.monotonic() < deadline
            time.sleep(0.01)
        assert ready.json()["status"] == "overloaded"
        rejected = completion(small_server, 4)
        assert_error(rejected, 429)
        assert int(rejected.headers["Retry-After"]) >= 1
        for s in streams:
            s.close()  # the engine notices the departed clients and frees both slots
        assert queued.result(timeout=120).status_code == 200
    assert requests.get(f"{small_server.base_url}/ready", timeout=5).status_code == 200
    wait_until_idle(small_server)  # the next test needs both slots: the closed streams may still hold one


def wait_until_idle(server, timeout=60):
    """Until no request runs: a closed stream's slot frees when the engine's next write to it fails."""
    running = server.settled_metric("fathom_requests_running", timeout=timeout)
    assert running == 0, f"still running after {timeout} s: {running}"


def test_sigterm_drains(small_server):
    # Two streams in flight (both admitted: max_num_seqs = 2), then SIGTERM. They are long enough
    # (1,024 tokens, seconds) to outlast the checks below: with 24 the drain once ended, and the
    # server exited, before a test process starved by the other pytest worker polled /health.
    wait_until_idle(small_server)
    streams = [completion(small_server, 1024, stream=True) for _ in range(2)]
    assert [r.status_code for r in streams] == [200, 200], [r.text[:300] for r in streams if r.status_code != 200]
    iters = [r.iter_lines() for r in streams]
    for it in iters:  # wait until both have produced their first chunk
        assert next(l for l in it if l.startswith(b"data: "))
    small_server.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while requests.get(f"{small_server.base_url}/health", timeout=10).status_code == 200:
        assert time.monotonic() < deadline, "health never left 'ready' after SIGTERM"
        time.sleep(0.05)
    h = requests.get(f"{small_server.base_url}/health", timeout=10)
    assert h.status_code == 503 and h.json() == {"status": "draining"}
    r = completion(small_server, 4)
    assert_error(r, 503)
    assert "Retry-After" in r.headers

    results = [None, None]

    def finish(i):
        lines = [l for l in iters[i] if l.startswith(b"data: ")]  # skips ": keep-alive" comments
        results[i] = lines

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for lines in results:
        assert lines and lines[-1] == b"data: [DONE]"
        finals = [json.loads(l[6:]) for l in lines[:-1]]
        assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert small_server.wait(120) == 0, small_server.stderr
    assert "drained" in small_server.stderr


def test_a_request_a_drain_cuts_short_ends_with_an_error_not_a_finish_reason(fathom_bin, smollm2_path):
    """OpenAI has no finish_reason for "cancelled": a stream the drain deadline cuts ends with an
    error event (code draining) and [DONE]; a collected answer is a 503."""
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--drain-timeout-ms", 300]) as s:
        stream = completion(s, 4000, stream=True)
        lines = stream.iter_lines()
        assert next(l for l in lines if l.startswith(b"data: "))
        whole = {}
        t = threading.Thread(target=lambda: whole.update(r=completion(s, 4000)))
        t.start()
        deadline = time.monotonic() + 30  # until the second request is admitted
        while s.metric("fathom_requests_running") < 2:
            assert time.monotonic() < deadline, "the second request was never admitted"
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        data = [l for l in lines if l.startswith(b"data: ")]
        t.join(60)
        assert data[-1] == b"data: [DONE]"
        events = [json.loads(l[6:]) for l in data[:-1]]
        assert events[-1]["error"]["code"] == "draining", events[-1]
        assert all(c.get("finish_reason") in (None, "stop", "length") for e in events for c in e.get("choices", []))
        assert_error(whole["r"], 503)
        assert whole["r"].json()["error"]["code"] == "draining"


def test_api_keys_from_a_file_and_the_environment(fathom_bin, smollm2_path, tmp_path):
    """Keys need not be on the command line (where ps shows them): --api-key-file and
    FATHOM_API_KEYS add keys; the command line then carries none."""
    key_file = tmp_path / "keys"
    key_file.write_text("# operators' keys\n  from-file  \n\n")
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--api-key-file", key_file],
                       env={"FATHOM_API_KEYS": "from-env, second"}) as s:
        assert "from-file" not in " ".join(s.proc.args) and "from-env" not in " ".join(s.proc.args)
        for key, status in [(None, 401), ("wrong", 401), ("from-file", 200), ("from-env", 200), ("second", 200)]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = requests.get(f"{s.base_url}/v1/models", headers=headers, timeout=30)
            assert r.status_code == status, (key, r.text)
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    r = subprocess.run([str(fathom_bin), "serve", "--model", str(smollm2_path), "--port", "0", "--api-key-file",
                        str(empty)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "holds no key" in r.stderr
