#!/usr/bin/env python3
"""`make bench`: runs the benchmarks that make built and rewrites two tables: bench/results/decode.md
(every figure) and bench/results/decode_summary.md (the short table docs/performance.md shows). The
JSON they are made from goes to bench/results/raw/, which git ignores.

Runs bench_bandwidth (1 and 2 threads), then bench_decode for each model at each depth, one
process per (model, precision, depth) so that a time budget can skip the most expensive cells:
before a depth runs, its cost is estimated from the previous depth of the same model (prefill
FLOPs over the GFLOP/s achieved there, decode bytes over the decode speed there); a depth whose
estimate would overrun --budget-minutes is skipped and listed as skipped. Depth 0 always runs.

While each benchmark runs, the CPU time used by *other* processes is measured (/proc/stat busy
time minus the benchmark's own CPU time, per second of wall time) and reported next to its
numbers: anything well above 0 means the figures were disturbed.

Builds nothing. FATHOM_BUILD names the build directory (default: build).
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "smollm2": {
        "path": "models/smollm2-135m-instruct-q4_1.gguf",
        "title": "SmolLM2-135M-Instruct (Q4_1)",
        "depths": [0, 1024, 4096],
    },
    "gemma3": {
        "path": "models/gemma-3-270m-q4_k_m.gguf",
        "title": "Gemma 3 270M (Q4_K_M)",
        "depths": [0, 1024, 4096, 16384],
        # The 16k prefill runs once (on the most threads) and its KV cache is copied to the other
        # thread count: a single-thread 16k prefill alone would take a good part of the budget.
        "share_prefill_from": 16384,
    },
}
# Real model shapes on random weights (scripts/bench_models.py writes them into the model cache on
# first use; never git), run only when --models names them: `make bench BENCH_ARGS="--models
# llama-3.2-1b,llama-3.1-8b --threads 2"`. No f32 comparison run (minutes at these sizes).
BENCH_MODELS = Path(os.environ.get("FATHOM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                    / "fathom") / "bench-models"
REAL_SHAPES = {
    "llama-3.2-1b": ("Llama-3.2-1B shape (Q4_K_M, random weights)", [0, 4096]),
    "llama-3.1-8b": ("Llama-3.1-8B shape (Q4_K_M, random weights)", [0, 4096]),
    "qwen3-4b": ("Qwen3-4B shape (Q4_K_M, random weights)", [0, 4096]),
    "qwen3-30b-a3b": ("Qwen3-30B-A3B shape, 128 experts (Q4_K_M, random weights)", [0, 4096]),
}
DEFAULT_MODELS = list(MODELS)
for _shape, (_title, _depths) in REAL_SHAPES.items():
    MODELS[_shape] = {"path": str(BENCH_MODELS / f"{_shape}-q4_k_m.gguf"), "title": _title, "depths": _depths,
                      "bench_models_shape": _shape, "compare": False}
COMPARE_PRECISION = "f32"  # also run at depth 0 with this matmul precision, for comparison
KV_DTYPE = "f16"
PRECISION = "q8"


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- machine and disturbance


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def simd_level():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if "avx512f" in flags:
        extra = [f.upper().replace("AVX512", "") for f in ("avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
                 if f in flags]
        return "AVX-512 (F" + "".join(", " + e.strip("_") for e in extra) + ")"
    if "avx2" in flags:
        return "AVX2" + (" + FMA" if "fma" in flags else "")
    return "no AVX2"


def mem_total_gib():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def git(*args):
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return ""


def busy_cpu_seconds():
    """CPU-seconds all CPUs spent not idle since boot (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd):
    """Runs cmd, echoing its output; returns (returncode, stdout, wall seconds, other-process CPUs)."""
    log("$ " + shlex.join(cmd))
    busy0, own0, t0 = busy_cpu_seconds(), children_cpu_seconds(), time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:
        print("  " + line, end="", flush=True)
        out.append(line)
    rc = proc.wait()
    wall = time.monotonic() - t0
    others = max(0.0, (busy_cpu_seconds() - busy0) - (children_cpu_seconds() - own0)) / max(wall, 1e-9)
    log(f"  [{wall:.1f} s; other processes busy on {others:.2f} CPUs on average]")
    return rc, "".join(out), wall, others


