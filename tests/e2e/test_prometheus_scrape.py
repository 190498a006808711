"""A real Prometheus (Debian's `prometheus`) scrapes a running fathom with the shipped rules,
and its HTTP API answers for fathom's series, a histogram_quantile over TTFT and a recording rule
(docker/prometheus/rules.yml) — what the Grafana dashboard and the alerts will ask it."""
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prom, expr):
    r = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(prom, expr, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = query(prom, expr)
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"Prometheus has no result for {expr} after {timeout} s")


def test_prometheus_scrapes_fathom_and_answers_queries(server, tmp_path):
    assert shutil.which("prometheus"), "Debian's prometheus is not installed: run make setup"
    rules = (ROOT / "docker" / "prometheus" / "rules.yml").read_text()
    (tmp_path / "rules.yml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
scrape_configs:
  - job_name: fathom
    static_configs:
      - targets: ["127.0.0.1:{server.port}"]
""")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    prom = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{prom}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < end and proc.poll() is None, "prometheus did not start"
            time.sleep(0.2)
        up = wait_for(prom, 'up{job="fathom"} == 1')
        assert up[0]["value"][1] == "1"
        for i in range(6):  # traffic for the histograms, spread over a few scrapes
            r = requests.post(f"{server.base_url}/v1/completions", json={"prompt": f"Count to {i}", "max_tokens": 4},
                              timeout=60)
            assert r.status_code == 200
            time.sleep(0.4)
        build = wait_for(prom, "fathom_build_info")
        assert build[0]["metric"]["backend"] == "cpu"
        p95 = wait_for(prom, "histogram_quantile(0.95, sum by (le) (rate(fathom_time_to_first_token_seconds_bucket[1m]))) > 0")
        assert 0 < float(p95[0]["value"][1]) < 60
        recorded = wait_for(prom, "fathom:time_to_first_token_seconds:p95_5m")
        assert float(recorded[0]["value"][1]) > 0
        tokens = wait_for(prom, "fathom_generation_tokens_total > 0")
        assert float(tokens[0]["value"][1]) >= 6
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
