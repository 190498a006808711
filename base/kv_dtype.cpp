#include "base/kv_dtype.h"

#include "base/error.h"

namespace fathom {

KvDtype parse_kv_dtype(const std::string& name) {
  if (name == "f32") return KvDtype::kF32;
  if (name == "f16") return KvDtype::kF16;
  if (name == "int8") return KvDtype::kI8;
  throw Error("unknown KV cache dtype '" + name + "' (expected f32, f16 or int8)");
}

}  // namespace fathom
