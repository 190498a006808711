// GGUF reader tests: facts of the two default models (values computed independently with the
// PyPI `gguf` package's GGUFReader), synthetic v2/v3 files with every value type, and
// malformed files, each of which must throw fathom::Error with a message naming the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "tests/unit/gguf_writer.h"

namespace fathom {
namespace {

const std::string kModels = FATHOM_MODELS_DIR;
const std::string kSmol = kModels + "/smollm2-135m-instruct-q4_1.gguf";
const std::string kGemma = kModels + "/gemma-3-270m-q4_k_m.gguf";

std::string hex(const uint8_t* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += {kHex[p[i] >> 4], kHex[p[i] & 15]};
  return s;
}

// ---- real models (expected values from gguf.GGUFReader 0.19.0) ----

TEST(GgufModel, SmolLM2) {
  auto f = GgufFile::open(kSmol);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 98362432u);
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->require_string("general.architecture"), "llama");
  EXPECT_EQ(f->require_int("llama.block_count"), 30);
  EXPECT_EQ(f->require_int("llama.context_length"), 8192);
  EXPECT_EQ(f->require_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f->require_float("llama.rope.freq_base"), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(f->require_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f->require_string("tokenizer.chat_template").size(), 368u);
  auto tokens = f->get_string_array("tokenizer.ggml.tokens").value();
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[100], "t");
  EXPECT_EQ(tokens.back(), "ectable");
  auto merges = f->get_string_array("tokenizer.ggml.merges").value();
  ASSERT_EQ(merges.size(), 48900u);
  EXPECT_EQ(merges[0], "\xC4\xA0 t");  // "Ġ t"
  auto types = f->get_int_array("tokenizer.ggml.token_type").value();
  EXPECT_EQ(types[0], 3);
  EXPECT_EQ(types[500], 1);
  EXPECT_EQ(f->get_string_array("general.languages"), std::vector<std::string>{"en"});

  ASSERT_EQ(f->tensors().size(), 272u);
  std::map<GgmlType, int> counts;
  size_t total = 0;
  for (const auto& t : f->tensors()) {
    ++counts[t.type];
    total += t.nbytes;
  }
  EXPECT_EQ(counts[GgmlType::F32], 61);
  EXPECT_EQ(counts[GgmlType::Q4_1], 210);
  EXPECT_EQ(counts[GgmlType::Q8_0], 1);
  EXPECT_EQ(total, 96576768u);

  const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->offset, 0u);
  EXPECT_EQ(emb->nbytes, 30081024u);
  EXPECT_EQ(emb->rows(), 49152);
  EXPECT_EQ(emb->elements(), 576 * 49152);
  const GgufTensorInfo* down = f->find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, GgmlType::Q4_1);
  EXPECT_EQ(down->dims, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(down->offset, 30083328u);
  EXPECT_EQ(down->nbytes, 552960u);
  EXPECT_EQ(hex(down->data, 8), "5530d0b802076531");
  EXPECT_EQ(down->data[down->nbytes - 1], 0x27);
  // The data section starts at byte 1785664 of the file.
  EXPECT_EQ(down->data - emb->data, 30083328);
  const GgufTensorInfo* norm = f->find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(hex(norm->data, 8), "0000e13f0000e93f");
  EXPECT_EQ(f->find_tensor("no.such.tensor"), nullptr);
}

