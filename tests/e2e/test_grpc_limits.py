"""The gRPC port under the limits the HTTP port has (configs/README.md), with the official grpcio
client: a request over http.max_body_bytes is RESOURCE_EXHAUSTED, and calls past grpc.max_threads
are refused at once instead of starting a server thread each (without the bound, every open
Generate stream held a new thread, without limit). After either, the server serves as before.
"""
import json
import time

import grpc
import pytest

from server_fixture import ServerProcess

MAX_THREADS = 4  # the sync server keeps one thread waiting for calls: about 3 calls at once
BODY_LIMIT = 65536


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("grpc_limits") / "config.json"
    cfg.write_text(json.dumps({"grpc": {"max_threads": MAX_THREADS}, "http": {"max_body_bytes": BODY_LIMIT},
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
