"""The engine's error boundary, proven with fault injection in a running server.

FATHOM_FAILPOINTS=forward:throw@7 makes every 7th forward step throw. With 32 concurrent requests
(completions and chats, some streamed) the requests in a failed step end with an error (HTTP 500,
or an error event in the stream), every other one returns exactly the text of a fault-free run,
/health stays 200, and the KV blocks and running requests return to zero. A second fault round
does not grow the process (nothing is leaked per failure). A malformed specification is a
start-up error.
"""
import concurrent.futures as cf
import json
import subprocess
import time

import pytest
import requests

from server_fixture import ServerProcess

N_REQUESTS = 32
SUBJECTS = ["the sea", "a city", "winter", "a robot", "music", "the moon", "coffee", "a garden"]
# Prefix caching off: with it, blocks of finished prompts stay cached and "back to zero" would
# have to subtract them.
SERVER_ARGS = ["--no-prefix-caching", "--threads", "2"]


def prompt(i):
    return f"Request {i}: three words about {SUBJECTS[i % len(SUBJECTS)]} are"


def one(base, i):
    """(status, text or error message) of request i: every 4th streams, every 3rd is a chat.
    Lengths differ (2 to 9 tokens) and arrivals are staggered, so the steps hold different sets
    of requests: a request that lives through fewer than 7 steps may miss every failing one."""
    time.sleep(0.02 * i)
    body = {"model": "smollm2-135m-instruct-q4_1", "max_tokens": 2 + i % 8, "temperature": 0,
            "fathom": {"ignore_eos": True}}
    chat = i % 3 == 0
    if chat:
        body["messages"] = [{"role": "user", "content": prompt(i)}]
    else:
        body["prompt"] = prompt(i)
    url = f"{base}/v1/{'chat/completions' if chat else 'completions'}"
    if i % 4 == 0:
        body["stream"] = True
        text, error = "", None
        with requests.post(url, json=body, stream=True, timeout=300) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frame = json.loads(line[len("data: "):])
                if "error" in frame:
                    error = frame["error"]["message"]
                    continue
                delta = frame["choices"][0]["delta"] if chat else frame["choices"][0]
                text += (delta.get("content") if chat else delta.get("text")) or ""
        return (500, error) if error else (200, text)
    r = requests.post(url, json=body, timeout=300)
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["message"]
    choice = r.json()["choices"][0]
    return 200, choice["message"]["content"] if chat else choice["text"]


def run_all(base):
    with cf.ThreadPoolExecutor(N_REQUESTS) as pool:
        return list(pool.map(lambda i: one(base, i), range(N_REQUESTS)))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def fault_free(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, extra_args=SERVER_ARGS) as server:
        results = run_all(server.base_url)
    assert all(status == 200 for status, _ in results), results
    return [text for _, text in results]


def test_a_failing_step_fails_only_its_requests(fathom_bin, smollm2_path, fault_free):
    env = {"FATHOM_FAILPOINTS": "forward:throw@7"}
    with ServerProcess(fathom_bin, smollm2_path, extra_args=SERVER_ARGS, env=env) as server:
        base = server.base_url
        results = run_all(base)
        failed = [i for i, (status, _) in enumerate(results) if status != 200]
        assert failed, "every 7th step throws: some request must have failed"
        assert len(failed) < N_REQUESTS, "only the requests in a failing step fail"
        for i, (status, text) in enumerate(results):
            if status == 200:
                assert text == fault_free[i], f"request {i} differs from the fault-free run"
            else:
                assert status == 500 and "failpoint forward fired" in text, (i, status, text)
        assert requests.get(f"{base}/health", timeout=10).status_code == 200
        assert server.settled_metric("fathom_kv_blocks_used", {"tier": "device"}) == 0
        assert server.settled_metric("fathom_requests_running") == 0
        errors = server.settled_metric("fathom_request_finished_total", {"reason": "error"}, want=len(failed))
        assert errors == len(failed)

        # Nothing is leaked per failure: two more fault rounds do not grow the process.
        rss_after_first = rss_kib(server.proc.pid)
        for _ in range(2):
            again = run_all(base)
            assert any(status != 200 for status, _ in again)
        grown_mib = (rss_kib(server.proc.pid) - rss_after_first) / 1024
        assert grown_mib < 32, f"RSS grew by {grown_mib:.1f} MiB over two fault rounds"
        assert server.settled_metric("fathom_kv_blocks_used", {"tier": "device"}) == 0
        assert server.settled_metric("fathom_requests_running") == 0
        assert requests.get(f"{base}/health", timeout=10).status_code == 200
    assert server.returncode == 0
    assert "failpoints armed: forward:throw@7" in server.stderr


@pytest.mark.parametrize("spec", ["forward", "nowhere:throw", "forward:explode", "forward:throw@0", "forward:throw@x"])
def test_a_malformed_failpoint_spec_stops_start_up(fathom_bin, smollm2_path, spec):
    r = subprocess.run([str(fathom_bin), "serve", "--model", str(smollm2_path), "--port", "0"],
                       env={"FATHOM_FAILPOINTS": spec, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "FATHOM_FAILPOINTS" in r.stderr, r.stderr