# ---------------------------------------------------------------- cost estimates (mirror bench_decode.cpp)


def prefill_flops(j, depth):
    c = j["config"]
    attn = 0
    for w in c["layer_windows"]:
        full = min(depth, w) if w > 0 else depth
        attn += full * (full + 1) / 2 + (depth - full) * (w if w > 0 else 0)
    return 2 * j["weights"]["layer_matrix_params"] * depth + 4 * c["n_heads"] * c["head_dim"] * attn + 2 * c["vocab"] * c["dim"]


def kv_bytes(j, depth):
    c = j["config"]
    elem = 2 if j["options"]["kv_dtype"] == "f16" else 4
    return sum(min(depth + 1, w) if w > 0 else depth + 1 for w in c["layer_windows"]) * c["n_kv_heads"] * c["head_dim"] * 2 * elem


def estimate_seconds(j, depth, shared):
    """Seconds bench_decode will need for `depth`, from the deepest cells measured so far.
    `shared`: the prefill runs only on the largest thread count."""
    cells = j["cells"]
    last = max(c["depth"] for c in cells)
    seconds = 0.0
    steps = j["options"]["decode_tokens"] + j["options"]["warmup_tokens"]
    prefilling = max(c["threads"] for c in cells)
    for c in (c for c in cells if c["depth"] == last):
        if c["prefill_gflops"] and (not shared or c["threads"] == prefilling):
            seconds += prefill_flops(j, depth) / (c["prefill_gflops"] * 1e9)
        bytes_now = j["weights"]["matrix_bytes"] + kv_bytes(j, depth)
        seconds += steps * c["decode_ms_median"] / 1e3 * bytes_now / c["bytes_per_token"]
    return seconds * 1.6 + 5  # slack: attention-heavy deep prefill runs at fewer GFLOP/s; model loading


# ---------------------------------------------------------------- report


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def prefill_label(c):
    if c["prefill_tok_s"] is None and c.get("prefill_shared_from_threads"):
        return f"(shared from {c['prefill_shared_from_threads']}t)"
    return fmt(c["prefill_tok_s"], ".0f")


def decode_table(cells, with_precision=False):
    head = ["threads", "depth", "prefill tok/s", "prefill GFLOP/s", "decode tok/s", "bytes/token (MB)", "bound tok/s",
            "fraction of bound", "other load (CPUs)"]
    if with_precision:
        head.insert(0, "precision")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        pf = prefill_label(c)
        cols = [str(c["threads"]), str(c["depth"]), pf, fmt(c["prefill_gflops"], ".1f"), f"{c['decode_tok_s']:.1f}",
                f"{c['bytes_per_token'] / 1e6:.1f}", fmt(c["bound_tok_s"], ".0f"),
                fmt(None if c["fraction_of_bound"] is None else 100 * c["fraction_of_bound"], ".0f") + "%",
                f"{c['other_cpus']:.2f}"]
        if with_precision:
            cols.insert(0, c["precision"])
        rows.append("| " + " | ".join(cols) + " |")
    return "\n".join(rows)


def model_line(j):
    c, w = j["config"], j["weights"]
    windows = sorted({x for x in c["layer_windows"] if x > 0})
    local = sum(1 for x in c["layer_windows"] if x > 0)
    attn = (f"{local} sliding-window layers (window {', '.join(map(str, windows))}) + "
            f"{c['n_layers'] - local} global" if local else "all layers global")
    return (f"`{j['model']}`: {j['arch']}, {c['n_layers']} layers, dim {c['dim']}, {c['n_heads']} query / "
            f"{c['n_kv_heads']} KV heads × {c['head_dim']}, vocab {c['vocab']}; {attn}. Matrices read per token: "
            f"{w['matrix_bytes'] / 1e6:.1f} MB (embedding {w['embedding_type']}, output {w['output_type']}); "
            f"{w['layer_matrix_params'] / 1e6:.1f} M layer-matrix parameters.")