TEST(GgufModel, Gemma3) {
  auto f = GgufFile::open(kGemma);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 253113024u);
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->require_string("general.architecture"), "gemma3");
  EXPECT_EQ(f->require_int("gemma3.block_count"), 18);
  EXPECT_EQ(f->require_int("gemma3.context_length"), 32768);
  EXPECT_EQ(f->require_int("gemma3.attention.sliding_window"), 512);
  EXPECT_EQ(f->require_int("gemma3.attention.key_length"), 256);
  EXPECT_EQ(f->require_float("gemma3.rope.freq_base"), 1e6);
  EXPECT_EQ(f->require_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), true);
  auto tokens = f->get_string_array("tokenizer.ggml.tokens").value();
  ASSERT_EQ(tokens.size(), 262144u);
  EXPECT_EQ(tokens[2], "<bos>");
  EXPECT_EQ(tokens[100], "<unused94>");
  EXPECT_EQ(tokens.back(), "<unused6241>");
  auto scores = f->get_float_array("tokenizer.ggml.scores").value();
  ASSERT_EQ(scores.size(), 262144u);
  EXPECT_EQ(scores[0], -1000.0);
  EXPECT_EQ(scores[1000], -506.0);

  ASSERT_EQ(f->tensors().size(), 236u);
  std::map<GgmlType, int> counts;
  size_t total = 0;
  for (const auto& t : f->tensors()) {
    ++counts[t.type];
    total += t.nbytes;
  }
  EXPECT_EQ(counts[GgmlType::F32], 109);
  EXPECT_EQ(counts[GgmlType::Q4_K], 27);
  EXPECT_EQ(counts[GgmlType::Q5_0], 81);
  EXPECT_EQ(counts[GgmlType::Q6_K], 9);
  EXPECT_EQ(counts[GgmlType::Q8_0], 10);
  EXPECT_EQ(total, 246587904u);

  const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{640, 262144}));
  EXPECT_EQ(emb->offset, 2560u);
  EXPECT_EQ(emb->nbytes, 178257920u);
  const GgufTensorInfo* k = f->find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::Q5_0);
  EXPECT_EQ(k->dims, (std::vector<int64_t>{640, 256}));
  EXPECT_EQ(k->offset, 178260480u);
  EXPECT_EQ(k->nbytes, 112640u);
  EXPECT_EQ(hex(k->data, 8), "081c356ef9c93099");
  EXPECT_EQ(k->data[k->nbytes - 1], 0xca);
  const GgufTensorInfo* last = f->find_tensor("blk.17.post_ffw_norm.weight");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->offset, 246585344u);
  EXPECT_EQ(hex(last->data, 8), "0080bc430080a943");
}

// ---- synthetic files (tests/unit/gguf_writer.h) ----

using test::Writer;

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ4_K = 12;
constexpr uint64_t kTwo63Plus5 = (uint64_t{1} << 63) + 5;

// Every value type, nested arrays, an alignment of 64 and three tensors whose data ends
// exactly at the end of the file (so that any truncation cuts real content).
std::vector<uint8_t> full_file(uint32_t version) {
  using T = GgufValueType;
  Writer w;
  w.header(version, 3, 19);
  w.kv("general.alignment", T::UINT32, uint32_t{64});
  w.kv("t.u8", T::UINT8, uint8_t{200}).kv("t.i8", T::INT8, int8_t{-100});
  w.kv("t.u16", T::UINT16, uint16_t{60000}).kv("t.i16", T::INT16, int16_t{-30000});
  w.kv("t.u32", T::UINT32, uint32_t{4000000000u}).kv("t.i32", T::INT32, int32_t{-2000000000});
  w.kv("t.u64", T::UINT64, kTwo63Plus5).kv("t.i64", T::INT64, int64_t{-(int64_t{1} << 40)});
  w.kv("t.f32", T::FLOAT32, 1.5f).kv("t.f64", T::FLOAT64, 2.25);
  w.kv("t.bool", T::BOOL, uint8_t{1});
  w.kv_str("t.str", "h\xC3\xA9llo");
  w.str("t.u32s").type(T::ARRAY).type(T::UINT32).put<uint64_t>(3).put(1u).put(2u).put(3u);
  w.str("t.strs").type(T::ARRAY).type(T::STRING).put<uint64_t>(3).str("a").str("").str("c");
  w.str("t.f32s").type(T::ARRAY).type(T::FLOAT32).put<uint64_t>(2).put(0.5f).put(-1.0f);
  w.str("t.empty").type(T::ARRAY).type(T::UINT8).put<uint64_t>(0);
  // [[1, 2], [3]] as arrays of int16 inside an array of arrays
  w.str("t.nested").type(T::ARRAY).type(T::ARRAY).put<uint64_t>(2);
  w.type(T::INT16).put<uint64_t>(2).put<int16_t>(1).put<int16_t>(2);
  w.type(T::INT16).put<uint64_t>(1).put<int16_t>(3);
  w.str("t.bools").type(T::ARRAY).type(T::BOOL).put<uint64_t>(2).put<uint8_t>(0).put<uint8_t>(1);
  w.tensor("a", {3, 2}, kF32, 0);      // 24 bytes
  w.tensor("b", {64}, kQ4_0, 64);      // 2 blocks of 18 bytes
  w.tensor("c", {256, 1}, kQ4_K, 128); // 1 block of 144 bytes
  w.pad(64).fill(24).pad(64).fill(36, 100).pad(64).fill(144, 7);
  return w.bytes;
}

