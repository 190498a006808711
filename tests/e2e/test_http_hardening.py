"""The HTTP front end under hostile and careless clients (issue 17's findings), over raw sockets.

Each test states the attack, then what must hold: an early answer never leaves a body on the
connection to be parsed as a second request (smuggling), framing fathom cannot trust
(Transfer-Encoding it does not decode, with Content-Length, obs-fold) is refused with
`Connection: close` and nothing behind it is answered, a client still writing its body reads the
early answer (lingering close, bounded in time and bytes), chunked bodies obey the body limit,
slow or idle connections cannot take /health down, the connection limit answers 503, a
non-streaming request whose client left is cancelled, and the ordinary HTTP/1.1 features
(pipelining, Expect: 100-continue, HTTP/1.0) still work.
"""
import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import requests

from server_fixture import ServerProcess

KEY = "sk-hardening"
STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def connect(server, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_to_close(s, timeout=5.0):
    """(everything the server sent, whether it closed its side) once it closes or `timeout` passes."""
    s.settimeout(timeout)
    out = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return out, False
        except ConnectionResetError:
            return out, True
        if not chunk:
            return out, True
        out += chunk
    return out, False


def read_until_closed(s, timeout=5.0) -> bytes:
    """Everything the server sends until it closes the connection (or `timeout` passes)."""
    return read_to_close(s, timeout)[0]


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


def slowest_health_ms(server, calls=20, rounds=3, load=contextlib.nullcontext) -> list:
    """The sorted latencies of the best of up to `rounds` rounds of `calls` GET /health, each round
    inside a fresh `load()` context: the first round whose slowest call is under 100 ms, else the
    one with the lowest slowest. A server that is slow under the load fails every round; a test
    process the other pytest worker starved for a moment, one."""
    best = None
    for _ in range(rounds):
        with load():
            latencies = sorted(health_latency_ms(server) for _ in range(calls))
        if best is None or latencies[-1] < best[-1]:
            best = latencies
        if best[-1] < 100:
            break
    return best


def write_config(tmp_path, http: dict) -> str:
    path = tmp_path / "hardening.json"
    path.write_text(json.dumps({"http": http, "scheduler": {"max_num_seqs": 2, "max_queue": 4}}))
    return str(path)


@pytest.fixture(scope="module")
def hardened(fathom_bin, smollm2_path, tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("cfg"),
                       {"max_body_bytes": 4096, "header_timeout_ms": 1000, "body_timeout_ms": 1500,
                        "idle_timeout_ms": 1500, "max_connections": 1200, "cors_origins": [ORIGIN]})
    with ServerProcess(fathom_bin, smollm2_path,
                       extra_args=["--config", cfg, "--api-key", KEY, "--grpc-port", "0"]) as server:
        yield server


ORIGIN = "https://app.example:8443"


def preflight(base_url, origin, path="/v1/chat/completions"):
    return requests.options(base_url + path, timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_preflight_and_responses_for_an_allowed_origin(hardened):
    """A browser page on ORIGIN (http.cors_origins) may call the server with its key: the preflight
    is answered without one, and responses, errors included, carry its origin; never credentials."""
    p = preflight(hardened.base_url, ORIGIN)
    assert p.status_code == 200, p.text
    assert p.headers["Access-Control-Allow-Origin"] == ORIGIN and "Origin" in p.headers["Vary"]
    assert "POST" in p.headers["Access-Control-Allow-Methods"]
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in p.headers["Access-Control-Allow-Headers"].split(",")}
    assert "Access-Control-Allow-Credentials" not in p.headers
    auth = {"Authorization": f"Bearer {KEY}", "Origin": ORIGIN}
    r = requests.get(hardened.base_url + "/v1/models", headers=auth, timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
    r = requests.get(hardened.base_url + "/v1/models", headers={"Origin": ORIGIN}, timeout=10)
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == ORIGIN  # the page can read why


def test_cors_refuses_other_origins(hardened):
    p = preflight(hardened.base_url, "https://evil.example")
    assert p.status_code == 403 and "Access-Control-Allow-Origin" not in p.headers
    r = requests.get(hardened.base_url + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


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


# Pipelined behind a request whose body's end is in doubt: whatever fathom answers, it must
# never answer this one, since a proxy may have framed it as part of a body (request smuggling).
SMUGGLED = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def send_framed(server, fields: str, request_line="POST /tokenize HTTP/1.1"):
    """A request with these framing fields, the chunked body "0\\r\\n\\r\\n" (5 bytes, so also a
    Content-Length: 5 body) and SMUGGLED behind it; returns (all the server sent, closed)."""
    head = f"{request_line}\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{fields}\r\n".encode()
    with connect(server) as s:
        s.sendall(head + b"0\r\n\r\n" + SMUGGLED)
        return read_to_close(s)


def assert_refused_and_closed(raw: bytes, closed: bool, status: int):
    assert statuses(raw) == [status], raw[:300]  # one answer: SMUGGLED never runs
    assert b"Connection: close" in raw, raw[:300]
    assert closed, "the server kept the connection open after a framing error"


@pytest.mark.parametrize("headers", [
    "Content-Length: 5\r\nContent-Length: 6\r\n",                     # conflicting lengths
    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",             # CL.TE desync
    "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",             # TE.CL desync
    "Transfer-Encoding: identity\r\nContent-Length: 5\r\n",            # CL with a TE that is not chunked
    "Transfer-Encoding: gzip, chunked\r\nTransfer-Encoding: chunked\r\n",
    "Content-Length: -5\r\n",
    "Content-Length: 5x\r\n",
])
def test_ambiguous_framing_is_refused(hardened, headers):
    raw, closed = send_framed(hardened, headers)
    assert_refused_and_closed(raw, closed, 400)


@pytest.mark.parametrize("headers,status", [
    # chunked not the final coding: the length cannot be known (RFC 9112 §6.3), 400
    ("Transfer-Encoding: chunked, identity\r\n", 400),
    ("Transfer-Encoding: CHUNKED ,\tIdentity\r\n", 400),
    ("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", 400),  # lines form one list
    ("Transfer-Encoding: identity\r\n", 400),
    ("Transfer-Encoding: xchunked\r\n", 400),
    ("Transfer-Encoding: chunked, chunked\r\n", 400),
    # chunked last, but after a coding fathom does not decode (RFC 9112 §6.1), 501
    ("Transfer-Encoding: gzip, chunked\r\n", 501),
    ("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501),
    ("Transfer-Encoding: Deflate ,chunked\r\n", 501),
])
def test_transfer_codings_fathom_cannot_frame_are_refused_and_close(hardened, headers, status):
    raw, closed = send_framed(hardened, headers)
    assert_refused_and_closed(raw, closed, status)


def test_transfer_encoding_in_http_1_0_is_refused_and_closes(hardened):
    # RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
    raw, closed = send_framed(hardened, "Transfer-Encoding: chunked\r\n", request_line="POST /tokenize HTTP/1.0")
    assert_refused_and_closed(raw, closed, 400)


@pytest.mark.parametrize("fold", [" more", "\tmore", " Transfer-Encoding: chunked"])
def test_obsolete_line_folding_is_refused_and_closes(hardened, fold):
    # Beast would join the folded line to X-Note; a proxy may read it as a field of its own.
    raw, closed = send_framed(hardened, f"X-Note: a\r\n{fold}\r\nContent-Length: 5\r\n")
    assert_refused_and_closed(raw, closed, 400)
    assert b"obsolete line folding" in raw


@pytest.mark.parametrize("coding", ["Chunked", " chunked ", ", chunked", "chunked,"])
def test_chunked_alone_in_any_spelling_is_read_and_keeps_the_connection(hardened, coding):
    body = json.dumps({"prompt": "hello"}).encode()
    with connect(hardened) as s:
        s.sendall((f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Transfer-Encoding:{coding}\r\n\r\n{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
                  + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_until_closed(s)
    assert statuses(raw) == [200, 200], raw[:300]


@pytest.mark.parametrize("authorized,chunked,status,code", [
    (True, False, 413, "request_too_large"),   # refused from its Content-Length, before the body
    (True, True, 413, "request_too_large"),    # cut at the limit, mid-body
    (False, True, 401, "invalid_api_key"),     # refused from its head, body unread
    (False, False, 401, "invalid_api_key"),    # the key before the Content-Length: not even the limit leaks
])
def test_client_that_writes_a_whole_oversized_body_reads_the_answer(hardened, authorized, chunked, status, code):
    # max_body_bytes is 4096. urllib writes the whole body before it reads: the server answers
    # early and must keep reading and dropping the body so that the client's write completes.
    # 8 MiB is more than loopback's socket buffers held here, and more than the 1 MiB the
    # lingering close used to read, where urllib got a broken pipe instead of the answer.
    body = b" " * (8 << 20)
    headers = {"Content-Type": "application/json"}
    if authorized:
        headers["Authorization"] = f"Bearer {KEY}"
    # A write the other pytest worker stalls past the server's 1.5 s linger bound is cut with a
    # reset: it gets one more try. A server that does not answer early fails both.
    for attempt in range(2):
        data = iter([body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)]) if chunked else body
        req = urllib.request.Request(f"{hardened.base_url}/v1/completions", data=data, headers=headers)
        try:
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=10)
            break
        except (ConnectionResetError, BrokenPipeError, urllib.error.URLError):
            if attempt == 1:
                raise
    assert err.value.code == status
    assert err.value.headers["Connection"] == "close"
    assert json.loads(err.value.read())["error"]["code"] == code


# An authorized request head announcing a 1 GiB body: answered 413 from its Content-Length.
OVERSIZED_HEAD = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Length: {1 << 30}\r\n\r\n").encode()


def test_lingering_close_is_bounded_in_time(hardened):
    # After its 413 the server half-closes and drops what a client still sends, but only for
    # min(2 s, body_timeout_ms = 1500 ms): a client that trickles on is then cut off.
    with connect(hardened) as s:
        # Timed from the head: the server's bound cannot start earlier, and a test process starved
        # after the 413 still measures the bound, not its own stall.
        t0 = time.monotonic()
        s.sendall(OVERSIZED_HEAD)
        raw, closed = read_to_close(s)
        assert statuses(raw) == [413] and closed, raw[:300]
        cut = None
        while time.monotonic() - t0 < 6:
            try:
                s.sendall(b" " * 1024)
            except (BrokenPipeError, ConnectionResetError):
                cut = time.monotonic() - t0
                break
            time.sleep(0.05)
    assert cut is not None, "a lingering connection outlived its bound"
    print(f"lingering connection cut {cut * 1e3:.0f} ms after the request's head")
    assert 0.5 < cut < 4.0, cut


def flood_after_413(server):
    """(bytes sent, seconds) of a client that floods after its 413 until the server cuts it."""
    chunk = b" " * (1 << 20)
    sent = 0
    with connect(server) as s:
        s.sendall(OVERSIZED_HEAD)
        t0 = time.monotonic()
        try:
            while sent < (1 << 30):
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent, time.monotonic() - t0


def test_lingering_close_is_bounded_in_bytes(hardened):
    # A client that floods after its 413 is cut off once the server has dropped 64 MiB, well
    # before the time bound (1.5 s). A flood the other pytest worker starved for that long meets
    # the time bound first, so it gets a second try; a server without the byte bound fails both.
    for attempt in range(2):
        sent, elapsed = flood_after_413(hardened)
        print(f"flood cut after {sent >> 20} MiB sent in {elapsed * 1e3:.0f} ms")
        if 64 <= sent >> 20 < 256 and elapsed < 1.5:
            break
    assert 64 <= sent >> 20 < 256, sent
    assert elapsed < 1.5, elapsed


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
    @contextlib.contextmanager
    def thousand_connections():  # opened afresh for each round: the header deadline cuts them in 1 s
        socks = []
        try:
            for i in range(1000):
                s = connect(hardened, timeout=5)
                if i % 2:  # half send a partial request line, half send nothing
                    s.sendall(b"GET /health HTT")
                socks.append(s)
            yield
        finally:
            for s in socks:
                s.close()
            deadline = time.monotonic() + 10  # until the server has let them go (max_connections 1200)
            while open_connections(hardened) > 100 and time.monotonic() < deadline:
                time.sleep(0.05)

    latencies = slowest_health_ms(hardened, load=thousand_connections)
    print(f"/health with 1000 slow connections: median {latencies[10]:.1f} ms, max {latencies[-1]:.1f} ms")
    assert latencies[-1] < 100, latencies


def test_health_answers_fast_while_every_slot_generates(hardened):
    # max_num_seqs is 2: two long streams take every slot (4,000 tokens: still running after the
    # health calls however slowly they go; they are cut when `stop` is set).
    stop = threading.Event()
    started = threading.Barrier(3)

    def stream():
        with requests.post(f"{hardened.base_url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                           json={"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
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
        latencies = slowest_health_ms(hardened)
        running = requests.get(f"{hardened.base_url}/metrics", timeout=5).text
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert re.search(r"^fathom_requests_running 2(\.0)?$", running, re.M), "both slots should be generating"
    print(f"/health while every slot generates: median {latencies[10]:.1f} ms, max {latencies[-1]:.1f} ms")
    assert latencies[-1] < 100, latencies


def open_connections(server) -> float:
    text = requests.get(f"{server.base_url}/metrics", timeout=5).text
    return float(re.search(r"^fathom_http_open_connections (\S+)$", text, re.M).group(1))


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
