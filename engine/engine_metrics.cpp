#include "engine/engine_metrics.h"

#include <cstdint>
#include <cstdio>
#include <limits>

#include "engine/attention/policy_registry.h"
#include "engine/speculative/drafter.h"

namespace fathom {

void EngineMetrics::export_series_at_zero() {
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled, FinishReason::kError})
    finished(r);  // export every reason from the start, at 0
  for (PolicyKind k = 0; k < policy_count(); ++k) {
    kv_read(k);
    attention_steps(k, kDensePolicy);  // the family, at 0
    if (policy_def(k).hot_row_series) {
      hot_rows(k, "hit");
      hot_rows(k, "miss");
    }
  }
  for (const Speculation d : kDrafters) {  // every drafter's series, at 0
    spec_drafted(d);
    spec_accepted(d);
    spec_verify_steps(d);
    spec_accepted_length(d);
  }
}

void EngineMetrics::record_step(const StepStats& step, const std::vector<MeasuredBreakEven>& break_evens) {
  swap_in.inc(static_cast<double>(step.staged_bytes));
  if (step.expert_bytes > 0) expert_bytes.inc(static_cast<double>(step.expert_bytes));
  const HotRowCounts& hot = step.hot_rows;
  for (PolicyKind k = 0; k < policy_count(); ++k) {
    if (hot.hits[k] > 0) hot_rows(k, "hit").inc(static_cast<double>(hot.hits[k]));
    if (hot.misses[k] > 0) hot_rows(k, "miss").inc(static_cast<double>(hot.misses[k]));
    if (hot.fallbacks[k] > 0) hot_fallback.inc(static_cast<double>(hot.fallbacks[k]));
  }
  for (PolicyKind k = 0; k < policy_count(); ++k)
    if (step.kv_read[k] > 0) kv_read(k).inc(static_cast<double>(step.kv_read[k]));
  export_break_evens(break_evens);
  for (PolicyKind k = 0; k < policy_count(); ++k)
    for (PolicyKind ran = 0; ran < policy_count(); ++ran)
      if (step.attention_steps[k][ran] > 0)
        attention_steps(k, ran)
            .inc(static_cast<double>(step.attention_steps[k][ran]));
}

void EngineMetrics::export_break_evens(const std::vector<MeasuredBreakEven>& measured) {
  for (; break_evens_exported < measured.size(); ++break_evens_exported) {
    const MeasuredBreakEven& m = measured[break_evens_exported];
    // One series per (policy, ratio): HiP's non-default variants (per query head, a shorter
    // refresh) are measured and used but not exported, so they cannot overwrite the default's.
    if (!is_default_probe(m.probe)) continue;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%g", m.probe.kv_read_ratio);
    registry
        .gauge("fathom_attention_break_even_keys",
               "Decode length (keys) from which a sparse policy is measured faster than dense; shorter steps run "
               "densely (+Inf: never faster)",
               {{"policy", policy_name(m.probe.kind)}, {"kv_read_ratio", ratio}})
        .set(m.min_keys == INT32_MAX ? std::numeric_limits<double>::infinity() : m.min_keys);
  }
}

}  // namespace fathom
