"""The HTTP front end under hostile and careless clients (issue 17's findings), over raw sockets.

Each test states the attack, then what must hold: an early answer never leaves a body on the
connection to be parsed as a second request (smuggling), chunked bodies obey the body limit,
slow or idle connections cannot take /health down, the connection limit answers 503, a
non-streaming request whose client left is cancelled, and the ordinary HTTP/1.1 features
(pipelining, Expect: 100-continue, HTTP/1.0) still work.
"""
import json
import re
import socket
import threading
import time

import pytest
import requests

from server_fixture import ServerProcess

KEY = "sk-hardening"
STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def connect(server, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_closed(s, timeout=5.0) -> bytes:
    """Everything the server sends until it closes the connection (or `timeout` passes)."""
    s.settimeout(timeout)
    out = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def statuses(raw: bytes):
    return [int(m) for m in STATUS_RE.findall(raw)]


def health_latency_ms(server) -> float:
    """One GET /health on a fresh connection, timed from connect to the full response."""
    t0 = time.perf_counter()
    with connect(server, timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_until_closed(s, timeout=5)
    assert statuses(raw) == [200], raw[:200]
    return (time.perf_counter() - t0) * 1e3


def write_config(tmp_path, http: dict) -> str:
    path = tmp_path / "hardening.json"
    path.write_text(json.dumps({"http": http, "scheduler": {"max_num_seqs": 2, "max_queue": 4}}))
    return str(path)


@pytest.fixture(scope="module")
def hardened(fathom_bin, smollm2_path, tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("cfg"),
                       {"max_body_bytes": 4096, "header_timeout_ms": 1000, "body_timeout_ms": 1500,
                        "idle_timeout_ms": 1500, "max_connections": 1200})
    with ServerProcess(fathom_bin, smollm2_path,
                       extra_args=["--config", cfg, "--api-key", KEY, "--grpc-port", "0"]) as server:
        yield server


def send_with_smuggled_body(server, request_line, headers, smuggled: bytes) -> bytes:
    """Sends a request whose body is itself a complete request; returns all the server sent."""
    head = f"{request_line}\r\nHost: x\r\n{headers}Content-Length: {len(smuggled)}\r\n\r\n".encode()
    with connect(server) as s:
        s.sendall(head + smuggled)
        return read_until_closed(s)


def test_unread_body_after_401_is_not_a_second_request(hardened):
    # The body of an unauthenticated POST is itself a valid, authenticated request. Read as a
    # second request on the keep-alive connection it would run with the victim's key.
    smuggled = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
    raw = send_with_smuggled_body(hardened, "POST /v1/completions HTTP/1.1", "Content-Type: application/json\r\n",
                                  smuggled)
    assert statuses(raw) == [401], raw
    assert b"Connection: close" in raw


def test_unknown_route_with_body_closes_the_connection(hardened):
    raw = send_with_smuggled_body(hardened, "POST /nope HTTP/1.1", f"Authorization: Bearer {KEY}\r\n",
                                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(raw) == [404], raw


def test_chunked_body_cannot_exceed_the_limit(hardened):
    # max_body_bytes is 4096: a chunked upload is cut at the limit with 413, not buffered whole.
    with connect(hardened) as s:
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        sent = 0
        try:
            for _ in range(256):  # up to 1 MiB, far past the limit
                s.sendall(b"1000\r\n" + b" " * 4096 + b"\r\n")
                sent += 4096
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = read_until_closed(s)
    assert statuses(raw) == [413], raw[:300]
    assert b"request_too_large" in raw
    assert health_latency_ms(hardened) < 1000


@pytest.mark.parametrize("headers", [
    "Content-Length: 5\r\nContent-Length: 6\r\n",                     # conflicting lengths
    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",             # CL.TE desync
    "Transfer-Encoding: gzip, chunked\r\nTransfer-Encoding: chunked\r\n",
    "Content-Length: -5\r\n",
    "Content-Length: 5x\r\n",
])
def test_ambiguous_framing_is_refused(hardened, headers):
    with connect(hardened) as s:
        s.sendall((f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{headers}\r\n"
                   "0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n").encode())
        raw = read_until_closed(s)
    got = statuses(raw)
    assert got and got[0] == 400 and len(got) == 1, raw[:300]


def test_headers_that_never_end_are_cut_at_the_deadline(hardened):
    # Slowloris: one header byte every 100 ms. header_timeout_ms is 1000.
    t0 = time.monotonic()
    with connect(hardened) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while time.monotonic() - t0 < 6:
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.1)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
    assert closed, "the server kept a connection whose headers never ended"
    assert time.monotonic() - t0 < 3.0


def test_health_answers_fast_with_a_thousand_slow_and_idle_connections(hardened):
    socks = []
    try:
        for i in range(1000):
            s = connect(hardened, timeout=5)
            if i % 2:  # half send a partial request line, half send nothing
                s.sendall(b"GET /health HTT")
            socks.append(s)
        latencies = sorted(health_latency_ms(hardened) for _ in range(20))
    finally:
        for s in socks:
            s.close()
    print(f"/health with 1000 slow connections: median {latencies[10]:.1f} ms, max {latencies[-1]:.1f} ms")
    assert latencies[-1] < 100, latencies


def test_health_answers_fast_while_every_slot_generates(hardened):
    # max_num_seqs is 2: two long streams take every slot.
    stop = threading.Event()
    started = threading.Barrier(3)

    def stream():
        with requests.post(f"{hardened.base_url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                           json={"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                                 "stream": True}, stream=True, timeout=120) as r:
            it = r.iter_lines()
            next(it)
            started.wait()
            for _ in it:
                if stop.is_set():
                    break

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    try:
        latencies = sorted(health_latency_ms(hardened) for _ in range(20))
        running = requests.get(f"{hardened.base_url}/metrics", timeout=5).text
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert re.search(r"^fathom_requests_running 2(\.0)?$", running, re.M), "both slots should be generating"
    print(f"/health while every slot generates: median {latencies[10]:.1f} ms, max {latencies[-1]:.1f} ms")
    assert latencies[-1] < 100, latencies


def running_requests(server) -> float:
    text = requests.get(f"{server.base_url}/metrics", timeout=5).text
    return float(re.search(r"^fathom_requests_running (\S+)$", text, re.M).group(1))


def wait_idle(server, timeout=10.0):
    end = time.monotonic() + timeout
    while running_requests(server) > 0 and time.monotonic() < end:
        time.sleep(0.05)
    return running_requests(server) == 0


def test_non_streaming_request_is_cancelled_when_its_client_leaves(hardened):
    assert wait_idle(hardened), "streams whose clients left are still running"
    body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 4000, "ignore_eos": True}).encode()
    s = connect(hardened)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    end = time.monotonic() + 30
    while running_requests(hardened) < 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert running_requests(hardened) == 1
    s.close()
    t0 = time.monotonic()
    while running_requests(hardened) > 0 and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert running_requests(hardened) == 0, "the request kept generating after its client left"
    # The log line of a non-streaming ("whole") request that ended because its client left.
    assert re.search(r" whole .*client disconnected", hardened.stderr), hardened.stderr[-2000:]