def combine_bandwidth(sessions):
    """Per thread count, the median over the sessions of each session's best repetition: the
    bandwidth the decode runs had. One session runs before every decode run and one after the last,
    because a VM's bandwidth can move between modes within minutes (a Zen 4 host read 35-40 or
    70-83 GB/s at two threads, switching between runs): the best of a start and an end run put
    every fraction against the fast mode's outlier."""
    results = []
    for r in sessions[0]["results"]:
        t = r["threads"]
        per = [next(x for x in s["results"] if x["threads"] == t) for s in sessions]
        bests = [x["best_gbps"] for x in per]
        results.append({"threads": t, "best_gbps": statistics.median(bests), "min_gbps": min(bests),
                        "max_gbps": max(bests), "best_gbps_per_session": bests})
    random = []  # independent random 64-byte line reads: the bound of gather kernels
    for r in sessions[0].get("random_lines", []):
        per = [x for sess in sessions for x in sess.get("random_lines", []) if x["threads"] == r["threads"]]
        random.append({"threads": r["threads"], "best_gbps": statistics.median(x["best_gbps"] for x in per)})
    latencies = [x["random_line_latency_ns"] for x in sessions if "random_line_latency_ns" in x]
    first = sessions[0]
    return {"benchmark": "bandwidth", "description": first["description"], "buffer_bytes": first["buffer_bytes"],
            "simd": first["simd"], "reps": first["reps"], "hardware_threads": first["hardware_threads"],
            "combined": "median over the sessions (one before each decode run, one after the last) of each "
                        "session's best repetition",
            "results": results, "random_lines": random,
            "random_line_latency_ns": statistics.median(latencies) if latencies else float("inf"),
            "sessions": sessions}


def random_line_sentence(bandwidth):
    """One sentence on scattered reads (what sparse attention's gathers are bound by), or ''."""
    if not bandwidth.get("random_lines"):
        return ""
    return ("Independent reads of random 64-byte lines: " +
            ", ".join(f"{r['best_gbps']:.1f} GB/s at {r['threads']} thread" + ("s" if r["threads"] > 1 else "")
                      for r in bandwidth["random_lines"]) +
            f"; one dependent load {bandwidth['random_line_latency_ns']:.0f} ns.")


