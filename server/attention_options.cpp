#include "server/attention_options.h"

#include <limits>

#include "base/error.h"

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
  return name_key + ", kv_read_ratio, min_keys, sparq, hip, swa";
}

bool apply_attention_option(const std::string& name_key, const std::string& key, const json& value,
                            AttentionPolicy& p, const AttentionOptionFail& fail) {
  if (key == name_key) {
    if (!value.is_string()) fail_and_throw(fail, key, "must be a string");
    try {
      p.kind = parse_policy_name(value.get<std::string>());
    } catch (const Error& e) {
      fail_and_throw(fail, key, e.what());
    }
  } else if (key == "min_keys") {
    if (value.is_string() && value.get<std::string>() == "measured") p.min_keys = AttentionPolicy::kMeasuredBreakEven;
    else if (value.is_number_integer()) p.min_keys = integer(value, key, 0, fail);
    else fail_and_throw(fail, key, "must be an integer >= 0 or \"measured\"");
  } else if (key == "kv_read_ratio") {
    p.kv_read_ratio = ratio(value, key, fail);
  } else if (key == "sparq") {
    members(value, key, fail, [&](const std::string& k, const json& v, const std::string& param) {
      if (k == "r") p.sparq_r = integer(v, param, 1, fail);
      else if (k == "k") p.sparq_k = integer(v, param, 1, fail);
      else if (k == "l") p.sparq_l = integer(v, param, 0, fail);
      else if (k == "reallocation") p.sparq_reallocation = boolean(v, param, fail);
      else if (k == "key_spread") p.sparq_key_spread = boolean(v, param, fail);
      else fail_and_throw(fail, param, "unknown sparq option (r, k, l, reallocation, key_spread)");
    });
  } else if (key == "hip") {
    members(value, key, fail, [&](const std::string& k, const json& v, const std::string& param) {
      if (k == "mask_k") p.hip_mask_k = integer(v, param, 1, fail);
      else if (k == "block_size_k") p.hip_block_size_k = integer(v, param, 1, fail);
      else if (k == "sink") p.hip_sink = integer(v, param, 0, fail);
      else if (k == "window") p.hip_window = integer(v, param, 0, fail);
      else if (k == "refresh") p.hip_refresh = integer(v, param, 1, fail);
      else if (k == "dense_layers") p.hip_dense_layers = integer(v, param, 0, fail);
      else if (k == "per_kv_head") p.hip_per_kv_head = boolean(v, param, fail);
      else
        fail_and_throw(fail, param,
                       "unknown hip option (mask_k, block_size_k, sink, window, refresh, dense_layers, per_kv_head)");
    });
  } else if (key == "swa") {
    members(value, key, fail, [&](const std::string& k, const json& v, const std::string& param) {
      if (k == "ratio") p.swa_ratio = ratio(v, param, fail);
      else if (k == "pool") p.swa_pool = integer(v, param, 1, fail);
      else fail_and_throw(fail, param, "unknown swa option (ratio, pool)");
    });
  } else {
    return false;
  }
  return true;
}

}  // namespace fathom
