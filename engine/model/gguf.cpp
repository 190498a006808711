// GGUF reader: parses the header, metadata and tensor infos of a GGUF v2/v3 file with a
// bounds-checked cursor. The file is untrusted input: every count, length and offset is
// checked against the bytes that are actually there before it is used or allocated for.
#include "engine/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "engine/model/mapped_file.h"

namespace fathom {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields straight into host integers");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 16;       // bounds recursion on nested arrays (stack safety)
constexpr uint64_t kMaxReserve = 1 << 16;  // larger vectors grow as real data is parsed
// Smallest possible encodings, used to reject impossible counts before allocating:
// a key/value is a key length (8) + value type (4) + a 1-byte value;
// a tensor info is a name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// A name from the file, quoted for a one-line message: control and non-ASCII bytes are
// escaped and long names are cut, so a hostile name cannot forge or flood the log.
std::string quoted(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += cat("\\x", kHex[c >> 4], kHex[c & 15]);
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out + "'";
}

// Bounds-checked little-endian reader over the file image. It also knows which item it is
// reading ("metadata key 3 ('general.name')" and indices in enclosing arrays) so that every
// error names the place in the file.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  template <class T>
  T read(const char* what) {
    if (left() < sizeof(T)) truncated(cat(what, " needs ", sizeof(T), " bytes, ", left(), " left"));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  // A GGUF string: uint64 byte length, then the bytes (not NUL-terminated).
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left()) truncated(cat(what, " length ", n, " exceeds the ", left(), " bytes left"));
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  void set_item(std::string item) {
    item_ = std::move(item);
    indices_.clear();
  }
  void enter_array() { indices_.push_back(0); }
  void set_index(uint64_t i) { indices_.back() = i; }
  void leave_array() { indices_.pop_back(); }

  // "<path>: <item>[i][j] <what>"
  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + where() + what); }
  [[noreturn]] void truncated(const std::string& what) const {
    throw Error(path_ + ": file is truncated: " + where() + what);
  }

 private:
  std::string where() const {
    std::string w = item_;
    for (uint64_t i : indices_) w += cat("[", i, "]");
    return w.empty() ? w : w + " ";
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
  std::string item_;
  std::vector<uint64_t> indices_;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

// ---- metadata values ----

GgufValueType read_value_type(Cursor& cur, const char* what) {
  const uint32_t id = cur.read<uint32_t>(what);
  if (id > static_cast<uint32_t>(GgufValueType::FLOAT64)) cur.fail(cat("has unknown value type ", id));
  return static_cast<GgufValueType>(id);
}

uint64_t min_encoded_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    case GgufValueType::STRING: return 8;      // the length of an empty string
    case GgufValueType::ARRAY: return 4 + 8;   // element type + length of an empty array
  }
  return 1;  // unreachable: the type id was validated by read_value_type
}

template <class T>
GgufValue read_scalar(Cursor& cur, GgufValueType t) {
  return GgufValue{std::in_place_type<T>, cur.read<T>(gguf_type_name(t))};
}

GgufValue read_value(Cursor& cur, GgufValueType type, int depth);

std::shared_ptr<GgufArray> read_array(Cursor& cur, int depth) {
  if (depth >= kMaxArrayDepth) cur.fail(cat("has arrays nested deeper than ", kMaxArrayDepth, " levels"));
  auto array = std::make_shared<GgufArray>();
  array->type = read_value_type(cur, "array element type");
  const uint64_t n = cur.read<uint64_t>("array length");
  const uint64_t min_size = min_encoded_size(array->type);
  if (n > cur.left() / min_size)
    cur.fail(cat("array of ", n, " ", gguf_type_name(array->type), " elements cannot fit in the ",
                 cur.left(), " bytes left"));
  array->values.reserve(std::min(n, kMaxReserve));
  cur.enter_array();
  for (uint64_t i = 0; i < n; ++i) {
    cur.set_index(i);
    array->values.push_back(read_value(cur, array->type, depth + 1));
  }
  cur.leave_array();
  return array;
}

GgufValue read_value(Cursor& cur, GgufValueType type, int depth) {
  switch (type) {
    case GgufValueType::UINT8: return read_scalar<uint8_t>(cur, type);
    case GgufValueType::INT8: return read_scalar<int8_t>(cur, type);
    case GgufValueType::UINT16: return read_scalar<uint16_t>(cur, type);
    case GgufValueType::INT16: return read_scalar<int16_t>(cur, type);
    case GgufValueType::UINT32: return read_scalar<uint32_t>(cur, type);
    case GgufValueType::INT32: return read_scalar<int32_t>(cur, type);
    case GgufValueType::UINT64: return read_scalar<uint64_t>(cur, type);
    case GgufValueType::INT64: return read_scalar<int64_t>(cur, type);
    case GgufValueType::FLOAT32: return read_scalar<float>(cur, type);
    case GgufValueType::FLOAT64: return read_scalar<double>(cur, type);
    // Writers emit 0/1; any other byte is read as true, as ggml does, rather than rejected.
    case GgufValueType::BOOL: return GgufValue{std::in_place_type<bool>, cur.read<uint8_t>("bool") != 0};
    case GgufValueType::STRING: return GgufValue{std::in_place_type<std::string>, cur.read_string("string")};
    case GgufValueType::ARRAY: return GgufValue{read_array(cur, depth)};
  }
  cur.fail("has an invalid value type");  // unreachable: validated by read_value_type
}

