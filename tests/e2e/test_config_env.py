"""FATHOM_* environment variables override config keys (containers set env, not files):
file < environment < flags, unknown keys inside a section are errors, other FATHOM_ variables
are left alone."""
import json
import subprocess
from pathlib import Path

import requests

from server_fixture import ServerProcess


def test_environment_overrides_the_file_and_flags_override_both(fathom_bin, smollm2_path, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"limits": {"max_n": 8}, "http": {"max_body_bytes": 65536}}))
    env = {"FATHOM_LIMITS__MAX_N": "2", "FATHOM_HTTP__MAX_BODY_BYTES": "2048", "FATHOM_SIMD": "whatever",
           "FATHOM_LIMITS__DEFAULT_MAX_TOKENS": "3"}
    with ServerProcess(fathom_bin, smollm2_path, env=env,
                       extra_args=["--config", str(cfg), "--grpc-port", "0", "--max-n", "3"]) as server:
        url = f"{server.base_url}/v1/completions"
        # --max-n 3 beats FATHOM_LIMITS__MAX_N=2, which beat the file's 8.
        assert requests.post(url, json={"prompt": "hi", "n": 3, "max_tokens": 1}, timeout=60).status_code == 200
        r = requests.post(url, json={"prompt": "hi", "n": 4, "max_tokens": 1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        # The environment's body limit beat the file's.
        r = requests.post(url, data=b'{"prompt": "' + b"a" * 4096 + b'"}', timeout=60,
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        r = requests.post(url, json={"prompt": "hi", "ignore_eos": True}, timeout=60)
        assert r.json()["usage"]["completion_tokens"] == 3


def test_a_misspelt_key_in_the_environment_stops_start_up(fathom_bin, smollm2_path):
    proc = subprocess.run([str(fathom_bin), "serve", "--model", str(smollm2_path), "--port", "0"],
                          env={"FATHOM_HTTP__PROT": "9000", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "http.prot" in proc.stderr, proc.stderr


def test_a_draft_ratio_out_of_range_stops_start_up(fathom_bin, smollm2_path):
    proc = subprocess.run([str(fathom_bin), "serve", "--model", str(smollm2_path), "--port", "0"],
                          env={"FATHOM_SPECULATIVE__DRAFT_KV_READ_RATIO": "0", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "speculative.draft_kv_read_ratio" in proc.stderr and "(0, 1]" in proc.stderr, proc.stderr


def test_json_logs_carry_the_request_id(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, env={"FATHOM_LOG_FORMAT": "json"},
                       extra_args=["--grpc-port", "0"]) as server:
        r = requests.post(f"{server.base_url}/v1/completions", headers={"X-Request-Id": "trace-7"},
                          json={"prompt": 'say "hi"\n', "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.headers["X-Request-Id"] == "trace-7"
    lines = [json.loads(line) for line in server.stderr.splitlines() if line.strip()]
    assert lines and all({"time", "level", "msg"} <= set(l) for l in lines)
    assert any("request_id=trace-7" in l["msg"] and l["level"] == "info" for l in lines), lines[-3:]


def test_the_shipped_config_serves_exact_attention(fathom_bin, smollm2_path):
    # configs/default.json (what `make serve` runs) names the same default attention as the
    # built-in one: dense (the model's exact output), with 1/4 for requests that ask for a sparse
    # policy without a ratio; an `auto` request measures ALISA's break-even on first use.
    root = Path(__file__).resolve().parents[2]
    shipped = json.loads((root / "configs" / "default.json").read_text())
    assert shipped["attention"] == {"policy": "dense", "kv_read_ratio": 0.25}
    with ServerProcess(fathom_bin, smollm2_path,
                       extra_args=["--config", str(root / "configs" / "default.json"), "--grpc-port", "0",
                                   "--threads", "1"]) as server:
        text = requests.get(f"{server.base_url}/metrics", timeout=30).text
        assert "fathom_attention_break_even_keys{" not in text, "nothing to measure for dense"
        r = requests.post(f"{server.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        body = {"prompt": "hi " * 300, "max_tokens": 2, "fathom": {"attention": "auto"}}
        r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        text = requests.get(f"{server.base_url}/metrics", timeout=30).text
        assert 'fathom_attention_break_even_keys{kv_read_ratio="0.25",policy="alisa"}' in text, text[:2000]
    assert "decodes sparse from" not in server.stderr, server.stderr
