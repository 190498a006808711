"""Shared fixtures for the end-to-end tests: repo root, build dir, the fathom binary, models.

Nothing here skips: a missing binary or model is a test failure ("build it first"), never a skip.
"""
import os
import sys
from types import SimpleNamespace
from pathlib import Path

# Before anything imports numpy: one OpenBLAS thread. The reference model's matrices are small,
# and on a shared 2-core machine OpenBLAS's spinning threads make them several times slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
# tests/reference/numpy_model.py is importable as `numpy_model`
sys.path.insert(0, str(REPO_ROOT / "tests" / "reference"))

MODEL_FILES = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir(repo_root) -> Path:
    """$FATHOM_BUILD (default "build"), relative to the repo root unless absolute."""
    return repo_root / os.environ.get("FATHOM_BUILD", "build")


@pytest.fixture(scope="session")
def fathom_bin(build_dir) -> Path:
    path = build_dir / "fathom"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"fathom binary not found at {path}: build it first (make build, or set "
                    f"FATHOM_BUILD to the build directory)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The numpy reference's results (test_reference_model.py), outside the checkout like
    xgrammar's build ($FATHOM_CACHE, default ~/.cache/fathom): keyed by the model file's sha256,
    the prompt ids and the reference's VERSION, so a new clone reuses them and a changed input
    never does. Computing them all costs ~2 minutes on 2 cores."""
    base = os.environ.get("FATHOM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fathom")
    d = Path(base) / "reference"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _model_path(name: str) -> Path:
    path = REPO_ROOT / "models" / MODEL_FILES[name]
    if not path.is_file():
        pytest.fail(f"model {path} missing: run make setup (scripts/setup.sh)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def model_paths() -> dict:
    """{"smollm2": Path, "gemma3": Path} of the two default models."""
    return {name: _model_path(name) for name in MODEL_FILES}


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model_path("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model_path("gemma3")


@pytest.fixture(scope="session")
def small_model_path() -> Path:
    """SmolLM2's tokenizer over a 5-layer random transformer (scripts/make_small_model.py): ~15x
    faster for tests of the engine's mechanics, whose texts still change with any wrong KV byte."""
    path = REPO_ROOT / "models" / "smollm2-vocab-small-random.gguf"
    if not path.is_file():
        pytest.fail(f"model {path} missing: run make setup (scripts/setup.sh)", pytrace=False)
    return path


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path):
    """A `fathom serve` on SmolLM2 per test module (modules needing other flags define their own)."""
    from server_fixture import ServerProcess
    with ServerProcess(fathom_bin, smollm2_path) as s:
        yield s
    assert s.returncode == 0, s.stderr


@pytest.fixture(scope="module")
def client(server):
    """The official OpenAI client pointed at `server`."""
    import openai
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    yield c
    c.close()  # idle keep-alive connections would hold up the server's shutdown


@pytest.fixture(scope="session")
def pb(tmp_path_factory, repo_root):
    """fathom.proto's Python messages (pb.msg) and stubs (pb.svc), generated from the tree's proto."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("fathom_proto")
    proto_dir = repo_root / "proto"
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                      str(proto_dir / "fathom.proto")])
    assert rc == 0, "grpc_tools.protoc failed on proto/fathom.proto"
    sys.path.insert(0, str(out))
    try:
        import fathom_pb2
        import fathom_pb2_grpc
    finally:
        sys.path.remove(str(out))
    return SimpleNamespace(msg=fathom_pb2, svc=fathom_pb2_grpc)