std::unique_ptr<GgufFile> parse(const std::vector<uint8_t>& b) { return GgufFile::parse(b.data(), b.size(), "mem"); }

void check_full_file(const GgufFile& f) {
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.get_int("t.u8"), 200);
  EXPECT_EQ(f.get_int("t.i8"), -100);
  EXPECT_EQ(f.get_int("t.u16"), 60000);
  EXPECT_EQ(f.get_int("t.i16"), -30000);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000);
  EXPECT_EQ(f.get_int("t.i32"), -2000000000);
  EXPECT_EQ(f.get_int("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(std::get<uint64_t>(*f.find("t.u64")), kTwo63Plus5);
  EXPECT_EQ(f.get_float("t.f32"), 1.5);
  EXPECT_EQ(f.get_float("t.f64"), 2.25);
  EXPECT_EQ(f.get_float("t.i32"), -2000000000.0);  // integers convert to double
  EXPECT_EQ(f.get_bool("t.bool"), true);
  EXPECT_EQ(f.get_string("t.str"), "h\xC3\xA9llo");
  EXPECT_EQ(f.get_int_array("t.u32s"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.get_float_array("t.u32s"), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(f.get_string_array("t.strs"), (std::vector<std::string>{"a", "", "c"}));
  EXPECT_EQ(f.get_float_array("t.f32s"), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f.get_int_array("t.empty"), std::vector<int64_t>{});
  const auto& nested = *std::get<std::shared_ptr<GgufArray>>(*f.find("t.nested"));
  EXPECT_EQ(nested.type, GgufValueType::ARRAY);
  ASSERT_EQ(nested.values.size(), 2u);
  const auto& inner = *std::get<std::shared_ptr<GgufArray>>(nested.values[0]);
  EXPECT_EQ(inner.type, GgufValueType::INT16);
  EXPECT_EQ(std::get<int16_t>(inner.values[1]), 2);
  EXPECT_EQ(std::get<int16_t>(std::get<std::shared_ptr<GgufArray>>(nested.values[1])->values[0]), 3);
  EXPECT_TRUE(std::get<bool>(std::get<std::shared_ptr<GgufArray>>(*f.find("t.bools"))->values[1]));
  EXPECT_EQ(f.get_int("absent"), std::nullopt);
  EXPECT_EQ(f.find("absent"), nullptr);

  ASSERT_EQ(f.tensors().size(), 3u);
  const auto* b = f.find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::Q4_0);
  EXPECT_EQ(b->nbytes, 36u);
  EXPECT_EQ(b->offset, 64u);
  EXPECT_EQ(b->data[0], 100);
  const auto* c = f.find_tensor("c");
  EXPECT_EQ(c->nbytes, 144u);
  EXPECT_EQ(c->data + c->nbytes, f.tensors()[0].data - f.tensors()[0].offset + 128 + 144);
  EXPECT_EQ(f.tensors()[0].elements(), 6);
  EXPECT_EQ(f.tensors()[0].rows(), 2);
}

TEST(GgufSynthetic, EveryValueTypeV3) {
  auto bytes = full_file(3);
  auto f = parse(bytes);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->path(), "mem");
  check_full_file(*f);
  // The tensor data of the last tensor ends exactly at the end of the image.
  EXPECT_EQ(f->tensors()[2].data + 144, bytes.data() + bytes.size());
}

TEST(GgufSynthetic, EveryValueTypeV2) {
  const auto bytes = full_file(2);  // must outlive the GgufFile: tensors point into it
  auto f = parse(bytes);
  EXPECT_EQ(f->version(), 2u);
  check_full_file(*f);
}

TEST(GgufSynthetic, MetadataOnlyFileWithDefaultAlignment) {
  Writer w;
  w.header(3, 0, 1).kv_str("general.architecture", "llama");
  auto f = parse(w.bytes);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->require_string("general.architecture"), "llama");
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufSynthetic, OpenFromDisk) {
  const std::string path = testing::TempDir() + "fathom_gguf_" + std::to_string(getpid()) + ".gguf";
  auto bytes = full_file(3);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->file_size(), bytes.size());
  check_full_file(*f);
  f.reset();
  std::filesystem::remove(path);
}

// ---- getter type errors ----