def test_pipelined_requests_are_answered_in_order(hardened):
    with connect(hardened) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_until_closed(s)
    # /nope needs a key (auth comes before routing): 401, and the connection stays usable
    # because that request had no body.
    assert statuses(raw) == [200, 401, 200], raw


def test_expect_100_continue(hardened):
    body = json.dumps({"prompt": "hello"}).encode()
    with connect(hardened) as s:
        s.sendall((f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").encode())
        s.settimeout(5)
        interim = s.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        s.sendall(body)
        raw = read_until_closed(s)
    assert statuses(raw) == [200], raw


def test_http_1_0_gets_an_answer_and_a_close(hardened):
    with connect(hardened) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        raw = read_until_closed(s)
    assert raw.startswith(b"HTTP/1.0 200"), raw


def test_request_id_is_echoed_or_generated(hardened):
    r = requests.get(f"{hardened.base_url}/health", headers={"X-Request-Id": "trace-42.a_b"}, timeout=5)
    assert r.headers["X-Request-Id"] == "trace-42.a_b"
    for bad in ("bad id", "x" * 65, "<script>"):
        r = requests.get(f"{hardened.base_url}/health", headers={"X-Request-Id": bad}, timeout=5)
        assert re.fullmatch(r"req-[0-9a-f]{24}", r.headers["X-Request-Id"])


def test_connection_limit_answers_503(fathom_bin, smollm2_path, tmp_path):
    cfg = write_config(tmp_path, {"max_connections": 20})
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--config", cfg, "--grpc-port", "0"]) as server:
        socks = [connect(server) for _ in range(20)]
        try:
            time.sleep(0.2)
            with connect(server) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                raw = read_until_closed(extra)
            assert statuses(raw) == [503] and b"too_many_connections" in raw, raw
        finally:
            for s in socks:
                s.close()
        time.sleep(0.2)
        assert health_latency_ms(server) < 1000
        metrics = requests.get(f"{server.base_url}/metrics", timeout=5).text
        assert re.search(r"^fathom_http_connections_rejected_total [1-9]", metrics, re.M)