// ---- header ----

struct Header {
  uint32_t version;
  uint64_t n_tensors;
  uint64_t n_kv;
};

void check_version(const std::string& path, uint32_t version) {
  if (version == 2 || version == 3) return;
  // A big-endian file (allowed by v3) shows its version byte-swapped.
  const uint32_t swapped = __builtin_bswap32(version);
  if (swapped == 2 || swapped == 3) fail(path, "big-endian GGUF files are not supported");
  fail(path, cat("unsupported GGUF version ", version, " (fathom reads versions 2 and 3)"));
}

Header read_header(Cursor& cur, const std::string& path) {
  if (cur.left() < 4) fail(path, cat("not a GGUF file (only ", cur.left(), " bytes)"));
  if (cur.read<uint32_t>("magic") != kMagic) fail(path, "not a GGUF file (bad magic)");
  Header h;
  h.version = cur.read<uint32_t>("version");
  check_version(path, h.version);
  h.n_tensors = cur.read<uint64_t>("tensor count");
  h.n_kv = cur.read<uint64_t>("metadata key count");
  // Reject counts the rest of the file cannot hold, before anything is sized by them.
  const uint64_t left = cur.left();
  if (h.n_kv > left / kMinKvBytes)
    fail(path, cat("metadata key count ", h.n_kv, " cannot fit in the ", left, " bytes left (at least ",
                   kMinKvBytes, " bytes per key)"));
  const uint64_t left_for_tensors = left - h.n_kv * kMinKvBytes;
  if (h.n_tensors > left_for_tensors / kMinTensorInfoBytes)
    fail(path, cat("tensor count ", h.n_tensors, " cannot fit in the ", left_for_tensors,
                   " bytes left after the metadata (at least ", kMinTensorInfoBytes, " bytes per tensor info)"));
  return h;
}

std::map<std::string, GgufValue> read_metadata(Cursor& cur, uint64_t n_kv, const std::string& path) {
  std::map<std::string, GgufValue> metadata;
  for (uint64_t i = 0; i < n_kv; ++i) {
    cur.set_item(cat("metadata key ", i));
    std::string key = cur.read_string("name");
    cur.set_item(cat("metadata key ", i, " (", quoted(key), ")"));
    const GgufValueType type = read_value_type(cur, "value type");
    GgufValue value = read_value(cur, type, 0);
    if (metadata.count(key)) fail(path, cat("duplicate metadata key ", quoted(key), " (key ", i, ")"));
    metadata.emplace(std::move(key), std::move(value));
  }
  return metadata;
}

// ---- tensor infos ----

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += cat(i ? ", " : "", dims[i]);
  return s + "]";
}

// Bytes of the tensor: whole blocks per row times rows, all overflow-checked.
size_t tensor_nbytes(const Cursor& cur, const GgufTensorInfo& t, const GgmlTypeInfo& info) {
  // Every partial product of the dims must fit in int64, since users multiply any subset of
  // them; so zeros are skipped: [0, 2^32, 2^32] is rejected although it has 0 elements.
  int64_t nonzero_product = 1;
  for (int64_t d : t.dims)
    if (d != 0 && __builtin_mul_overflow(nonzero_product, d, &nonzero_product))
      cur.fail(cat("dims ", dims_text(t.dims), " element count overflows int64"));
  const int64_t rows = t.rows();
  if (t.dims[0] % info.block_size != 0)
    cur.fail(cat("of type ", info.name, " has dims[0] = ", t.dims[0],
                 ", not a multiple of the block size ", info.block_size));
  uint64_t row_bytes = 0, nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.dims[0] / info.block_size),
                             static_cast<uint64_t>(info.type_size), &row_bytes) ||
      __builtin_mul_overflow(row_bytes, static_cast<uint64_t>(rows), &nbytes) || nbytes > kMaxInt64)
    cur.fail(cat("dims ", dims_text(t.dims), " of type ", info.name, " byte size overflows"));
  return static_cast<size_t>(nbytes);
}

