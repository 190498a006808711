#pragma once
// A tiny GGUF writer for tests: bytes as the spec lays them out, nothing checked (the tests write
// malformed files on purpose). test_gguf.cpp's synthetic files, test_arch_config.cpp's models.
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/gguf.h"

namespace fathom::test {

class Writer {
 public:
  template <class T>
  Writer& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& str(std::string_view s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Writer& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bytes.insert(bytes.end(), {'G', 'G', 'U', 'F'});
    return put(version).put(n_tensors).put(n_kv);
  }
  Writer& type(GgufValueType t) { return put(static_cast<uint32_t>(t)); }
  template <class T>
  Writer& kv(std::string_view key, GgufValueType t, T v) {
    return str(key).type(t).put(v);
  }
  Writer& kv_str(std::string_view key, std::string_view v) { return str(key).type(GgufValueType::STRING).str(v); }
  Writer& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put(d);
    return put(type).put(offset);
  }
  Writer& pad(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  Writer& fill(size_t n, uint8_t start = 0) {
    for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(start + i));
    return *this;
  }
  std::vector<uint8_t> bytes;
};

}  // namespace fathom::test
