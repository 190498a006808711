#pragma once
// GGUF reader (versions 2 and 3): header, metadata key/values of every value type, tensor
// infos, alignment, and the tensor data mapped read-only with mmap.
// Every offset, size, count and string length is checked against the file: a truncated or
// malformed file throws fathom::Error with a one-line message naming what is wrong.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kernels/ggml_type.h"

namespace fathom {

class MappedFile;

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// "uint8", "float32", "string", "array", ... (as in the GGUF spec).
const char* gguf_type_name(GgufValueType t);

struct GgufArray;
// One metadata value. Integers of every width are kept in their own alternative so that
// the original type is known; use the typed getters of GgufFile for convenient access.
using GgufValue = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, uint64_t,
                               int64_t, float, double, bool, std::string,
                               std::shared_ptr<GgufArray>>;
struct GgufArray {
  GgufValueType type;
  std::vector<GgufValue> values;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  uint64_t offset;            // relative to the start of the data section
  const uint8_t* data;        // into the mapping
  size_t nbytes;
  int64_t elements() const;
  int64_t rows() const;  // product of dims[1..]
};

class GgufFile {
 public:
  // Throws fathom::Error("<path>: <what is wrong>") on any problem.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image (no mmap; `bytes` must outlive the GgufFile). For fuzzing/tests.
  static std::unique_ptr<GgufFile> parse(const uint8_t* bytes, size_t size, std::string name = "<memory>");
  // The artefacts of a GGUF made by a translation at load (a Hugging Face directory:
  // engine/model/hf_dir.h): metadata, and tensors whose data points into `maps` (the mapped
  // shards) or `owned` (tensors the translation computed). Names must be unique.
  static std::unique_ptr<GgufFile> assemble(std::string path, std::map<std::string, GgufValue> metadata,
                                            std::vector<GgufTensorInfo> tensors,
                                            std::vector<std::shared_ptr<const MappedFile>> maps,
                                            std::vector<std::vector<uint8_t>> owned);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  // Typed access: nullopt when the key is absent; fathom::Error when present with a type that
  // does not convert (any integer type converts to int64 when in range; floats to double).
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;
  // As above but a missing key is fathom::Error("<path>: missing metadata key <key>").
  int64_t require_int(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::string require_string(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Drops the mapped pages wholly inside [p, p + bytes) from this process's memory (they stay in
  // the page cache and fault back in if read again): for tensors whose repacked copy replaced
  // them. No-op for parsed in-memory images and for ranges outside every mapping.
  void release_pages(const void* p, size_t bytes) const;

 private:
  GgufFile() = default;
  void parse_all();

  std::string path_;
  const uint8_t* base_ = nullptr;  // the image parse_all reads (a GGUF file's mapping)
  size_t size_ = 0;
  std::vector<std::shared_ptr<const MappedFile>> maps_;  // what tensors point into
  std::vector<std::vector<uint8_t>> owned_;               // computed tensors' bytes (assemble)
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace fathom