void expect_error(const std::function<void()>& fn, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing \"" << substring << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
        << "message: " << e.what() << "\nexpected substring: " << substring;
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line message: " << e.what();
  }
}

// Also checks that the message starts with the name of the file ("mem").
void expect_parse_error(const std::vector<uint8_t>& bytes, const std::string& substring) {
  expect_error([&] { parse(bytes); }, substring);
  expect_error([&] { parse(bytes); }, "mem: ");
}

TEST(GgufGetters, TypeMismatchesAreErrors) {
  auto bytes = full_file(3);
  auto f = parse(bytes);
  expect_error([&] { f->get_int("t.u64"); }, "metadata key 't.u64' value 9223372036854775813 does not fit in int64");
  expect_error([&] { f->get_int("t.bool"); }, "'t.bool' has type bool, expected an integer");
  expect_error([&] { f->get_int("t.f32"); }, "has type float32, expected an integer");
  expect_error([&] { f->get_float("t.str"); }, "has type string, expected a number");
  expect_error([&] { f->get_bool("t.u8"); }, "has type uint8, expected bool");
  expect_error([&] { f->get_string("t.strs"); }, "has type array of string, expected string");
  expect_error([&] { f->get_string_array("t.u32s"); }, "has type array of uint32, expected array of string");
  expect_error([&] { f->get_int_array("t.f32s"); }, "expected array of integers");
  expect_error([&] { f->get_float_array("t.strs"); }, "expected array of numbers");
  expect_error([&] { f->get_int_array("t.nested"); }, "has type array of array");
  expect_error([&] { f->require_int("nope"); }, "mem: missing metadata key nope");
  expect_error([&] { f->require_float("nope"); }, "missing metadata key nope");
  expect_error([&] { f->require_string("nope"); }, "missing metadata key nope");
}

// ---- malformed files ----

template <class T>
void patch(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
  for (uint32_t version : {2u, 3u}) {
    const auto bytes = full_file(version);
    for (size_t n = 0; n < bytes.size(); ++n) {
      // A fresh heap copy of exactly n bytes, so that a read past the end is a real overrun.
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
      EXPECT_THROW(GgufFile::parse(cut.data(), cut.size()), Error) << "truncated at " << n;
    }
  }
}

TEST(GgufMalformed, TruncationMessages) {
  Writer w;
  w.header(3, 0, 1).kv("general.alignment", GgufValueType::UINT32, uint32_t{64});
  const auto& b = w.bytes;
  expect_parse_error({b.begin(), b.begin() + 2}, "not a GGUF file (only 2 bytes)");
  expect_parse_error({b.begin(), b.begin() + 20}, "file is truncated: metadata key count needs 8 bytes, 4 left");
  expect_parse_error({b.begin(), b.begin() + 30}, "metadata key count 1 cannot fit in the 6 bytes left (at least 13 bytes per key)");
  expect_parse_error({b.begin(), b.begin() + 40}, "file is truncated: metadata key 0 name length 17 exceeds the 8 bytes left");
  expect_parse_error({b.begin(), b.begin() + 50}, "file is truncated: metadata key 0 ('general.alignment') value type needs 4 bytes, 1 left");
  expect_parse_error({b.begin(), b.begin() + 56}, "file is truncated: metadata key 0 ('general.alignment') uint32 needs 4 bytes, 3 left");
  const auto full = full_file(3);
  expect_parse_error({full.begin(), full.end() - 1}, "tensor 'c' data (offset 128, 144 bytes) extends past the end of the file");
}

TEST(GgufMalformed, BadMagic) {
  auto bytes = full_file(3);
  bytes[0] = 'X';
  expect_parse_error(bytes, "not a GGUF file (bad magic)");
}

TEST(GgufMalformed, Versions) {
  auto bytes = full_file(3);
  patch<uint32_t>(bytes, 4, 1);
  expect_parse_error(bytes, "unsupported GGUF version 1");
  patch<uint32_t>(bytes, 4, 99);
  expect_parse_error(bytes, "unsupported GGUF version 99");
  patch<uint32_t>(bytes, 4, 0x03000000);
  expect_parse_error(bytes, "big-endian GGUF files are not supported");
}

