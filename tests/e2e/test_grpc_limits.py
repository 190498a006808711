"""The gRPC port under the limits the HTTP port has (configs/README.md), with the official grpcio
client: a request over http.max_body_bytes is RESOURCE_EXHAUSTED, and calls past grpc.max_threads
are refused at once instead of starting a server thread each (without the bound, every open
Generate stream held a new thread, without limit). A raw HTTP/2 client (h2) that stops reading is
cut after http.write_timeout_ms, as over HTTP. After each, the server serves as before.
"""
import json
import socket
import time

import grpc
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import StreamEnded, StreamReset, TrailersReceived
from h2.settings import SettingCodes

from server_fixture import ServerProcess

MAX_THREADS = 4  # the sync server keeps one thread waiting for calls: about 3 calls at once
BODY_LIMIT = 65536
WRITE_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("grpc_limits") / "config.json"
    cfg.write_text(json.dumps({"grpc": {"max_threads": MAX_THREADS}, "http": {"max_body_bytes": BODY_LIMIT, "write_timeout_ms": WRITE_TIMEOUT_MS},
                               "scheduler": {"max_num_seqs": 8, "max_queue": 8}}))
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--config", str(cfg), "--grpc-port", "-1"]) as s:
        yield s


@pytest.fixture(scope="module")
def stub(pb, server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    grpc.channel_ready_future(ch).result(timeout=30)
    yield pb.svc.FathomStub(ch)
    ch.close()


def tokenize(stub, pb):
    return list(stub.Tokenize(pb.msg.TokenizeRequest(text="hello"), timeout=10).token_ids)


def serves_again(stub, pb, deadline_s=30):
    """True once a Tokenize call succeeds within the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            return len(tokenize(stub, pb)) > 0
        except grpc.RpcError:
            time.sleep(0.2)
    return False


def test_a_message_over_the_body_limit_is_resource_exhausted(stub, pb):
    with pytest.raises(grpc.RpcError) as e:
        next(stub.Generate(pb.msg.GenerateRequest(text="x" * (2 * BODY_LIMIT), max_tokens=1), timeout=30))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert str(BODY_LIMIT) in e.value.details()
    assert tokenize(stub, pb), "the server serves after refusing it"


def test_calls_past_max_threads_are_refused_at_once(stub, pb, server):
    # Each long Generate stream holds a server thread for its life. Separate channels, as
    # separate clients would open them.
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(2 * MAX_THREADS)]
    streams = [pb.svc.FathomStub(ch).Generate(pb.msg.GenerateRequest(text="Once upon a time", max_tokens=4000,
                                                                     ignore_eos=True), timeout=300)
               for ch in channels]
    try:
        running, refused = 0, 0
        for s in streams:
            try:
                next(s)
                running += 1
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                refused += 1
        assert 1 <= running < MAX_THREADS, (running, refused)
        assert refused == len(streams) - running
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            tokenize(stub, pb)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        assert time.monotonic() - t0 < 2, "refused at once, not parked"
    finally:
        for s in streams:
            s.cancel()
        for ch in channels:
            ch.close()
    assert serves_again(stub, pb), "the threads come back once the streams end"


def stalled_call(server, path, body):
    """A raw HTTP/2 call (h2) whose client grants the stream a 1-byte window and never opens it
    further: the server's send of the answer blocks. (The socket is read, so HTTP/2 settings and
    pings are answered, but no WINDOW_UPDATE is ever sent.)"""
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=30)
    conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1})
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", path),
                          (":authority", f"127.0.0.1:{server.grpc_port}"), ("content-type", "application/grpc"),
                          ("te", "trailers")])
    conn.send_data(1, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
    sock.sendall(conn.data_to_send())
    return sock, conn


def seconds_until_ended(sock, conn, limit=30):
    """(seconds until the server ended the stalled stream or None, its grpc-status)."""
    t0 = time.monotonic()
    status = None
    sock.settimeout(0.5)
    try:
        while time.monotonic() - t0 < limit:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                return time.monotonic() - t0, status
            for ev in conn.receive_data(data):
                if isinstance(ev, TrailersReceived):
                    status = dict(ev.headers).get("grpc-status")
                if isinstance(ev, (StreamEnded, StreamReset)):
                    return time.monotonic() - t0, status
            sock.sendall(conn.data_to_send())  # settings and ping acks; never a window update
        return None, status
    finally:
        sock.close()


def test_a_generate_that_stops_reading_is_cut_after_the_write_timeout(pb, server, stub):
    """Without the write watch, the call (and its thread) waited for as long as the client held the
    connection."""
    body = pb.msg.GenerateRequest(text="Once upon a time", max_tokens=4000, ignore_eos=True).SerializeToString()
    ended, status = seconds_until_ended(*stalled_call(server, "/fathom.v1.Fathom/Generate", body))
    assert ended is not None, "the stalled call was still open after 30 s"
    assert ended >= WRITE_TIMEOUT_MS / 1000 * 0.9, f"cut after {ended:.2f} s, before the write timeout"
    assert status != "0", "the call did not end as a success"
    assert serves_again(stub, pb)


def test_unary_answers_to_clients_that_stop_reading_do_not_hold_the_threads(pb, server, stub):
    """A unary answer is sent after the handler returns, on its thread: as many stalled Tokenize
    calls as there are threads took the gRPC port down until their clients left. They are cut
    after the write timeout and the port serves again."""
    body = pb.msg.TokenizeRequest(text="hello world " * 50).SerializeToString()
    calls = [stalled_call(server, "/fathom.v1.Fathom/Tokenize", body) for _ in range(MAX_THREADS)]
    ends = [seconds_until_ended(sock, conn)[0] for sock, conn in calls]
    assert all(e is not None for e in ends), ends
    assert serves_again(stub, pb, deadline_s=5)
