#pragma once
// JSON form of a decode attention policy, shared by the config file ("attention": {...}) and
// the request extension ("fathom": {...}):
//   "<name key>": a registered policy's name or alias ("policy" in the config, "attention" in requests)
//   "kv_read_ratio": (0, 1]                              the knob every sparse policy understands
//   "min_keys": int >= 0 | "measured"                    shorter decode steps run densely
//   "<policy>": {...}                                    that policy's parameters, by its ParamSpec table
//                                                        (e.g. "hip": {"refresh": 4}; engine/attention/policies/)
// Explicit parameters override what kv_read_ratio derives (engine/attention/policy.h).
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/attention/policy.h"

namespace fathom {

// Reports a bad value: `param` is the key path below the object ("sparq.k"); must throw.
using AttentionOptionFail = std::function<void(const std::string& param, const std::string& message)>;

// Applies `key` = `value` to `policy` if it is one of the keys above (with `name_key` naming the
// policy) and returns true; returns false for any other key. Bad values call `fail`.
bool apply_attention_option(const std::string& name_key, const std::string& key, const nlohmann::json& value,
                            AttentionPolicy& policy, const AttentionOptionFail& fail);

// Fails (through `fail`) when `object` names one policy's options twice, under its name and its
// old alias ("alisa" and "swa"): which one would win is an accident of key order.
void check_attention_aliases(const nlohmann::json& object, const AttentionOptionFail& fail);

// The keys apply_attention_option understands, for "unknown key" messages.
std::string attention_option_keys(const std::string& name_key);

}  // namespace fathom