def write_reports(machine, bandwidth, decodes, skipped, commands, results_md, summary_md):
    n_sessions = len(bandwidth["sessions"])
    bw_rows = ["| threads | roofline GB/s (median) | lowest | highest | every session's best GB/s, in order |",
               "|---|---|---|---|---|"]
    for r in bandwidth["results"]:
        bw_rows.append(f"| {r['threads']} | {r['best_gbps']:.1f} | {r['min_gbps']:.1f} | {r['max_gbps']:.1f} | " +
                       ", ".join(f"{g:.1f}" for g in r["best_gbps_per_session"]) + " |")
    bw_load = max((s["other_cpus"] for s in bandwidth["sessions"]), default=0.0)
    load = [c["other_cpus"] for j in decodes.values() for c in j["cells"]] + [s["other_cpus"] for s in bandwidth["sessions"]]
    max_load = max(load, default=0.0)
    quiet = max_load < 0.1
    load_line = (f"other processes used at most {max_load:.2f} of {machine['cpus']} CPUs during any benchmark "
                 + ("(quiet machine)." if quiet else "— **the machine was busy: the figures are disturbed** "
                    "(see the per-row load column)."))

    md = ["# Memory bandwidth, decode and prefill (`make bench`)", "",
          "Generated by `make bench` (bench/run_bench.py); do not edit by hand. What each figure means and how the "
          "bound is computed: [bench/README.md](../README.md).", "",
          "## Machine and run", "",
          f"- CPU: {machine['cpu']} — {machine['cpus']} logical CPUs, {machine['simd']}, {machine['mem_gib']:.1f} GiB RAM",
          f"- Date: {machine['date']}; run took {machine['minutes']:.1f} min (budget {machine['budget_minutes']:g} min)",
          f"- Commit: `{machine['commit']}`" + (" (with uncommitted changes in the tree)" if machine["dirty"] else ""),
          f"- Load: {load_line}",
          f"- Build: `{machine['build']}` ({machine['cmake_build_type']})",
          f"- Reproduce: `make bench` (builds `build/`: `cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build "
          f"build`, then runs `FATHOM_BUILD=build .venv/bin/python bench/run_bench.py`); this run used "
          f"`FATHOM_BUILD={machine['build']} .venv/bin/python bench/run_bench.py"
          + "".join(f" {a}" for a in machine["argv"]) + "`, which ran the commands listed at the end.", "",
          "## Memory bandwidth (read-only, the roofline)", "",
          f"{bandwidth['buffer_bytes'] >> 20} MiB buffer, {bandwidth['simd']} sum, best of {bandwidth['reps']} repetitions "
          f"per session; {n_sessions} sessions, one before each decode run and one after the last; the median of the "
          f"sessions' bests is the roofline for every bound below (other load during them: at most {bw_load:.2f} CPUs).",
          "", *bw_rows, "", random_line_sentence(bandwidth), ""]
    for key, spec in MODELS.items():
        main = decodes.get((key, PRECISION))
        if not main:
            continue
        md += [f"## {spec['title']} — decode and prefill", "", model_line(main), "",
               f"KV cache {main['options']['kv_dtype']}, matmul precision {PRECISION}, decode = median of "
               f"{main['options']['decode_tokens']} greedy tokens after {main['options']['warmup_tokens']} warm-up "
               f"tokens, prefill in chunks of {main['options']['chunk']} tokens.", "", decode_table(main["cells"]), ""]
        cmp_ = decodes.get((key, COMPARE_PRECISION))
        if cmp_:
            cells = [c for c in main["cells"] if c["depth"] == 0] + cmp_["cells"]
            md += [f"Matmul precision at depth 0 ({PRECISION}: activations quantized to 8-bit blocks, integer dot "
                   f"products; {COMPARE_PRECISION}: weights dequantized to f32 in registers, f32 activations):", "",
                   decode_table(cells, True), ""]
        for s in skipped.get(key, []):
            md.append(f"- skipped depth {s['depth']}: {s['reason']}")
        if skipped.get(key):
            md.append("")
    md += ["## Commands run", "", "```", *commands, "```", ""]
    results_md.write_text("\n".join(md))

    # A compact snippet for docs/performance.md (included verbatim).
    sm = [f"Measured on {machine['cpu']} ({machine['cpus']} CPUs, {machine['simd']}), {machine['date'][:10]}, "
          f"commit `{machine['commit'][:10]}`" + ("" if quiet else " — machine busy, figures disturbed") + ".", ""]
    sm.append("Read bandwidth: " + ", ".join(f"{r['best_gbps']:.1f} GB/s at {r['threads']} thread"
                                             + ("s" if r["threads"] > 1 else "") for r in bandwidth["results"]) + ". "
              + random_line_sentence(bandwidth))
    sm.append("")
    sm += ["| model | threads | depth | prefill tok/s | decode tok/s | bound tok/s | fraction of bound |",
           "|---|---|---|---|---|---|---|"]
    for key, spec in MODELS.items():
        j = decodes.get((key, PRECISION))
        for c in j["cells"] if j else []:
            pf = prefill_label(c)
            sm.append(f"| {spec['title']} | {c['threads']} | {c['depth']} | {pf} | {c['decode_tok_s']:.1f} | "
                      f"{fmt(c['bound_tok_s'], '.0f')} | "
                      f"{fmt(None if c['fraction_of_bound'] is None else 100 * c['fraction_of_bound'], '.0f')}% |")
    for key, spec in MODELS.items():
        for sk in skipped.get(key, []):
            sm.append(f"\n{spec['title']} depth {sk['depth']} was skipped to stay in the time budget ({sk['reason']}).")
    sm += ["", f"KV cache {KV_DTYPE}, matmul precision {PRECISION}; bound = bandwidth / (weight + embedding-row + "
           "KV bytes per token). Details: `bench/results/decode.md`.", ""]
    summary_md.write_text("\n".join(sm))


# ---------------------------------------------------------------- main


