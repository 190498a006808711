#include "server/attention_options.h"

#include <limits>

#include "base/error.h"
#include "engine/attention/policy_registry.h"

namespace fathom {

namespace {

using nlohmann::json;

[[noreturn]] void fail_and_throw(const AttentionOptionFail& fail, const std::string& param, const std::string& message) {
  fail(param, message);
  throw Error(param + ": " + message);  // fail() must throw; this only guards the contract
}

int32_t integer(const json& v, const std::string& param, int64_t min, const AttentionOptionFail& fail) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > (1u << 30)) || v.get<int64_t>() < min ||
      v.get<int64_t>() > (1 << 30))
    fail_and_throw(fail, param, "must be an integer >= " + std::to_string(min));
  return static_cast<int32_t>(v.get<int64_t>());
}

bool boolean(const json& v, const std::string& param, const AttentionOptionFail& fail) {
  if (!v.is_boolean()) fail_and_throw(fail, param, "must be true or false");
  return v.get<bool>();
}

double ratio(const json& v, const std::string& param, const AttentionOptionFail& fail) {
  if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0))
    fail_and_throw(fail, param, "must be a number in (0, 1]");
  return v.get<double>();
}

// Calls `each(key, value)` for the members of a nested policy object.
template <typename Each>
void members(const json& v, const std::string& param, const AttentionOptionFail& fail, Each each) {
  if (!v.is_object()) fail_and_throw(fail, param, "must be an object");
  for (auto it = v.begin(); it != v.end(); ++it) each(it.key(), *it, param + "." + it.key());
}

}  // namespace

std::string attention_option_keys(const std::string& name_key) {
  std::string keys = name_key + ", kv_read_ratio, min_keys";
  for (const PolicyDef& d : policy_registry())
    if (!d.params.empty()) keys += ", " + std::string(d.name);
  return keys;
}

namespace {

// The policy whose options object `key` names (its name or alias), or null.
const PolicyDef* options_of(const std::string& key) {
  for (const PolicyDef& d : policy_registry())
    if (!d.params.empty() && (key == d.name || (d.alias != nullptr && key == d.alias))) return &d;
  return nullptr;
}

double param_value(const ParamSpec& spec, const json& v, const std::string& param, const AttentionOptionFail& fail) {
  switch (spec.type) {
    case ParamType::kInt: return integer(v, param, static_cast<int64_t>(spec.min), fail);
    case ParamType::kOddInt: {
      const int32_t n = integer(v, param, static_cast<int64_t>(spec.min), fail);
      if (n % 2 == 0) fail_and_throw(fail, param, "must be an odd integer >= " + std::to_string(static_cast<int64_t>(spec.min)));
      return n;
    }
    case ParamType::kBool: return boolean(v, param, fail) ? 1 : 0;
    case ParamType::kRatio: return ratio(v, param, fail);
  }
  return 0;
}

}  // namespace

void check_attention_aliases(const json& object, const AttentionOptionFail& fail) {
  for (const PolicyDef& d : policy_registry())
    if (d.alias != nullptr && !d.params.empty() && object.contains(d.name) && object.contains(d.alias))
      fail_and_throw(fail, d.alias,
                     "is the old name of '" + std::string(d.name) + "': give its options under one of the two");
}

bool apply_attention_option(const std::string& name_key, const std::string& key, const json& value,
                            AttentionPolicy& p, const AttentionOptionFail& fail) {
  if (key == name_key) {
    if (!value.is_string()) fail_and_throw(fail, key, "must be a string");
    try {
      p.kind = policy_kind(value.get<std::string>());
    } catch (const Error& e) {
      fail_and_throw(fail, key, e.what());
    }
  } else if (key == "min_keys") {
    if (value.is_string() && value.get<std::string>() == "measured") p.min_keys = AttentionPolicy::kMeasuredBreakEven;
    else if (value.is_number_integer()) p.min_keys = integer(value, key, 0, fail);
    else fail_and_throw(fail, key, "must be an integer >= 0 or \"measured\"");
  } else if (key == "kv_read_ratio") {
    p.kv_read_ratio = ratio(value, key, fail);
  } else if (const PolicyDef* def = options_of(key)) {
    members(value, key, fail, [&](const std::string& k, const json& v, const std::string& param) {
      std::string names;
      for (size_t j = 0; j < def->params.size(); ++j) {
        if (k == def->params[j].name) {
          p.set(Param{def->params, static_cast<int>(j)}, param_value(def->params[j], v, param, fail));
          return;
        }
        names += (j == 0 ? "" : ", ") + std::string(def->params[j].name);
      }
      fail_and_throw(fail, param, "unknown " + key + " option (" + names + ")");
    });
  } else {
    return false;
  }
  return true;
}

}  // namespace fathom
