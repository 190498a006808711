// libFuzzer target for what a Hugging Face directory feeds the loader (engine/model/hf_dir.h): the
// first byte picks the file, the rest is its bytes.
//   0  a safetensors shard -> parse_safetensors; every tensor's bytes touched (ASan checks the
//      bounds the parser promised), sizes and order checked; its tensors as gpt-oss's fused experts
//      of a 2-layer model (hf_gpt_oss.h: 2 experts of 32, hidden 32) transposed, split and repacked,
//      every GGUF tensor made the size its type and dims say
//   1  config.json -> hf_config_from_json; the metadata it makes -> ModelConfig::from_gguf
//   2  tokenizer.json (byte-level or SentencePiece-style) -> hf_tokenizer_metadata ->
//      Tokenizer::from_gguf -> encode and decode (a SentencePiece one stops at from_gguf: ASan
//      cannot load the libsentencepiece module, which needs RTLD_DEEPBIND)
//   3  tokenizer_config.json, then after a NUL byte generation_config.json, beside a fixed valid
//      tokenizer.json
// fathom::Error (one line, naming the file) is the expected outcome for bad input; any other
// exception, crash, sanitizer report, leak or hang is a bug.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_config.h"
#include "engine/model/hf_gpt_oss.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tokenizer.h"

namespace {

// A byte-level vocabulary of 4 tokens, one merge, one special token, Qwen 2's regex.
constexpr std::string_view kTokenizer = R"({"added_tokens": [{"id": 4, "content": "<|end|>", "special": true}],
 "normalizer": {"type": "NFC"},
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
   {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
   {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
 "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": [["a", "b"]]}})";
constexpr int64_t kRows = 8;
// Mode 2's embedding rows: room for a SentencePiece-style vocabulary (256 byte tokens and more) and
// the fixtures' 1000 tokens, so that seeds reach the merges and the tokenizer.
constexpr int64_t kTokenizerRows = 1024;

void expect_error_line(const fathom::Error& e, std::string_view prefix) {
  const std::string msg = e.what();
  if (msg.rfind(prefix, 0) != 0 || msg.find('\n') != std::string::npos) __builtin_trap();
}

void shard(const uint8_t* data, size_t size) {
  try {
    const auto tensors = fathom::parse_safetensors(data, size, "fuzz");
    volatile uint8_t sink = 0;
    const uint8_t* last_end = nullptr;
    for (const auto& t : tensors) {
      if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size) __builtin_trap();
      if (last_end && t.data != last_end) __builtin_trap();  // the ranges tile the data
      last_end = t.data + t.nbytes;
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    }
    if (last_end && last_end != data + size) __builtin_trap();
    fathom::GptOssExperts experts(2, 2, 32, 32);
    for (const auto& t : tensors) experts.take(t, "fuzz");
    std::vector<fathom::GgufTensorInfo> out;
    std::vector<std::vector<uint8_t>> owned;
    experts.emit(out, owned);
    for (const auto& t : out) {
      if (t.dims.empty() || t.dims[0] % fathom::ggml_info(t.type).block_size != 0) __builtin_trap();
      if (t.nbytes != fathom::ggml_row_size(t.type, t.dims[0]) * static_cast<size_t>(t.rows())) __builtin_trap();
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    }
  } catch (const fathom::Error& e) {
    expect_error_line(e, "fuzz: ");
  }
}

void config(std::string_view text) {
  try {
    fathom::HfConfig c = fathom::hf_config_from_json(text, "config.json");
    auto f = fathom::GgufFile::assemble("fuzz", std::move(c.metadata), {}, {}, {});
    (void)fathom::ModelConfig::from_gguf(*f);
  } catch (const fathom::Error& e) {
    const std::string msg = e.what();
    if (msg.find('\n') != std::string::npos) __builtin_trap();
  }
}

void tokenizer(const fathom::HfTokenizerFiles& files, int64_t rows) {
  std::map<std::string, fathom::GgufValue> metadata;
  try {
    fathom::hf_tokenizer_metadata(files, rows, {}, std::nullopt, metadata);
    auto f = fathom::GgufFile::assemble("fuzz", std::move(metadata), {}, {}, {});
    auto tok = fathom::Tokenizer::from_gguf(*f);
    const auto ids = tok->encode("ab a<|end|>b 12 \xE2\x82\xAC");
    (void)tok->decode(ids);
  } catch (const fathom::Error& e) {
    const std::string msg = e.what();
    if (msg.find('\n') != std::string::npos) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  fathom::HfTokenizerFiles files;
  files.dir = "fuzz";
  switch (data[0] % 4) {
    case 0:
      shard(data + 1, size - 1);
      break;
    case 1:
      config(rest);
      break;
    case 2:
      files.tokenizer_json = std::string(rest);
      tokenizer(files, kTokenizerRows);
      break;
    case 3: {
      files.tokenizer_json = std::string(kTokenizer);
      const size_t nul = rest.find('\0');
      files.tokenizer_config_json = std::string(rest.substr(0, nul));
      if (nul != std::string_view::npos) files.generation_config_json = std::string(rest.substr(nul + 1));
      tokenizer(files, kRows);
      break;
    }
  }
  return 0;
}
