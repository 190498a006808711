"""docker/ as shipped: the Dockerfiles pass hadolint, the Kubernetes manifests validate against
the Kubernetes 1.37 schemas (kubernetes-validate --strict), the Prometheus config and rules pass
promtool, and every metric the Grafana dashboard and the rules query exists on a running
server's /metrics with the type the query needs. (Building and running the CPU image is `make image`
and test_container_image.py: too slow for every `make test`.)"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent


def run(*cmd, cwd=ROOT):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_pass_hadolint(dockerfile):
    r = run(BIN / "hadolint", "--config", DOCKER / ".hadolint.yaml", DOCKER / dockerfile)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (DOCKER / dockerfile).read_text()
    for needed in ("USER 10001", "STOPSIGNAL SIGTERM", "HEALTHCHECK", "AS build"):
        assert needed in text, f"{dockerfile} lacks {needed}"


def test_kubernetes_manifests_validate():
    manifests = sorted((DOCKER / "k8s").glob("*.yaml"))
    assert {m.name for m in manifests} >= {"deployment.yaml", "deployment-cuda.yaml", "service.yaml", "pdb.yaml", "hpa.yaml"}
    r = run(BIN / "kubernetes-validate", "--strict", *manifests)
    assert r.returncode == 0, r.stdout + r.stderr
    cuda = yaml.safe_load((DOCKER / "k8s" / "deployment-cuda.yaml").read_text())
    container = cuda["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The grace period outlasts the drain (configs/container.json) plus preStop, and the probes
    # mean what they should: startup waits for the model, readiness drops while draining or
    # overloaded, liveness never fails for load.
    drain_s = json.loads((ROOT / "configs" / "container.json").read_text())["drain_timeout_ms"] / 1000
    for name in ("deployment.yaml", "deployment-cuda.yaml"):
        spec = yaml.safe_load((DOCKER / "k8s" / name).read_text())["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] > drain_s + 5, name
        c = spec["containers"][0]
        assert c["startupProbe"]["httpGet"]["path"] == "/health", name
        assert c["readinessProbe"]["httpGet"]["path"] == "/ready", name
        assert c["livenessProbe"]["httpGet"]["path"] == "/live", name


def test_extension_manifests_name_fathoms_metrics():
    pod_monitor = yaml.safe_load((DOCKER / "k8s" / "extensions" / "podmonitor.yaml").read_text())
    assert pod_monitor["kind"] == "PodMonitor" and pod_monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    pool = yaml.safe_load((DOCKER / "k8s" / "extensions" / "inferencepool.yaml").read_text())
    assert pool["kind"] == "InferencePool"


def test_prometheus_config_and_rules_pass_promtool():
    r = run("promtool", "check", "config", "prometheus.yml", cwd=DOCKER / "prometheus")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("promtool", "check", "rules", DOCKER / "prometheus" / "rules.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def queried_metrics():
    """Metric names (fathom_*) in the dashboard's and the rules' expressions, and whether each is
    read through _bucket (a histogram)."""
    exprs = []
    dash = json.loads((DOCKER / "grafana" / "dashboards" / "fathom.json").read_text())
    for p in dash["panels"]:
        exprs += [t["expr"] for t in p["targets"]]
    rules = yaml.safe_load((DOCKER / "prometheus" / "rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    # The autoscaler's metric, and the Inference Extension's endpoint-picker mapping.
    hpa = yaml.safe_load((DOCKER / "k8s" / "hpa.yaml").read_text())
    exprs += [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    exprs.append((DOCKER / "k8s" / "extensions" / "inferencepool.yaml").read_text())
    names = set()
    for e in exprs:
        names |= set(re.findall(r"\bfathom_[a-z0-9_]+", e))
    return names


def test_every_queried_metric_exists_with_its_type(server):
    types = {}
    for line in requests.get(f"{server.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
    names = queried_metrics()
    assert len(names) >= 12
    for name in sorted(names):
        if name.endswith("_bucket"):
            assert types.get(name[: -len("_bucket")]) == "histogram", name
        else:
            assert name in types, f"{name} is queried but not exported"
            if name.endswith("_total"):
                assert types[name] == "counter", name
            else:
                assert types[name] in ("gauge", "counter"), name
