#include "engine/attention/policy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "engine/attention/policy_registry.h"

namespace fathom {

int policy_count() { return static_cast<int>(policy_registry().size()); }

const char* policy_name(PolicyKind k) { return policy_def(k).name; }

std::string policy_names() {
  std::string names;
  for (const PolicyDef& d : policy_registry()) names += (names.empty() ? "" : ", ") + std::string(d.name);
  return names;
}

PolicyKind policy_kind(const std::string& name) {
  const std::span<const PolicyDef> all = policy_registry();
  for (size_t i = 0; i < all.size(); ++i)
    if (name == all[i].name || (all[i].alias != nullptr && name == all[i].alias)) return static_cast<PolicyKind>(i);
  throw Error("unknown attention policy '" + name + "' (available: " + policy_names() + ")");
}

namespace {

// The registry index of the first policy whose parameter table is `table` (auto has none of its
// own; a table is one policy's).
int table_owner(std::span<const ParamSpec> table) {
  const std::span<const PolicyDef> all = policy_registry();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].params.data() == table.data() && !table.empty()) return static_cast<int>(i);
  FATHOM_CHECK(false, "parameter table of no registered policy");
  return 0;
}

}  // namespace

AttentionPolicy::AttentionPolicy() {
  const std::span<const PolicyDef> all = policy_registry();
  for (size_t i = 0; i < all.size(); ++i) {
    FATHOM_CHECK(all[i].params.size() <= static_cast<size_t>(kMaxPolicyParams), "too many policy parameters");
    for (size_t j = 0; j < all[i].params.size(); ++j) values_[i * kMaxPolicyParams + j] = all[i].params[j].initial;
  }
}

AttentionPolicy::AttentionPolicy(PolicyKind k, double ratio) : AttentionPolicy() {
  policy_def(k);  // checks k
  kind = k;
  kv_read_ratio = ratio;
}

bool AttentionPolicy::is(const char* n) const { return std::strcmp(policy_name(kind), n) == 0; }

size_t AttentionPolicy::slot(Param p) const {
  FATHOM_CHECK(p.index >= 0 && static_cast<size_t>(p.index) < p.table.size(), "parameter index out of its table");
  return static_cast<size_t>(table_owner(p.table)) * kMaxPolicyParams + p.index;
}

std::span<const double> AttentionPolicy::values_of(std::span<const ParamSpec> table) const {
  if (table.empty()) return {};
  return std::span<const double>(values_).subspan(static_cast<size_t>(table_owner(table)) * kMaxPolicyParams,
                                                  table.size());
}

void AttentionPolicy::validate() const {
  if (!(kv_read_ratio > 0.0 && kv_read_ratio <= 1.0)) throw Error("kv_read_ratio must be in (0, 1]");
  if (min_keys < kMeasuredBreakEven) throw Error("min_keys must be >= 0 or \"measured\"");
  for (const PolicyDef& d : policy_registry()) {
    const std::span<const double> v = values_of(d.params);
    for (size_t j = 0; j < d.params.size(); ++j) {
      const ParamSpec& s = d.params[j];
      if (v[j] == kDerived && s.initial == kDerived) continue;
      const std::string what = std::string(d.name) + "." + s.name;
      switch (s.type) {
        case ParamType::kInt:
          if (!(v[j] >= s.min && v[j] <= s.max) || v[j] != std::floor(v[j]))
            throw Error(what + " must be an integer in [" + std::to_string(static_cast<int64_t>(s.min)) + ", " +
                        std::to_string(static_cast<int64_t>(s.max)) + "]");
          break;
        case ParamType::kOddInt:
          if (!(v[j] >= s.min && v[j] <= s.max) || v[j] != std::floor(v[j]) || std::fmod(v[j], 2.0) == 0)
            throw Error(what + " must be an odd integer in [" + std::to_string(static_cast<int64_t>(s.min)) + ", " +
                        std::to_string(static_cast<int64_t>(s.max)) + "]");
          break;
        case ParamType::kBool:
          if (v[j] != 0 && v[j] != 1) throw Error(what + " must be true or false");
          break;
        case ParamType::kRatio:
          if (!(v[j] > 0.0 && v[j] <= 1.0)) throw Error(what + " must be in (0, 1]");
          break;
      }
    }
  }
}

AttentionPolicy resolve_auto(const AttentionPolicy& p) {
  const PolicyDef& d = policy_def(p.kind);
  return d.resolve != nullptr ? d.resolve(p) : p;
}

AttentionPolicy break_even_probe(const AttentionPolicy& p) {
  const PolicyDef& d = policy_def(p.kind);
  const double ratio = d.probe_ratio != nullptr ? d.probe_ratio(p) : p.kv_read_ratio;
  AttentionPolicy probe(p.kind);
  // Up to a power of two to 1/8, then to a multiple of 1/8: eleven buckets (1/64 ... 1/8, 1/4,
  // 3/8, ... 1). With powers of two only, 3/8 was probed at 1/2, where ALISA is about dense's
  // speed (SmolLM2 8k keys: 283 vs 292 us a layer), so a 3/8 request's break-even came out
  // "never" in some start-ups although 3/8 measures 1.3x dense at 8k (bench_decode).
  probe.kv_read_ratio = 1.0 / 64;
  while (probe.kv_read_ratio < ratio && probe.kv_read_ratio < 0.125) probe.kv_read_ratio *= 2;
  if (ratio > 0.125) probe.kv_read_ratio = std::min(1.0, std::ceil(ratio * 8 - 1e-9) / 8);
  if (d.probe_params != nullptr) d.probe_params(p, probe);
  return probe;
}

bool same_break_even_probe(const AttentionPolicy& a, const AttentionPolicy& b) {
  if (a.kind != b.kind || a.kv_read_ratio != b.kv_read_ratio) return false;
  const std::span<const ParamSpec> table = policy_def(a.kind).params;
  const std::span<const double> va = a.values_of(table), vb = b.values_of(table);
  return std::equal(va.begin(), va.end(), vb.begin(), vb.end());
}

bool is_default_probe(const AttentionPolicy& probe) {
  const std::span<const ParamSpec> table = policy_def(probe.kind).params;
  const std::span<const double> v = probe.values_of(table);
  for (size_t j = 0; j < table.size(); ++j)
    if (v[j] != table[j].initial) return false;
  return true;
}

bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding) {
  if (p.kind == kDensePolicy || sliding) return false;
  if (policy_def(p.kind).resolve != nullptr) return layer_uses_policy(resolve_auto(p), layer, sliding);
  const PolicyDef& d = policy_def(p.kind);
  return d.dense_layers == nullptr || layer >= d.dense_layers(p);
}

bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d) {
  const PolicyDef& def = policy_def(p.kind);
  if (def.resolve != nullptr) return selects_every_key(resolve_auto(p), S, d);  // auto: what it stands for
  return def.selects_every_key == nullptr || def.selects_every_key(p, S, d);
}

}  // namespace fathom
