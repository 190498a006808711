#pragma once
// The engine's metric families, shared by the Scheduler and the parts it drives
// (engine/kv_placement.h, engine/output_processor.h).
#include <vector>

#include "engine/attention/policy.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/forward.h"
#include "engine/metrics.h"

namespace fathom {

// The engine's metric families (names are the contract with docs/operations.md "Metrics" and the dashboards).
struct EngineMetrics {
  explicit EngineMetrics(MetricsRegistry& r)
      : running(r.gauge("fathom_requests_running", "Requests with at least one sequence admitted")),
        waiting(r.gauge("fathom_requests_waiting", "Requests queued for admission")),
        prompt_tokens(r.counter("fathom_prompt_tokens_total", "Prompt tokens of admitted requests")),
        generation_tokens(r.counter("fathom_generation_tokens_total", "Tokens generated")),
        ttft(r.histogram("fathom_time_to_first_token_seconds", "Time from arrival to the first token",
                         MetricsRegistry::latency_buckets())),
        itl(r.histogram("fathom_inter_token_latency_seconds", "Time between consecutive tokens of a sequence",
                        MetricsRegistry::latency_buckets())),
        e2e(r.histogram("fathom_e2e_request_latency_seconds", "Time from arrival to the last token",
                        MetricsRegistry::latency_buckets())),
        queue(r.histogram("fathom_queue_time_seconds", "Time from arrival to admission",
                          MetricsRegistry::latency_buckets())),
        prefill_time(r.histogram("fathom_request_prefill_seconds", "Time from admission to the first token",
                                 MetricsRegistry::latency_buckets())),
        decode_time(r.histogram("fathom_request_decode_seconds", "Time from the first token to the last",
                                MetricsRegistry::latency_buckets())),
        step_tokens(r.histogram("fathom_step_tokens", "Tokens computed per engine step (prefill chunks + decodes)",
                                {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192})),
        step_time(r.histogram("fathom_step_duration_seconds", "Time of one engine step's forward pass",
                              MetricsRegistry::latency_buckets())),
        blocks_device(r.gauge("fathom_kv_blocks_used", "KV blocks in use (including cached prefixes)", {{"tier", "device"}})),
        blocks_host(r.gauge("fathom_kv_blocks_used", "KV blocks in use (including cached prefixes)", {{"tier", "host"}})),
        usage_device(r.gauge("fathom_kv_usage_ratio", "Fraction of the tier's KV capacity in use", {{"tier", "device"}})),
        usage_host(r.gauge("fathom_kv_usage_ratio", "Fraction of the tier's KV capacity in use", {{"tier", "host"}})),
        prefix_queries(r.counter("fathom_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache")),
        prefix_hits(r.counter("fathom_prefix_cache_hits_total", "Prompt tokens served from the prefix cache")),
        preempt_recompute(
            r.counter("fathom_preemptions_total", "Sequences preempted under KV pressure", {{"mode", "recompute"}})),
        swap_out(r.counter("fathom_swap_bytes_total", "KV bytes moved between tiers", {{"direction", "out"}})),
        swap_in(r.counter("fathom_swap_bytes_total", "KV bytes moved between tiers", {{"direction", "in"}})),
        hot_fallback(r.counter("fathom_kv_hot_row_fallbacks_total",
                               "Sparse decode layer steps over host-tier rows that decoded densely: the hot-row cache "
                               "is smaller than one key chunk")),
        recomputed(r.counter("fathom_recomputed_tokens_total",
                             "Tokens whose K/V were computed again after a recompute preemption dropped them "
                             "(prefix-cache hits excluded)")),
        demoted(r.counter("fathom_kv_blocks_demoted_total",
                          "KV blocks moved from the device tier to the host tier to make room for a step's writes")),
        expert_bytes(r.counter("fathom_expert_weight_bytes_total",
                               "Expert weight bytes mixture-of-experts layers read (each active expert once a step)")),
        dropped_blocks(r.counter("fathom_kv_blocks_dropped_total",
                                 "KV blocks of running sequences dropped from both tiers (cache-or-recompute)")),
        dropped_recomputed(r.counter("fathom_kv_dropped_tokens_recomputed_total",
                                     "Tokens of dropped blocks computed again by the steps that read them")),
        restored_blocks(r.counter("fathom_kv_blocks_restored_total",
                                  "Dropped KV blocks given back to their sequence (recomputed into new blocks)")),
        dropped_now(r.gauge("fathom_kv_dropped_tokens", "Tokens of running sequences whose K/V neither tier holds")),
        recompute_cost(r.gauge("fathom_kv_recompute_seconds_per_token",
                               "Start-up measurement: one token of a recompute step (cache-or-recompute cost model)")),
        transfer_cost(r.gauge("fathom_kv_transfer_seconds_per_token",
                              "Start-up measurement: moving one token's K/V from the host tier to the device tier")),
        registry(r) {}

