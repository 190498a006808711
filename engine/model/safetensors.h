#pragma once
// safetensors reader: an 8-byte little-endian header length N, N bytes of JSON
// ({"<name>": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"<key>": "<string>"}}), then the data, which the offsets index from its start.
// The file is untrusted: N is bounded, the JSON's nesting is measured before it is parsed, every
// tensor's dtype is known, its shape's element count times the dtype's size equals its byte range
// (overflow-checked), and the ranges tile the data exactly (no overlap, no gap, nothing past the
// end, as the format's own validator demands). Errors are fathom::Error("<path>: <what>").
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ggml_type.h"

namespace fathom {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as the file names it: "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  // PyTorch order: shape[0] outermost (rows), the last contiguous
  const uint8_t* data;         // into the image
  size_t nbytes;
};

// The header of the largest checkpoints is a few MB; the format's reference reader refuses 100 MB.
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Parses an image of `size` bytes (a mapped shard); `bytes` must outlive the result. Tensors in
// the order of their data.
std::vector<SafetensorsTensor> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& path);

// The ggml type of a safetensors dtype fathom's kernels read (F32, F16, BF16); false otherwise.
bool safetensors_ggml_type(const std::string& dtype, GgmlType& out);

}  // namespace fathom
