#include "server/model_options.h"

#include "base/error.h"
#include "base/kv_dtype.h"

namespace fathom {

ModelOptions model_options_from_args(const CliArgs& args, const ModelOptions& defaults) {
  ModelOptions o = defaults;
  o.threads = static_cast<int>(args.get_int("threads", o.threads));
  if (o.threads < 0 || o.threads > 1024) throw Error("--threads must be between 0 and 1024");
  if (auto v = args.get("kv-dtype")) o.kv_dtype = parse_kv_dtype(*v);
  if (auto v = args.get("precision")) {
    if (*v == "q8") o.precision = cpu::Precision::kQ8;
    else if (*v == "f32") o.precision = cpu::Precision::kF32;
    else throw Error("--precision must be q8 or f32, got '" + *v + "'");
  }
  o.block_size = static_cast<int32_t>(args.get_int("block-size", o.block_size));
  const int64_t mib = args.get_int("kv-cache-mib", 0);
  if (mib < 0) throw Error("--kv-cache-mib must not be negative");
  if (mib > 0) o.kv_cache_bytes = mib << 20;
  o.hot_rows_percent = static_cast<int32_t>(args.get_int("hot-rows-percent", o.hot_rows_percent));
  if (o.hot_rows_percent < 0 || o.hot_rows_percent > 100) throw Error("--hot-rows-percent must be between 0 and 100");
  if (auto v = args.get("chat-template")) o.chat_template = *v;
  if (args.flag("no-transposed-k")) o.kv_transposed_k = false;
  if (args.flag("no-pack-weights")) o.pack_weights = false;
  if (auto v = args.get("backend")) o.backend = *v;
  return o;
}

AttentionPolicy attention_from_args(const CliArgs& args, const AttentionPolicy& defaults) {
  AttentionPolicy p = defaults;
  if (auto v = args.get("attention")) p.kind = policy_kind(*v);
  if (args.has("kv-read-ratio")) p.kv_read_ratio = args.get_double("kv-read-ratio", p.kv_read_ratio);
  if (auto v = args.get("attention-min-keys"))
    p.min_keys = *v == "measured" ? AttentionPolicy::kMeasuredBreakEven : static_cast<int32_t>(args.get_int("attention-min-keys", 0));
  p.validate();
  return p;
}

}  // namespace fathom