TEST(GgufMalformed, AbsurdCounts) {
  auto bytes = full_file(3);
  patch<uint64_t>(bytes, 8, uint64_t{1} << 60);
  expect_parse_error(bytes, "tensor count 1152921504606846976 cannot fit");
  bytes = full_file(3);
  patch<uint64_t>(bytes, 16, uint64_t{1} << 60);
  expect_parse_error(bytes, "metadata key count 1152921504606846976 cannot fit");
  bytes = full_file(3);
  patch<uint64_t>(bytes, 16, ~uint64_t{0});
  expect_parse_error(bytes, "metadata key count 18446744073709551615 cannot fit");
}

TEST(GgufMalformed, AbsurdStringLength) {
  Writer w;
  w.header(3, 0, 1).kv_str("general.name", "smol").fill(100);
  patch<uint64_t>(w.bytes, 24 + 8 + 12 + 4, 4000000);  // the value's length field
  expect_parse_error(w.bytes, "file is truncated: metadata key 0 ('general.name') string length 4000000 exceeds the 104 bytes left");
  patch<uint64_t>(w.bytes, 24, ~uint64_t{0});  // the key's length field
  expect_parse_error(w.bytes, "metadata key 0 name length 18446744073709551615 exceeds");
}

TEST(GgufMalformed, AbsurdArrayLength) {
  Writer w;
  w.header(3, 0, 1).str("big").type(GgufValueType::ARRAY).type(GgufValueType::UINT8).put<uint64_t>(uint64_t{1} << 62).fill(20);
  expect_parse_error(w.bytes, "metadata key 0 ('big') array of 4611686018427387904 uint8 elements cannot fit in the 20 bytes left");
  Writer s;  // strings need at least 8 bytes each
  s.header(3, 0, 1).str("s").type(GgufValueType::ARRAY).type(GgufValueType::STRING).put<uint64_t>(3).fill(16);
  expect_parse_error(s.bytes, "array of 3 string elements cannot fit in the 16 bytes left");
}

TEST(GgufMalformed, UnknownValueTypes) {
  Writer w;
  w.header(3, 0, 1).str("k").put<uint32_t>(13).fill(8);
  expect_parse_error(w.bytes, "metadata key 0 ('k') has unknown value type 13");
  Writer a;
  a.header(3, 0, 1).str("k").type(GgufValueType::ARRAY).put<uint32_t>(77).put<uint64_t>(1).fill(8);
  expect_parse_error(a.bytes, "has unknown value type 77");
}

TEST(GgufMalformed, ArraysNestedTooDeep) {
  Writer w;
  w.header(3, 0, 1).str("deep");
  w.type(GgufValueType::ARRAY);
  for (int i = 0; i < 1000; ++i) w.type(GgufValueType::ARRAY).put<uint64_t>(1);
  w.type(GgufValueType::UINT8).put<uint64_t>(1).put<uint8_t>(0);
  expect_parse_error(w.bytes, "has arrays nested deeper than 16 levels");
}

TEST(GgufMalformed, DuplicateKey) {
  Writer w;
  w.header(3, 0, 2).kv_str("general.name", "a").kv_str("general.name", "b");
  expect_parse_error(w.bytes, "duplicate metadata key 'general.name' (key 1)");
}

// A file with one kv (alignment) and the given tensor infos followed by `data_bytes` of data.
std::vector<uint8_t> tensor_file(const std::function<void(Writer&)>& infos, uint64_t n_tensors,
                                 size_t data_bytes, uint32_t alignment = 32) {
  Writer w;
  w.header(3, n_tensors, 1).kv("general.alignment", GgufValueType::UINT32, alignment);
  infos(w);
  w.pad(alignment == 0 || (alignment & (alignment - 1)) ? 1 : alignment).fill(data_bytes);
  return w.bytes;
}

TEST(GgufMalformed, UnknownTensorType) {
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("X", {4}, 77, 0); }, 1, 64),
                     "tensor 'X' has unknown type id 77");
}

TEST(GgufMalformed, TensorDataPastEnd) {
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("w", {4, 4}, kF32, 0); }, 1, 63),
                     "file is truncated: tensor 'w' data (offset 0, 64 bytes) extends past the end of the file (data section has 63 bytes)");
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("w", {4}, kF32, uint64_t{1} << 63); }, 1, 64),
                     "tensor 'w' data (offset 9223372036854775808, 16 bytes) extends past the end");
  Writer w;  // the data section itself starts past the end (header padding cut off)
  w.header(3, 1, 0).tensor("w", {1}, kF32, 0);
  expect_parse_error(w.bytes, "file is truncated: the data section starts after byte 57 aligned to 32 but the file has 57 bytes");
}