GgufTensorInfo read_tensor_info(Cursor& cur, uint64_t index) {
  GgufTensorInfo t{};
  cur.set_item(cat("tensor ", index));
  t.name = cur.read_string("name");
  cur.set_item(cat("tensor ", quoted(t.name)));
  const uint32_t n_dims = cur.read<uint32_t>("dimension count");
  if (n_dims == 0 || n_dims > kMaxDims)
    cur.fail(cat("has ", n_dims, " dimensions (1 to ", kMaxDims, " allowed)"));
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim = cur.read<uint64_t>("dimension");
    if (dim > kMaxInt64) cur.fail(cat("dimension ", d, " is ", dim, ", beyond int64"));
    t.dims.push_back(static_cast<int64_t>(dim));
  }
  const uint32_t type_id = cur.read<uint32_t>("type id");
  const GgmlTypeInfo* info = ggml_type_info(type_id);
  if (!info) cur.fail(cat("has unknown type id ", type_id));
  t.type = static_cast<GgmlType>(type_id);
  t.offset = cur.read<uint64_t>("offset");
  t.nbytes = tensor_nbytes(cur, t, *info);
  return t;
}

// Points each tensor into the data section, which starts at the first aligned byte after
// the tensor infos; offsets are relative to it.
void place_tensors(std::vector<GgufTensorInfo>& tensors, const uint8_t* base, size_t size,
                   size_t infos_end, uint64_t alignment, const std::string& path) {
  if (tensors.empty()) return;  // a metadata-only file needs no data section
  uint64_t rounded_up = 0;  // alignment is a power of two: round up by masking
  const bool overflow = __builtin_add_overflow(infos_end, alignment - 1, &rounded_up);
  const uint64_t data_start = rounded_up & ~(alignment - 1);
  if (overflow || data_start > size)
    fail(path, cat("file is truncated: the data section starts after byte ", infos_end,
                   " aligned to ", alignment, " but the file has ", size, " bytes"));
  const uint64_t data_size = size - data_start;
  for (GgufTensorInfo& t : tensors) {
    if (t.offset % alignment != 0)
      fail(path, cat("tensor ", quoted(t.name), " offset ", t.offset,
                     " is not a multiple of the alignment ", alignment));
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(path, cat("file is truncated: tensor ", quoted(t.name), " data (offset ", t.offset, ", ",
                     t.nbytes, " bytes) extends past the end of the file (data section has ",
                     data_size, " bytes)"));
    t.data = base + data_start + t.offset;
  }
}

}  // namespace

int64_t GgufTensorInfo::rows() const {
  int64_t n = 1;
  for (size_t d = 1; d < dims.size(); ++d) n *= dims[d];  // overflow excluded by the parser
  return n;
}

int64_t GgufTensorInfo::elements() const { return dims.empty() ? 1 : dims[0] * rows(); }

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  std::shared_ptr<const MappedFile> map = MappedFile::open(path);
  file->base_ = map->data();
  file->size_ = map->size();  // an empty file is reported by parse_all
  file->maps_.push_back(std::move(map));
  file->parse_all();
  return file;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* bytes, size_t size, std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(name);
  file->base_ = bytes;
  file->size_ = size;
  file->parse_all();
  return file;
}

std::unique_ptr<GgufFile> GgufFile::assemble(std::string path, std::map<std::string, GgufValue> metadata,
                                             std::vector<GgufTensorInfo> tensors,
                                             std::vector<std::shared_ptr<const MappedFile>> maps,
                                             std::vector<std::vector<uint8_t>> owned) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(path);
  file->version_ = 3;
  file->metadata_ = std::move(metadata);
  file->tensors_ = std::move(tensors);
  file->maps_ = std::move(maps);
  file->owned_ = std::move(owned);  // moving the outer vector keeps each buffer where it is
  for (size_t i = 0; i < file->tensors_.size(); ++i)
    if (!file->tensor_index_.emplace(file->tensors_[i].name, i).second)
      fail(file->path_, cat("duplicate tensor name ", quoted(file->tensors_[i].name)));
  return file;
}

void GgufFile::release_pages(const void* p, size_t bytes) const {
  for (const auto& map : maps_)
    if (map->contains(p, bytes)) map->release_pages(p, bytes);
}

GgufFile::~GgufFile() = default;

void GgufFile::parse_all() {
  Cursor cur(base_, size_, path_);
  const Header h = read_header(cur, path_);
  version_ = h.version;
  metadata_ = read_metadata(cur, h.n_kv, path_);
  // general.alignment: any integer type converts (the spec says uint32); get_int rejects others.
  const int64_t alignment = get_int("general.alignment").value_or(32);
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
    fail(path_, cat("general.alignment ", alignment, " is not a non-zero power of two"));
  alignment_ = static_cast<uint64_t>(alignment);

  tensors_.reserve(std::min(h.n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    tensors_.push_back(read_tensor_info(cur, i));
    const std::string& name = tensors_.back().name;
    if (!tensor_index_.emplace(name, tensors_.size() - 1).second)
      fail(path_, cat("duplicate tensor name ", quoted(name), " (tensors ", tensor_index_[name], " and ", i, ")"));
  }
  place_tensors(tensors_, base_, size_, cur.pos(), alignment_, path_);
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace fathom