  Counter& hot_rows(PolicyKind k, const char* result) {
    return registry.counter("fathom_kv_hot_rows_total",
                            "Host-tier rows sparse decode looked up in the hot-row cache, by policy and result "
                            "(hit, miss: copied in)",
                            {{"policy", policy_name(k)}, {"result", result}});
  }

  // Created for every policy up front so the family is present (at 0) before any decode.
  Counter& kv_read(PolicyKind k) {
    return registry.counter("fathom_kv_read_bytes_total", "KV cache bytes read by decode attention, by the request's policy",
                            {{"policy", policy_name(k)}});
  }

  // Decode layer steps by the request's policy and the kernel that ran (dense: below the policy's
  // break-even, a dense leading or sliding layer, or a bifurcated group; else the sparse kind auto chose).
  Counter& attention_steps(PolicyKind requested, PolicyKind ran) {
    return registry.counter("fathom_attention_layer_steps_total",
                            "Decode attention layer steps, by the request's policy and the kernel that ran",
                            {{"policy", policy_name(requested)}, {"kernel", policy_name(ran)}});
  }

  // Speculative decoding, by drafter (docs/speculative.md): tokens drafted, drafts kept (each
  // equal to what the verify step's row produced), verify steps, and drafts kept per verify step.
  Counter& spec_drafted(Speculation d) {
    return registry.counter("fathom_spec_decode_draft_tokens_total", "Draft tokens proposed for verification, by drafter",
                            {{"drafter", speculation_name(d)}});
  }
  Counter& spec_accepted(Speculation d) {
    return registry.counter("fathom_spec_decode_accepted_tokens_total",
                            "Draft tokens the dense verify step kept, by drafter", {{"drafter", speculation_name(d)}});
  }
  Counter& spec_verify_steps(Speculation d) {
    return registry.counter("fathom_spec_decode_verify_steps_total",
                            "Sequence steps that verified drafts (one dense pass over the last token and the drafts)",
                            {{"drafter", speculation_name(d)}});
  }
  Histogram& spec_accepted_length(Speculation d) {
    return registry.histogram("fathom_spec_decode_accepted_length", "Draft tokens kept per verify step, by drafter",
                              {0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16}, {{"drafter", speculation_name(d)}});
  }

  Counter& finished(FinishReason reason) {
    return registry.counter("fathom_request_finished_total", "Requests finished, by finish reason",
                            {{"reason", finish_reason_name(reason)}});
  }

  // Every labelled series a dashboard reads (finish reasons, policies, drafters), at 0 from the
  // start, so rates and ratios exist before the first event.
  void export_series_at_zero();
  // What a forward pass counted (engine/backend/backend.h) and any break-even the backend
  // measured for the first time.
  void record_step(const StepStats& step, const std::vector<MeasuredBreakEven>& break_evens);
  // fathom_attention_break_even_keys for every break-even in `measured` not exported yet (the
  // backend measures each once, on first use, and appends it).
  void export_break_evens(const std::vector<MeasuredBreakEven>& measured);

  Gauge &running, &waiting;
  Counter &prompt_tokens, &generation_tokens;
  Histogram &ttft, &itl, &e2e, &queue, &prefill_time, &decode_time, &step_tokens, &step_time;
  Gauge &blocks_device, &blocks_host, &usage_device, &usage_host;
  Counter &prefix_queries, &prefix_hits, &preempt_recompute, &swap_out, &swap_in, &hot_fallback, &recomputed, &demoted;
  Counter& expert_bytes;
  Counter &dropped_blocks, &dropped_recomputed, &restored_blocks;
  Gauge &dropped_now, &recompute_cost, &transfer_cost;
  MetricsRegistry& registry;
  size_t break_evens_exported = 0;
};

}  // namespace fathom
