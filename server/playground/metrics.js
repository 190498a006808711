// The live panel: polls /metrics (Prometheus text format, open without a key) once a second while
// the tab is visible and charts what the engine is doing. Counters become rates between two polls;
// a counter that went down (a restarted server) counts as no change.
import { Bars, LineChart } from "./charts.js";
import { getText } from "./api.js";

const POLL_MS = 1000;

// Prometheus text exposition -> Map(name -> [{labels: {k: v}, value}]). Comments and malformed
// lines are skipped; values "+Inf", "-Inf" and "NaN" are numbers.
export function parsePrometheus(text) {
  const out = new Map();
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (raw === "" || raw[0] === "#") continue;
    const m = line.exec(raw);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(label))
      labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    const v = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : Number(m[3]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: v });
  }
  return out;
}

// The sum of a family's samples whose labels include `match`.
function sum(metrics, name, match = {}) {
  let total = 0;
  for (const s of metrics.get(name) || [])
    if (Object.entries(match).every(([k, v]) => s.labels[k] === v)) total += s.value;
  return total;
}

function rate(now, before, seconds) {
  return before === undefined || seconds <= 0 ? null : Math.max(0, now - before) / seconds;
}

const count = (x) => (x >= 1e6 ? (x / 1e6).toFixed(1) + "M" : x >= 1e4 ? (x / 1e3).toFixed(0) + "k" : String(Math.round(x)));
const perSecond = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1)) + "/s";
function bytesPerSecond(x) {
  const units = ["B/s", "KB/s", "MB/s", "GB/s", "TB/s"];
  let i = 0;
  while (x >= 1000 && i < units.length - 1) { x /= 1000; ++i; }
  return (x >= 100 || i === 0 ? x.toFixed(0) : x.toFixed(1)) + " " + units[i];
}
const pct = (x) => (x * 100).toFixed(x < 0.1 ? 1 : 0) + "%";

const POLICIES = ["dense", "auto", "sparq", "hip", "alisa"];

export class MetricsPanel {
  constructor(root, status) {
    this.status = status;
    this.previous = null;  // {t, counters} of the last poll
    this.tokens = new LineChart(root, "Tokens per second",
      [{ name: "generated", format: perSecond }, { name: "prompt", format: perSecond }], { summary: "tokens per second" });
    this.requests = new LineChart(root, "Requests",
      [{ name: "running", format: count }, { name: "waiting", format: count }], { summary: "requests" });
    this.kvChart = new LineChart(root, "KV cache in use, per tier",
      [{ name: "device", format: pct }, { name: "host", format: pct }], { fixedMax: 1, summary: "KV cache use" });
    this.kvBars = new Bars(this.kvChart.card);
    this.hot = new LineChart(root, "Hot-row cache hit ratio",
      [{ name: "hits", format: pct }], { fixedMax: 1, summary: "hot-row hit ratio" });
    this.hotNote = document.createElement("p");
    this.hotNote.className = "note";
    this.hot.card.append(this.hotNote);
    this.kvRead = new LineChart(root, "KV bytes read by decode attention, per policy",
      POLICIES.map((p) => ({ name: p, format: bytesPerSecond })), { summary: "KV bytes read per second" });
    this.spec = new LineChart(root, "Speculative decoding: draft tokens",
      [{ name: "drafted", format: perSecond }, { name: "kept", format: perSecond }], { summary: "draft tokens per second" });
    this.specNote = document.createElement("p");
    this.specNote.className = "note";
    this.spec.card.append(this.specNote);
  }

  start() {
    const tick = async () => {
      if (!document.hidden) await this.poll();
      this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  async poll() {
    let metrics;
    try {
      metrics = parsePrometheus(await getText("/metrics"));
    } catch (e) {
      this.status.textContent = "Cannot read /metrics: " + e.message;
      return;
    }
    const t = performance.now() / 1000;
    const counters = {
      generated: sum(metrics, "fathom_generation_tokens_total"),
      prompt: sum(metrics, "fathom_prompt_tokens_total"),
      hits: sum(metrics, "fathom_kv_hot_rows_total", { result: "hit" }),
      misses: sum(metrics, "fathom_kv_hot_rows_total", { result: "miss" }),
    };
    for (const p of POLICIES) counters["read_" + p] = sum(metrics, "fathom_kv_read_bytes_total", { policy: p });
    counters.drafted = sum(metrics, "fathom_spec_decode_draft_tokens_total");
    counters.kept = sum(metrics, "fathom_spec_decode_accepted_tokens_total");
    counters.verifies = sum(metrics, "fathom_spec_decode_verify_steps_total");
    const before = this.previous ? this.previous.counters : {};
    const dt = this.previous ? t - this.previous.t : 0;
    this.previous = { t, counters };

    this.tokens.push([rate(counters.generated, before.generated, dt), rate(counters.prompt, before.prompt, dt)]);
    this.requests.push([sum(metrics, "fathom_requests_running"), sum(metrics, "fathom_requests_waiting")]);

    const tiers = ["device", "host"].map((tier) => {
      const used = sum(metrics, "fathom_kv_usage_ratio", { tier });
      const blocks = sum(metrics, "fathom_kv_blocks_used", { tier });
      return { tier, used, blocks };
    });
    this.kvChart.push(tiers.map((x) => x.used));
    this.kvBars.set(tiers.map((x) => ({
      name: x.tier, fraction: x.used,
      text: x.tier === "host" && !x.blocks && !x.used ? "0 blocks (no host tier, or unused)" : `${count(x.blocks)} blocks, ${pct(x.used)}`,
    })));

    const lookups = counters.hits + counters.misses;
    const newHits = before.hits === undefined ? 0 : counters.hits - before.hits;
    const newLookups = before.hits === undefined ? 0 : lookups - before.hits - before.misses;
    this.hot.push([newLookups > 0 ? newHits / newLookups : null]);
    this.hotNote.textContent = lookups > 0
      ? `${pct(counters.hits / lookups)} of ${count(lookups)} host-tier row lookups since start`
      : "No lookups yet: HiP and ALISA read host-tier KV rows through this cache (needs kv_cache.host_mib).";

    this.kvRead.push(POLICIES.map((p) => rate(counters["read_" + p], before["read_" + p], dt)));
    this.spec.push([rate(counters.drafted, before.drafted, dt), rate(counters.kept, before.kept, dt)]);
    this.specNote.textContent = counters.verifies > 0
      ? `${pct(counters.kept / Math.max(1, counters.drafted))} of drafts kept; ` +
        `${(1 + counters.kept / counters.verifies).toFixed(2)} tokens per verify step since start`
      : "No drafts yet: requests with speculative decoding on (n-gram lookup, sparse drafts) draft several tokens a step.";
    this.status.textContent = "Updated " + new Date().toLocaleTimeString();
  }
}