def report_only(raw, results):
    machine = json.loads((raw / "machine.json").read_text())
    bandwidth = json.loads((raw / "bandwidth.json").read_text())
    decodes = {}
    for path in sorted(raw.glob("decode-*.json")):
        key, precision = path.stem[len("decode-"):].rsplit("-", 1)
        decodes[(key, precision)] = json.loads(path.read_text())
    write_reports(machine, bandwidth, decodes, machine["skipped"], machine["commands"], results / "decode.md",
                  results / "decode_summary.md")
    log(f"regenerated {results}/decode.md and decode_summary.md")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("FATHOM_BUILD", "build"), help="build directory (FATHOM_BUILD)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated, of " + ",".join(MODELS) + " (default: " + ",".join(DEFAULT_MODELS) + ")")
    ap.add_argument("--depths", help="override every model's depth list (e.g. 0,64 for a quick check)")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--budget-minutes", type=float, default=14.0)
    ap.add_argument("--results-dir", default=str(ROOT / "bench" / "results"),
                    help="where decode.md and decode_summary.md go")
    ap.add_argument("--raw-dir", help="where the JSON goes (default: RESULTS_DIR/raw, ignored by git)")
    ap.add_argument("--report-only", action="store_true",
                    help="only regenerate decode.md and decode_summary.md from the JSON already in --raw-dir")
    args = ap.parse_args()
    results = Path(args.results_dir)
    out = Path(args.raw_dir) if args.raw_dir else results / "raw"
    if args.report_only:
        return report_only(out, results)

    build = Path(args.build) if Path(args.build).is_absolute() else ROOT / args.build
    out.mkdir(parents=True, exist_ok=True)
    for exe in ("bench_bandwidth", "bench_decode"):
        if not (build / exe).exists():
            sys.exit(f"run_bench: {build / exe} is missing; build it first (make bench does)")
    start = time.monotonic()
    budget = args.budget_minutes * 60
    commands, failures = [], []
    scratch = Path(tempfile.mkdtemp(prefix="fathom-bench-"))  # per-process JSON, merged below

    def shown(cmd):  # the command as a user would type it from the repository root
        text = shlex.join([os.path.relpath(cmd[0], ROOT), *cmd[1:]]).replace(str(ROOT) + "/", "")
        return text.replace(str(scratch) + "/", "/tmp/")

    cache = (build / "CMakeCache.txt").read_text() if (build / "CMakeCache.txt").exists() else ""
    build_type = next((l.split("=", 1)[1] for l in cache.splitlines() if l.startswith("CMAKE_BUILD_TYPE:")), "?")
    machine = {"cpu": cpu_model(), "cpus": os.cpu_count(), "simd": simd_level(), "mem_gib": mem_total_gib(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "commit": git("rev-parse", "HEAD") or "unknown",
               "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
               "build": os.path.relpath(build, ROOT), "cmake_build_type": build_type,
               "kernel": platform.release(), "budget_minutes": args.budget_minutes, "argv": [shlex.quote(a) for a in sys.argv[1:]]}

    # 1. Bandwidth: the roofline every decode figure is judged against. Measured before every decode
    # run (bench_decode reads the latest file) and once after the last; the median of the sessions'
    # bests is the roofline, and every bound is recomputed from it at the end (combine_bandwidth).
    def measure_bandwidth(label):
        path = scratch / f"bandwidth-{label}.json"
        cmd = [str(build / "bench_bandwidth"), "--threads", args.threads, "--json", str(path)]
        rc, _, wall, others = run(cmd)
        commands.append(shown(cmd))
        if rc != 0:
            sys.exit("run_bench: bench_bandwidth failed")
        session = json.loads(path.read_text())
        session.update({"label": label, "other_cpus": others, "wall_seconds": wall})
        return path, session

    sessions = []

    # 2. Decode: runs ordered cheapest first (every model's depth 0, then the next depth, ...).
    runs = []  # (key, precision, depth)
    keys = [k for k in args.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            sys.exit(f"run_bench: unknown model '{k}' (known: {', '.join(MODELS)})")
    for k in keys:  # a real shape's file is written on first use (minutes; ~18 GB for the MoE)
        shape = MODELS[k].get("bench_models_shape")
        if shape and not Path(MODELS[k]["path"]).exists():
            log(f"writing {MODELS[k]['path']} (scripts/bench_models.py --shapes {shape})")
            subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_models.py"), "--shapes", shape,
                            "--layouts", "q4_k_m", "--out", str(BENCH_MODELS)], check=True)
    depth_lists = {k: ([int(d) for d in args.depths.split(",")] if args.depths else MODELS[k]["depths"]) for k in keys}
    for level in range(max(len(v) for v in depth_lists.values())):
        for k in keys:
            if level < len(depth_lists[k]):
                runs.append((k, PRECISION, depth_lists[k][level]))
                if depth_lists[k][level] == 0 and MODELS[k].get("compare", True):
                    runs.append((k, COMPARE_PRECISION, 0))
    decodes, skipped = {}, {}
    for key, precision, depth in runs:
        spec = MODELS[key]
        merged = decodes.get((key, precision))
        if depth > 0 and merged:
            share_from = spec.get("share_prefill_from")
            est = estimate_seconds(merged, depth, share_from is not None and depth >= share_from)
            left = budget - (time.monotonic() - start)
            if est > left:
                reason = f"estimated {est / 60:.1f} min, {max(left, 0) / 60:.1f} min of the budget left"
                log(f"skip {key} depth {depth}: {reason}")
                skipped.setdefault(key, []).append({"depth": depth, "reason": reason})
                continue
        bw_json, session = measure_bandwidth(f"before {key} {precision} {depth}")
        sessions.append(session)
        part = scratch / f"decode-{key}-{precision}-{depth}.json"
        cmd = [str(build / "bench_decode"), "--model", spec["path"], "--threads", args.threads, "--depths", str(depth),
               "--decode-tokens", str(args.decode_tokens), "--bandwidth-json", str(bw_json), "--json", str(part),
               "--kv-dtype", KV_DTYPE, "--precision", precision]
        if spec.get("share_prefill_from") is not None:
            cmd += ["--share-prefill-from", str(spec["share_prefill_from"])]
        rc, _, wall, others = run(cmd)
        commands.append(shown(cmd))
        if rc != 0 or not part.exists():
            failures.append(f"{key} {precision} depth {depth} (exit {rc})")
            continue
        j = json.loads(part.read_text())
        part.unlink()
        for c in j["cells"]:
            c["precision"] = precision
            c["other_cpus"] = others
            c["process_wall_seconds"] = wall
        if merged:
            merged["cells"] += j["cells"]
        else:
            decodes[(key, precision)] = j

    sessions.append(measure_bandwidth("end")[1])
    bandwidth = combine_bandwidth(sessions)
    bw_json = out / "bandwidth.json"
    bw_json.write_text(json.dumps(bandwidth, indent=2) + "\n")
    best = {r["threads"]: r["best_gbps"] for r in bandwidth["results"]}
    for j in decodes.values():
        j["bandwidth_json"] = os.path.relpath(bw_json, ROOT) if bw_json.is_relative_to(ROOT) else str(bw_json)
        j["bandwidth_gbps"] = {str(t): g for t, g in best.items()}
        for c in j["cells"]:
            g = best.get(c["threads"])
            c["bandwidth_gbps"] = g
            c["bound_tok_s"] = None if g is None else g * 1e9 / c["bytes_per_token"]
            c["fraction_of_bound"] = None if g is None else c["decode_tok_s"] / c["bound_tok_s"]

    shutil.rmtree(scratch, ignore_errors=True)
    machine["minutes"] = (time.monotonic() - start) / 60
    (out / "machine.json").write_text(json.dumps({**machine, "commands": commands, "skipped": skipped,
                                                  "failures": failures}, indent=2) + "\n")
    for old in out.glob("decode-*.json"):
        old.unlink()
    for (key, precision), j in decodes.items():
        j["skipped"] = skipped.get(key, []) if precision == PRECISION else []
        (out / f"decode-{key}-{precision}.json").write_text(json.dumps(j, indent=2) + "\n")
    write_reports(machine, bandwidth, decodes, skipped, commands, results / "decode.md", results / "decode_summary.md")
    log(f"wrote {results}/decode.md, {results}/decode_summary.md and {out}/*.json in {machine['minutes']:.1f} min")
    if failures:
        sys.exit("run_bench: failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
