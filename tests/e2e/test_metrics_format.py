"""/metrics of a running server: `promtool check metrics` accepts it, and the metric names that
are the contract between the engine, docs/operations.md and dashboards exist after one request.
"""
import json
import math
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from server_fixture import ServerProcess

MAX_TOKENS = 8

# name -> (type, required label values): every listed label value must have a series.
REQUIRED = {
    "fathom_requests_running": ("gauge", {}),
    "fathom_requests_waiting": ("gauge", {}),
    "fathom_request_finished_total": ("counter", {"reason": ["length"]}),
    "fathom_prompt_tokens_total": ("counter", {}),
    "fathom_generation_tokens_total": ("counter", {}),
    "fathom_time_to_first_token_seconds": ("histogram", {}),
    "fathom_inter_token_latency_seconds": ("histogram", {}),
    "fathom_e2e_request_latency_seconds": ("histogram", {}),
    "fathom_queue_time_seconds": ("histogram", {}),
    "fathom_kv_blocks_used": ("gauge", {"tier": ["device", "host"]}),
    "fathom_kv_usage_ratio": ("gauge", {"tier": ["device", "host"]}),
    "fathom_prefix_cache_queries_total": ("counter", {}),
    "fathom_prefix_cache_hits_total": ("counter", {}),
    "fathom_preemptions_total": ("counter", {"mode": ["recompute"]}),
    "fathom_recomputed_tokens_total": ("counter", {}),
    "fathom_kv_blocks_demoted_total": ("counter", {}),
    "fathom_kv_blocks_dropped_total": ("counter", {}),
    "fathom_kv_blocks_restored_total": ("counter", {}),
    "fathom_kv_dropped_tokens": ("gauge", {}),
    "fathom_kv_dropped_tokens_recomputed_total": ("counter", {}),
    "fathom_kv_recompute_seconds_per_token": ("gauge", {}),
    "fathom_kv_transfer_seconds_per_token": ("gauge", {}),
    "fathom_kv_hot_rows_total": ("counter", {"policy": ["hip", "alisa"], "result": ["hit", "miss"]}),
    "fathom_kv_hot_row_fallbacks_total": ("counter", {}),
    "fathom_swap_bytes_total": ("counter", {"direction": ["in", "out"]}),
    "fathom_expert_weight_bytes_total": ("counter", {}),
}

SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def unescape(value):
    return re.sub(r'\\(.)', lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse_exposition(text):
    """{family: {"type": str, "help": str, "samples": [(name, labels dict, value)]}}"""
    families = {}
    current = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            current = families.setdefault(name, {"type": None, "help": None, "samples": []})
            current["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, type_ = line[len("# TYPE "):].partition(" ")
            current = families.setdefault(name, {"type": None, "help": None, "samples": []})
            current["type"] = type_
        elif line.startswith("#"):
            continue
        else:
            m = SAMPLE_RE.match(line)
            assert m, f"unparseable sample line: {line!r}"
            labels = {k: unescape(v) for k, v in LABEL_RE.findall(m.group(3) or "")}
            assert current is not None, f"sample before any TYPE line: {line!r}"
            current["samples"].append((m.group(1), labels, float(m.group(4))))
    return families


@pytest.fixture(scope="module")
def server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path) as s:
        yield s


@pytest.fixture(scope="module")
def metrics_text(server):
    body = json.dumps({"prompt": "Hello, my name is", "max_tokens": MAX_TOKENS, "temperature": 0.0,
                       "fathom": {"ignore_eos": True}}).encode()
    req = urllib.request.Request(f"{server.base_url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        completion = json.loads(r.read())
    assert completion["usage"]["completion_tokens"] == MAX_TOKENS
    # The scheduler refreshes its gauges at the end of the step that streamed the last token,
    # which may be just after the response: give it a moment to settle.
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=60) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        if re.search(r"^fathom_requests_running 0$", text, re.M) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_promtool_accepts_metrics(metrics_text):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' (scripts/setup.sh does)",
                    pytrace=False)
    result = subprocess.run([promtool, "check", "metrics"], input=metrics_text, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"promtool check metrics:\n{result.stdout}{result.stderr}"
    assert result.stdout.strip() == "" and result.stderr.strip() == "", \
        f"promtool lint findings:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_required_metric_exists(metrics_text, name):
    families = parse_exposition(metrics_text)
    assert name in families, f"{name} missing from /metrics"
    type_, labels = REQUIRED[name]
    fam = families[name]
    assert fam["type"] == type_
    assert fam["help"], f"{name} has no help text"
    assert fam["samples"], f"{name} has no samples"
    for label, values in labels.items():
        present = {s[1].get(label) for s in fam["samples"]}
        for v in values:
            assert v in present, f'{name}{{{label}="{v}"}} missing (have {sorted(map(str, present))})'


def samples(families, name):
    return {tuple(sorted(labels.items())): value for n, labels, value in families[name]["samples"] if n == name}


def test_values_after_one_request(metrics_text):
    fams = parse_exposition(metrics_text)

    def hist_count(name):
        counts = [v for n, labels, v in fams[name]["samples"] if n == name + "_count"]
        assert len(counts) == 1
        return counts[0]

    assert samples(fams, "fathom_request_finished_total")[(("reason", "length"),)] >= 1
    assert samples(fams, "fathom_generation_tokens_total")[()] >= MAX_TOKENS
    assert samples(fams, "fathom_prompt_tokens_total")[()] >= 2
    assert samples(fams, "fathom_requests_running")[()] == 0
    assert samples(fams, "fathom_requests_waiting")[()] == 0
    for name in ("fathom_time_to_first_token_seconds", "fathom_e2e_request_latency_seconds",
                 "fathom_queue_time_seconds"):
        assert hist_count(name) >= 1, name
    assert hist_count("fathom_inter_token_latency_seconds") >= MAX_TOKENS - 1
    assert samples(fams, "fathom_prefix_cache_queries_total")[()] >= 1
    ratio = samples(fams, "fathom_kv_usage_ratio")
    assert all(0.0 <= v <= 1.0 for v in ratio.values()), ratio


def test_histograms_are_consistent(metrics_text):
    """Cumulative buckets never decrease, +Inf is last and equals _count, le parses as a float."""
    fams = parse_exposition(metrics_text)
    histograms = [name for name, fam in fams.items() if fam["type"] == "histogram"]
    assert histograms
    for name in histograms:
        series = {}
        for n, labels, value in fams[name]["samples"]:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            s = series.setdefault(key, {"buckets": [], "count": None, "sum": None})
            if n == name + "_bucket":
                s["buckets"].append((float(labels["le"]), value))
            elif n == name + "_count":
                s["count"] = value
            elif n == name + "_sum":
                s["sum"] = value
            else:
                pytest.fail(f"unexpected sample {n} in histogram {name}")
        for key, s in series.items():
            les = [le for le, _ in s["buckets"]]
            counts = [c for _, c in s["buckets"]]
            assert les == sorted(les) and math.isinf(les[-1]), (name, key, les)
            assert counts == sorted(counts), (name, key, counts)
            assert s["count"] == counts[-1], (name, key)
            assert s["sum"] is not None and s["sum"] >= 0, (name, key)