TEST(GgufMalformed, MisalignedOffset) {
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("w", {4}, kF32, 4); }, 1, 64),
                     "tensor 'w' offset 4 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, BadAlignment) {
  const auto one = [](Writer& w) { w.tensor("w", {4}, kF32, 0); };
  expect_parse_error(tensor_file(one, 1, 64, 0), "general.alignment 0 is not a non-zero power of two");
  expect_parse_error(tensor_file(one, 1, 64, 3), "general.alignment 3 is not a non-zero power of two");
  Writer w;
  w.header(3, 0, 1).kv_str("general.alignment", "32");
  expect_parse_error(w.bytes, "metadata key 'general.alignment' has type string, expected an integer");
  Writer n;
  n.header(3, 0, 1).kv("general.alignment", GgufValueType::INT32, int32_t{-32});
  expect_parse_error(n.bytes, "general.alignment -32 is not a non-zero power of two");
}

TEST(GgufMalformed, DuplicateTensorName) {
  auto two = [](Writer& w) { w.tensor("w", {8}, kF32, 0).tensor("w", {8}, kF32, 32); };
  expect_parse_error(tensor_file(two, 2, 64), "duplicate tensor name 'w' (tensors 0 and 1)");
}

TEST(GgufMalformed, DimsOverflow) {
  const uint64_t big = uint64_t{1} << 32;
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor("w", {big, big}, kF32, 0); }, 1, 64),
                     "tensor 'w' dims [4294967296, 4294967296] element count overflows int64");
  // A zero dimension must not hide an overflow of the others, wherever it is.
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor("w", {0, big, big}, kF32, 0); }, 1, 64),
                     "element count overflows int64");
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor("w", {big, big, 0}, kF32, 0); }, 1, 64),
                     "element count overflows int64");
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor("w", {~uint64_t{0}}, kF32, 0); }, 1, 64),
                     "tensor 'w' dimension 0 is 18446744073709551615, beyond int64");
  // Elements fit in int64 but bytes do not: 2^62 F32 elements are 2^64 bytes.
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor("w", {uint64_t{1} << 62}, kF32, 0); }, 1, 64),
                     "byte size overflows");
}

TEST(GgufSynthetic, EmptyTensor) {
  const auto bytes = tensor_file([](Writer& w) { w.tensor("e", {0, 7}, kQ4_0, 0); }, 1, 0);
  auto f = parse(bytes);
  EXPECT_EQ(f->find_tensor("e")->nbytes, 0u);
  EXPECT_EQ(f->find_tensor("e")->elements(), 0);
  EXPECT_EQ(f->find_tensor("e")->rows(), 7);
}

TEST(GgufMalformed, DimensionCount) {
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("w", {1, 1, 1, 1, 1}, kF32, 0); }, 1, 64),
                     "tensor 'w' has 5 dimensions (1 to 4 allowed)");
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("w", {}, kF32, 0); }, 1, 64),
                     "tensor 'w' has 0 dimensions");
}

TEST(GgufMalformed, RowNotWholeBlocks) {
  expect_parse_error(tensor_file([](Writer& w) { w.tensor("q", {33}, kQ4_0, 0); }, 1, 64),
                     "tensor 'q' of type Q4_0 has dims[0] = 33, not a multiple of the block size 32");
}

TEST(GgufMalformed, HostileNamesAreEscaped) {
  std::string name = "evil\nname'";
  expect_parse_error(tensor_file([&](Writer& w) { w.tensor(name, {4}, 77, 0); }, 1, 64),
                     "tensor 'evil\\x0aname\\x27' has unknown type id 77");
}

TEST(GgufMalformed, FilesOnDisk) {
  expect_error([] { GgufFile::open("/nonexistent/dir/model.gguf"); },
               "/nonexistent/dir/model.gguf: cannot open: No such file or directory");
  expect_error([] { GgufFile::open(testing::TempDir()); }, "cannot open: not a regular file");
  const std::string path = testing::TempDir() + "fathom_gguf_empty_" + std::to_string(getpid()) + ".gguf";
  std::ofstream(path).close();
  expect_error([&] { GgufFile::open(path); }, path + ": not a GGUF file (only 0 bytes)");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fathom
