"""The CPU image as shipped (fathom:cpu, built by `make image`), run with podman as Kubernetes runs it
(docker/k8s/deployment.yaml): the default model mounted read-only at /models, the root file system
read-only with no writable tmpfs, the image's own user, entrypoint, config and STOPSIGNAL.
Checked: /health and the image's HEALTHCHECK, the process's uid, that nothing in the image is
writable, one chat completion through the official `openai` client, /metrics, and `podman stop`
draining a running stream (it finishes, new requests get 503) before the container exits 0.

Runs under `make image-test`, not in `make test` (hence its own folder, outside tests/e2e): the image
is rebuilt only by `make image` (~25 min), so in `make test` this would check an image older than the
tree, for 12-15 s of its time budget. Skips, with the reason, when podman is not installed, the image is not
built or podman cannot run containers on this machine (scripts/podman_flags.sh says why)."""
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import openai
import pytest
import requests

IMAGE = os.environ.get("FATHOM_IMAGE", "fathom:cpu")
MODEL_FILE = "smollm2-135m-instruct-q4_1.gguf"  # configs/container.json's model
MODEL_NAME = "smollm2-135m-instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]
UID = 10001  # docker/Dockerfile.cpu's USER, the k8s manifest's runAsUser


def podman(*args, timeout=60, check=True):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stderr}"
    return r


@pytest.fixture(scope="module")
def container():
    """The running container: {"name", "url"}; removed afterwards whatever happened."""
    if shutil.which("podman") is None:
        pytest.skip("podman not installed: `make image` installs it and builds the image")
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.skip(f"image {IMAGE} not built: run make image (~25 min on 2 cores)")
    probe = subprocess.run([REPO_ROOT / "scripts" / "podman_flags.sh", IMAGE], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run containers on this machine: {probe.stderr.strip()}")
    # The mount takes the file a models/ symlink points at: podman would mount the link itself.
    model = (REPO_ROOT / "models" / MODEL_FILE).resolve()
    if not model.is_file():
        pytest.fail(f"model {model} missing: run make setup", pytrace=False)
    name = f"fathom-smoke-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *probe.stdout.split(),
           "--read-only", "--read-only-tmpfs=false",  # readOnlyRootFilesystem, no emptyDir
           "-p", "127.0.0.1::8080", "-v", f"{model}:/models/{MODEL_FILE}:ro", IMAGE)
    try:
        host_port = podman("port", name, "8080").stdout.strip().rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{host_port}"
        deadline = time.monotonic() + 60
        while True:
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", f"container {state}: {podman('logs', name).stderr[-2000:]}"
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"no /health 200 in 60 s: {podman('logs', name).stderr[-2000:]}"
            time.sleep(0.2)
        yield {"name": name, "url": url}
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_health_user_and_read_only_root(container):
    name, url = container["name"], container["url"]
    health = requests.get(f"{url}/health", timeout=5)
    assert health.status_code == 200 and "ready" in health.text, health.text
    assert requests.get(f"{url}/ready", timeout=5).status_code == 200
    # The image's HEALTHCHECK command, run inside the container (it needs a tool the slim image has;
    # podman runs it on demand here: its timers need systemd). It fails while draining (below).
    r = podman("healthcheck", "run", name, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert podman("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip() == "healthy"
    # PID 1 is the server itself (no shell in between: it gets the SIGTERM), as uid 10001.
    status = podman("exec", name, "cat", "/proc/1/status").stdout
    assert "Name:\tfathom" in status
    uids = next(l for l in status.splitlines() if l.startswith("Uid:")).split()[1:]
    assert uids == [str(UID)] * 4, status
    assert podman("exec", name, "id", "-u").stdout.strip() == str(UID)
    # Nothing is writable: not the image, not /tmp, not the model mount (even for root).
    for path in ("/app/x", "/tmp/x", "/models/x"):
        r = podman("exec", "--user", "0", name, "touch", path, check=False)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, (path, r.stderr)


def test_chat_completion_with_the_openai_client_and_metrics(container):
    client = openai.OpenAI(base_url=f"{container['url']}/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    chat = client.chat.completions.create(model=MODEL_NAME, max_tokens=8, temperature=0,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.choices[0].message.content.strip()
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert 0 < chat.usage.completion_tokens <= 8
    metrics = requests.get(f"{container['url']}/metrics", timeout=5)
    assert metrics.status_code == 200 and "text/plain" in metrics.headers["Content-Type"]
    lines = metrics.text.splitlines()
    assert any(l.startswith("fathom_build_info{") and f'model="{MODEL_NAME}"' in l for l in lines)
    finished = sum(float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("fathom_request_finished_total{"))
    assert finished >= 1


def test_podman_stop_drains_a_running_stream_and_exits_0(container):
    name, url = container["name"], container["url"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    # 320 tokens: ~1.2 s at SmolLM2's ~280 tok/s on 2 cores, twice what the checks made while it
    # drains need (podman stop, /health, a refused request, a healthcheck exec).
    stream = client.chat.completions.create(model=MODEL_NAME, max_tokens=320, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Count from one to fifty."}],
                                            extra_body={"fathom": {"ignore_eos": True}})
    chunks = iter(stream)
    first = next(chunks)
    # `podman stop` sends the image's STOPSIGNAL (SIGTERM) and kills only after 30 s.
    assert podman("inspect", "--format", "{{.Config.StopSignal}}", name).stdout.strip() in ("15", "SIGTERM")
    stop = subprocess.Popen(["podman", "stop", "-t", "30", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while requests.get(f"{url}/health", timeout=5).status_code == 200:
            assert time.monotonic() < deadline, "still healthy 10 s after SIGTERM"
            time.sleep(0.05)
        late = requests.post(f"{url}/v1/chat/completions", timeout=10,
                             json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert late.status_code == 503, late.text
        hc = podman("healthcheck", "run", name, check=False)  # the stream still runs: not healthy
        assert hc.returncode != 0, hc.stdout + hc.stderr
        rest = list(chunks)
        text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
        assert rest[-1].choices[0].finish_reason == "length", rest[-1]
        assert len(rest) >= 300 and text.strip()  # ~1 chunk per token: the stream was not cut
        assert stop.wait(40) == 0, stop.stderr.read()
    finally:
        if stop.poll() is None:
            stop.kill()
    # Exit code 0: the server drained and returned (a kill after the 30 s would leave 137).
    state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.split()
    assert state == ["exited", "0"], podman("logs", name).stderr[-2000:]
