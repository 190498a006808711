#pragma once
// A regular file mapped read-only (mmap): the bytes a GGUF file or a safetensors shard holds,
// read in place by the weight views. Owned by whatever GgufFile points into it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fathom {

class MappedFile {
 public:
  // Throws fathom::Error("<path>: cannot open/stat/mmap: ...", or "not a regular file").
  // An empty file maps to {nullptr, 0}.
  static std::unique_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool contains(const void* p, size_t bytes) const;
  // Drops the pages wholly inside [p, p + bytes) from this process's memory (they stay in the page
  // cache and fault back in if read again). No-op for a range outside the mapping.
  void release_pages(const void* p, size_t bytes) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fathom
