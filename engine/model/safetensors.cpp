#include "engine/model/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_depth.h"

namespace fathom {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

constexpr size_t kMaxDims = 8;           // checkpoints use 1-4; anything deeper is not a weight
constexpr size_t kMaxShownName = 80;

struct Dtype {
  const char* name;
  size_t bytes;
};
// Every dtype of the format (so that a known but unusable one gets its size checked and a clear
// message); only F32, F16 and BF16 become weights.
constexpr Dtype kDtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                             {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                             {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

std::string shown(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShownName; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return "'" + out + (s.size() > kMaxShownName ? "...'" : "'");
}

uint64_t to_u64(const nlohmann::json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_unsigned()) throw Error(path + ": " + what + " is not a non-negative integer");
  return v.get<uint64_t>();
}

}  // namespace

bool safetensors_ggml_type(const std::string& dtype, GgmlType& out) {
  if (dtype == "F32") out = GgmlType::F32;
  else if (dtype == "F16") out = GgmlType::F16;
  else if (dtype == "BF16") out = GgmlType::BF16;
  else return false;
  return true;
}

std::vector<SafetensorsTensor> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < 8) throw Error(path + ": not a safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  if (n > kMaxSafetensorsHeader)
    throw Error(path + ": safetensors header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kMaxSafetensorsHeader) + " bytes");
  if (n > size - 8)
    throw Error(path + ": file is truncated: the safetensors header needs " + std::to_string(n) + " bytes, " +
                std::to_string(size - 8) + " left");
  const std::string_view text(reinterpret_cast<const char*>(bytes) + 8, n);
  // {tensor: {"shape": [...]}}: three levels; anything deeper is not a safetensors header.
  constexpr int kMaxDepth = 3;
  if (json_nesting_depth(text, kMaxDepth) > kMaxDepth)
    throw Error(path + ": safetensors header nests deeper than " + std::to_string(kMaxDepth) + " levels");
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) throw Error(path + ": safetensors header is not valid JSON");
  if (!header.is_object()) throw Error(path + ": safetensors header is not a JSON object");

  const uint8_t* data = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) per tensor, as tensors
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(path + ": __metadata__ is not an object");
      for (const auto& [k, v] : info.items())
        if (!v.is_string()) throw Error(path + ": __metadata__ " + shown(k) + " is not a string");
      continue;
    }
    const std::string where = path + ": tensor " + shown(name);
    if (!info.is_object() || info.size() != 3 || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      throw Error(where + " must be an object of exactly dtype, shape and data_offsets");
    const nlohmann::json& dt = info["dtype"];
    if (!dt.is_string()) throw Error(where + " dtype is not a string");
    const std::string dtype = dt.get<std::string>();
    const auto d = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                [&](const Dtype& x) { return dtype == x.name; });
    if (d == std::end(kDtypes)) throw Error(where + " has unknown dtype " + shown(dtype));
    const nlohmann::json& shape = info["shape"];
    if (!shape.is_array() || shape.size() > kMaxDims)
      throw Error(where + " shape is not an array of at most " + std::to_string(kMaxDims) + " dimensions");
    SafetensorsTensor t{name, dtype, {}, nullptr, 0};
    uint64_t elements = 1;
    for (const nlohmann::json& dim : shape) {
      const uint64_t v = to_u64(dim, path, "tensor " + shown(name) + " shape entry");
      if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, v, &elements))
        throw Error(where + " shape's element count overflows");
      t.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d->bytes), &nbytes))
      throw Error(where + " byte size overflows");
    const nlohmann::json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2) throw Error(where + " data_offsets is not [begin, end]");
    const uint64_t begin = to_u64(off[0], path, "tensor " + shown(name) + " data_offsets[0]");
    const uint64_t end = to_u64(off[1], path, "tensor " + shown(name) + " data_offsets[1]");
    if (begin > end) throw Error(where + " data_offsets begin after they end");
    if (end > data_size)
      throw Error(path + ": file is truncated: tensor " + shown(name) + " data [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") extends past the " + std::to_string(data_size) + " data bytes");
    if (end - begin != nbytes)
      throw Error(where + " has " + std::to_string(end - begin) + " data bytes; its shape and dtype " + dtype +
                  " need " + std::to_string(nbytes));
    // The kernels read an element at a time: each tensor starts at a multiple of its element size.
    if (reinterpret_cast<uintptr_t>(data + begin) % d->bytes != 0)
      throw Error(where + " data is not aligned to its " + std::to_string(d->bytes) + "-byte elements");
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    tensors.push_back(std::move(t));
    ranges.emplace_back(begin, end);
  }
  // The ranges must tile [0, data_size): sorted by begin, each starts where the previous ended.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranges[a] < ranges[b];
  });
  uint64_t covered = 0;
  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(tensors.size());
  for (size_t i : order) {
    if (ranges[i].first != covered)
      throw Error(path + ": tensor " + shown(tensors[i].name) + " data at " + std::to_string(ranges[i].first) +
                  (ranges[i].first < covered ? " overlaps the previous tensor's" : " leaves a gap after byte ") +
                  (ranges[i].first < covered ? "" : std::to_string(covered)));
    covered = ranges[i].second;
    sorted.push_back(std::move(tensors[i]));
  }
  if (covered != data_size)
    throw Error(path + ": " + std::to_string(data_size - covered) + " data bytes after the last tensor belong to none");
  return sorted;
}

}  // namespace fathom
