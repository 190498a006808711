#pragma once
// Reading the JSON files of a Hugging Face model directory (config.json, tokenizer.json, ...):
// bounded in size and nesting before nlohmann parses them, errors naming the file. Shared by the
// config and tokenizer translations (hf_config.h, hf_tokenizer.h).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fathom::hf {

using Json = nlohmann::json;

// `text` parsed as JSON (fathom::Error "<path>: ..." for invalid JSON, nesting over `max_depth`).
Json parse_json(std::string_view text, const std::string& path, int max_depth);

// The file's text; nullopt when it does not exist; fathom::Error when it is over `max_bytes` or
// cannot be read.
std::optional<std::string> read_text_file(const std::string& path, size_t max_bytes);

// A short, printable rendering of a value from outside, for messages.
std::string shown(const Json& v);
std::string shown(std::string_view s);
inline std::string shown(const std::string& s) { return shown(std::string_view(s)); }

// A token id or a list of them (config.json's and generation_config.json's eos/bos_token_id);
// none for null or absent. fathom::Error "<path>: <key> = ... is not a token id" otherwise.
std::vector<int64_t> token_ids(const Json* v, const std::string& path, const char* key);

// Fields of one file's JSON, every refusal "<path>: <what>" (fathom::Error).
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what) const;
  // obj[key]; nullptr when obj is not an object or the key is absent or null.
  const Json* field(const Json& obj, const char* key) const;
  bool flag(const Json& obj, const char* key, bool fallback, const std::string& where) const;
  std::string type_of(const Json& obj, const std::string& where) const;  // obj["type"], a string

 private:
  std::string path_;
};

// A merge of tokenizer.json: "left right", or [left, right] (tokenizers >= 0.20); neither part
// empty nor holding a space.
std::pair<std::string, std::string> merge_parts(const Reader& r, const Json& m);

}  // namespace fathom::hf
