#include "engine/model/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <unordered_map>

#include "base/error.h"
#include "engine/model/hf_json.h"
#include "engine/model/hf_sentencepiece.h"

namespace fathom {
namespace {

using hf::Json;
using hf::Reader;
using hf::shown;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // llama.cpp's token types
constexpr int kMaxDepth = 16;  // tokenizer.json: Sequence > Split > pattern, merges as pairs: 5 levels

// The Split regexes of the pre-tokenizers bpe_pretokenizer.h implements, as tokenizer.json writes
// them, and the tokenizer.ggml.pre name each becomes.
struct KnownSplit {
  std::string_view regex;
  const char* pre;          // without ignore_merges
  const char* pre_ignore;   // with ignore_merges (nullptr: that combination is not implemented); the
                            // metadata's fathom.ignore_merges says it where the name does not (gpt-4o)
};
constexpr KnownSplit kSplits[] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "smaug-bpe", "llama3"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2", nullptr},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen35", nullptr},
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt2", nullptr},
    // tiktoken's o200k (GPT-4o, gpt-oss): transformers' TikTokenConverter writes it with ignore_merges.
    {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
     R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
     R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "gpt-4o", "gpt-4o"},
};

// The Split sequences of DeepSeek's tokenizer.json (each Split "Isolated", then ByteLevel without
// its regex), as the published files write them ("\r\n" as the characters CR LF), and the
// tokenizer.ggml.pre name each becomes. CJK ranges: U+4E00-9FA5, U+3040-309F, U+30A0-30FF (V3);
// U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF (Coder).
struct KnownSequence {
  std::vector<std::string_view> regexes;
  const char* pre;
};
const KnownSequence kSequences[] = {
    {{R"(\p{N}{1,3})", "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
     "deepseek-v3"},
    {{"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+", R"(\p{N})"},
     "deepseek-coder"},
};

// A ByteLevel step with the only settings fathom implements: no prefix space; `use_regex` as given.
bool is_byte_level(const Reader& r, const Json& p, bool use_regex) {
  if (!p.is_object() || r.type_of(p, "pre_tokenizer") != "ByteLevel") return false;
  if (r.flag(p, "add_prefix_space", false, "ByteLevel"))
    r.fail("pre_tokenizer ByteLevel add_prefix_space = true is not supported (a space before the text)");
  return r.flag(p, "use_regex", true, "ByteLevel") == use_regex;
}

// The regex of a Split step, "Isolated" and not inverted.
const std::string& split_regex(const Reader& r, const Json& step) {
  const Json* pattern = r.field(step, "pattern");
  const Json* regex = pattern ? r.field(*pattern, "Regex") : nullptr;
  if (!regex || !regex->is_string()) r.fail("pre_tokenizer Split without a Regex pattern is not supported");
  const Json* behavior = r.field(step, "behavior");
  if (!behavior || *behavior != Json("Isolated") || r.flag(step, "invert", false, "Split"))
    r.fail("pre_tokenizer Split other than behavior Isolated, invert false is not supported");
  return regex->get_ref<const std::string&>();
}

// tokenizer.ggml.pre for a Sequence of several Splits then ByteLevel(use_regex=false): DeepSeek's.
std::string split_sequence_name(const Reader& r, const Json& steps, bool ignore_merges) {
  std::vector<std::string> regexes;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    if (!steps[i].is_object() || r.type_of(steps[i], "pre_tokenizer") != "Split")
      r.fail("pre_tokenizer Sequence step " + shown(steps[i]) + " is not supported (Splits, then ByteLevel)");
    regexes.push_back(split_regex(r, steps[i]));
  }
  if (!is_byte_level(r, steps[steps.size() - 1], false))
    r.fail("pre_tokenizer Sequence of Splits does not end in ByteLevel without its regex");
  for (const KnownSequence& known : kSequences) {
    if (!std::equal(regexes.begin(), regexes.end(), known.regexes.begin(), known.regexes.end())) continue;
    if (ignore_merges) r.fail("ignore_merges with the " + std::string(known.pre) + " pre-tokenizer is not supported");
    return known.pre;
  }
  std::string list;
  for (const std::string& re : regexes) list += (list.empty() ? "" : ", ") + shown(re);
  r.fail("pre_tokenizer Split regexes " + list + " are not a sequence fathom implements (DeepSeek V3's or Coder's)");
}

// tokenizer.ggml.pre for the pre_tokenizer of tokenizer.json.
std::string pre_tokenizer_name(const Reader& r, const Json& tok, bool ignore_merges) {
  const Json* p = r.field(tok, "pre_tokenizer");
  if (!p) r.fail("no pre_tokenizer: fathom reads byte-level BPE vocabularies only");
  std::string pre;
  if (is_byte_level(r, *p, true)) {
    pre = "gpt2";  // ByteLevel's own regex is GPT-2's
  } else if (r.type_of(*p, "pre_tokenizer") == "Sequence") {
    const Json* steps = r.field(*p, "pretokenizers");
    if (steps && steps->is_array() && steps->size() > 2) return split_sequence_name(r, *steps, ignore_merges);
    if (!steps || !steps->is_array() || steps->size() != 2)
      r.fail("pre_tokenizer Sequence " + shown(*p) + " is not one fathom implements");
    const Json& first = (*steps)[0];
    const Json& second = (*steps)[1];
    if (first.is_object() && r.type_of(first, "pre_tokenizer") == "Digits" && is_byte_level(r, second, true)) {
      if (!r.flag(first, "individual_digits", false, "Digits"))
        r.fail("pre_tokenizer Digits without individual_digits is not supported");
      pre = "smollm";
    } else if (first.is_object() && r.type_of(first, "pre_tokenizer") == "Split" && is_byte_level(r, second, false)) {
      const std::string& re = split_regex(r, first);
      const auto known = std::find_if(std::begin(kSplits), std::end(kSplits),
                                      [&](const KnownSplit& s) { return s.regex == re; });
      if (known == std::end(kSplits))
        r.fail("pre_tokenizer Split regex " + shown(re) +
               " is not one fathom implements (Llama 3's, Qwen 2's, Qwen 3.5's, GPT-2's or GPT-4o's)");
      if (ignore_merges && !known->pre_ignore)
        r.fail("ignore_merges with the " + std::string(known->pre) + " pre-tokenizer is not supported");
      return ignore_merges ? known->pre_ignore : known->pre;
    } else {
      r.fail("pre_tokenizer Sequence " + shown(*p) + " is not one fathom implements");
    }
  } else {
    r.fail("pre_tokenizer " + shown(*p) + " is not one fathom implements");
  }
  if (ignore_merges) r.fail("ignore_merges with the " + pre + " pre-tokenizer is not supported");
  return pre;
}

// Whether the model is a SentencePiece-style BPE (byte_fallback: Llama 2, Mistral, Gemma) rather
// than a byte-level one.
bool check_model(const Reader& r, const Json& model) {
  if (!model.is_object()) r.fail("no model object");
  const std::string type = r.type_of(model, "model");
  if (type != "BPE")
    r.fail("model type " + shown(type) + " is not supported (BPE only: byte-level, or SentencePiece-style with "
           "byte_fallback)");
  if (const Json* d = r.field(model, "dropout"); d && *d != Json(0) && *d != Json(0.0))
    r.fail("model dropout = " + shown(*d) + " is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json* v = r.field(model, key); v && *v != Json(""))
      r.fail(std::string("model ") + key + " = " + shown(*v) + " is not supported");
  return r.flag(model, "byte_fallback", false, "model");
}

// Whether the text is put in NFC (Qwen 2/3) before pre-tokenization; any other normalizer is refused.
bool check_normalizer_and_decoder(const Reader& r, const Json& tok) {
  bool nfc = false;
  if (const Json* n = r.field(tok, "normalizer")) {
    const std::string type = r.type_of(*n, "normalizer");
    const Json* steps = r.field(*n, "normalizers");
    nfc = type == "NFC";
    if (!(nfc || (type == "Sequence" && steps && steps->is_array() && steps->empty())))
      r.fail("normalizer " + shown(*n) + " is not supported (none or NFC)");
  }
  if (const Json* d = r.field(tok, "decoder"); d && r.type_of(*d, "decoder") != "ByteLevel")
    r.fail("decoder " + shown(*d) + " is not supported (ByteLevel)");
  return nfc;
}

// The token a TemplateProcessing post-processor puts before the text (Llama 3's BOS), "" when none;
// one that adds tokens after the text (an EOS) is refused: fathom's prompts would lack it.
std::string template_prefix(const Reader& r, const Json& tok) {
  const Json* pp = r.field(tok, "post_processor");
  if (!pp) return "";
  std::string type = r.type_of(*pp, "post_processor");
  const Json* steps = r.field(*pp, "processors");
  const Json* templ = nullptr;
  if (type == "TemplateProcessing") templ = pp;
  if (type == "Sequence" && steps && steps->is_array()) {
    for (const Json& s : *steps) {
      if (s.is_object() && r.type_of(s, "post_processor") == "TemplateProcessing") {
        templ = &s;
      } else if (!s.is_object() || r.type_of(s, "post_processor") != "ByteLevel") {
        r.fail("post_processor step " + shown(s) + " is not supported");
      }
    }
  }
  if (!templ) {
    if (type == "ByteLevel" || type == "Sequence") return "";
    r.fail("post_processor " + shown(*pp) + " is not supported");
  }
  const Json* single = r.field(*templ, "single");
  if (!single || !single->is_array()) r.fail("post_processor TemplateProcessing has no single template");
  std::string prefix;
  bool seen_text = false;
  for (const Json& piece : *single) {
    if (r.field(piece, "Sequence")) {
      seen_text = true;
      continue;
    }
    const Json* special = r.field(piece, "SpecialToken");
    const Json* id = special ? r.field(*special, "id") : nullptr;
    if (!id || !id->is_string() || seen_text || !prefix.empty())
      r.fail("post_processor template " + shown(*single) + " is not supported (at most one token before the text)");
    prefix = id->get<std::string>();
  }
  return prefix;
}

// A token string of tokenizer_config.json: "..." or {"content": "..."} (an AddedToken).
std::optional<std::string> token_text(const Reader& r, const Json& cfg, const char* key) {
  const Json* v = r.field(cfg, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  const Json* c = r.field(*v, "content");
  if (!c || !c->is_string()) r.fail(std::string(key) + " = " + shown(*v) + " is not a token");
  return c->get<std::string>();
}

GgufValue string_array(std::vector<std::string> v) {
  auto a = std::make_shared<GgufArray>();
  a->type = GgufValueType::STRING;
  a->values.reserve(v.size());
  for (std::string& s : v) a->values.emplace_back(std::in_place_type<std::string>, std::move(s));
  return GgufValue{a};
}

GgufValue float_array(const std::vector<float>& v) {
  auto a = std::make_shared<GgufArray>();
  a->type = GgufValueType::FLOAT32;
  a->values.reserve(v.size());
  for (float x : v) a->values.emplace_back(std::in_place_type<float>, x);
  return GgufValue{a};
}

GgufValue int_array(const std::vector<int32_t>& v) {
  auto a = std::make_shared<GgufArray>();
  a->type = GgufValueType::INT32;
  a->values.reserve(v.size());
  for (int32_t x : v) a->values.emplace_back(std::in_place_type<int32_t>, x);
  return GgufValue{a};
}

}  // namespace

void hf_tokenizer_metadata(const HfTokenizerFiles& files, int64_t vocab_rows, const std::vector<int64_t>& config_eos,
                           std::optional<int64_t> config_bos, std::map<std::string, GgufValue>& metadata) {
  const Reader r(files.dir + "/tokenizer.json");
  const Json tok = hf::parse_json(files.tokenizer_json, r.path(), kMaxDepth);
  if (!tok.is_object()) r.fail("not a JSON object");
  const Json* model = r.field(tok, "model");
  if (!model) r.fail("no model");
  const bool spm = check_model(r, *model);
  const bool ignore_merges = r.flag(*model, "ignore_merges", false, "model");
  bool nfc = false;
  std::string pre;
  hf::SpmText spm_text;
  if (spm) {
    // A word that is itself a token is that token: libsentencepiece has no such rule.
    if (ignore_merges) r.fail("ignore_merges with byte_fallback (a SentencePiece-style BPE) is not supported");
    spm_text = hf::spm_text(r, tok);
  } else {
    nfc = check_normalizer_and_decoder(r, tok);
    pre = pre_tokenizer_name(r, tok, ignore_merges);
  }

  // Tokens by id: the model's vocabulary, then the added tokens; holes and the rows the embedding
  // has beyond them are unused "[PAD<i>]" tokens (as llama.cpp's converter fills them).
  const Json* vocab = r.field(*model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty()) r.fail("model vocab is not a non-empty object");
  std::vector<std::string> tokens(static_cast<size_t>(vocab_rows));
  std::vector<int32_t> types(static_cast<size_t>(vocab_rows), 0);
  auto place = [&](int64_t id, const std::string& text, int32_t type, const char* what) {
    if (id < 0 || id >= vocab_rows)
      r.fail(std::string(what) + " " + shown(text) + " has id " + std::to_string(id) + ", outside the model's " +
             std::to_string(vocab_rows) + " embedding rows (config.json vocab_size)");
    if (types[id] != 0 && tokens[id] != text)
      r.fail(std::string(what) + " " + shown(text) + " and " + shown(tokens[id]) + " share id " + std::to_string(id));
    tokens[id] = text;
    types[id] = type;
  };
  for (const auto& [text, id] : vocab->items()) {
    if (!id.is_number_integer()) r.fail("vocab entry " + shown(text) + " has id " + shown(id));
    place(id.get<int64_t>(), text, kNormal, "vocab token");
  }
  std::unordered_map<std::string, int64_t> added_ids;
  if (const Json* added = r.field(tok, "added_tokens")) {
    if (!added->is_array()) r.fail("added_tokens is not a list");
    for (const Json& t : *added) {
      const Json* id = r.field(t, "id");
      const Json* content = r.field(t, "content");
      if (!id || !id->is_number_integer() || !content || !content->is_string() || content->get_ref<const std::string&>().empty())
        r.fail("added token " + shown(t) + " lacks an id or content");
      const std::string& text = content->get_ref<const std::string&>();
      // lstrip/rstrip/single_word change where an added token matches: not implemented.
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (r.flag(t, key, false, "added token " + shown(text)))
          r.fail("added token " + shown(text) + " has " + key + " = true, which fathom does not implement");
      // tokenizers matches a normalized added token in the escaped text, after the ▁ prefix.
      if (spm && r.flag(t, "normalized", false, "added token " + shown(text)))
        r.fail("added token " + shown(text) + " has normalized = true, which fathom does not implement for a "
               "SentencePiece-style BPE");
      place(id->get<int64_t>(), text, r.flag(t, "special", false, "added token") ? kControl : kUserDefined,
            "added token");
      added_ids[text] = id->get<int64_t>();
    }
  }
  for (size_t id = 0; id < tokens.size(); ++id)
    if (types[id] == 0) tokens[id] = "[PAD" + std::to_string(id) + "]", types[id] = kUnused;
  std::optional<int64_t> unk_id;
  if (spm) {
    // byte_fallback spells a character no token holds as its UTF-8 bytes, <0x00>..<0xFF>.
    int bytes = 0;
    for (size_t id = 0; id < tokens.size(); ++id) {
      const std::string& t = tokens[id];
      if (types[id] == kNormal && t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
          std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4])) &&
          !std::islower(static_cast<unsigned char>(t[3])) && !std::islower(static_cast<unsigned char>(t[4])))
        types[id] = hf::kSpmByte, ++bytes;
    }
    if (bytes != 256)
      r.fail("model byte_fallback = true, but " + std::to_string(bytes) + " of the 256 byte tokens <0x00>..<0xFF> are "
             "normal tokens of the vocabulary");
    if (const Json* unk = r.field(*model, "unk_token")) {
      const auto it = unk->is_string() ? vocab->find(unk->get<std::string>()) : vocab->end();
      if (it == vocab->end()) r.fail("model unk_token " + shown(*unk) + " is not a token of the vocabulary");
      unk_id = it->get<int64_t>();
    }
  }

  const Json* merges = r.field(*model, "merges");
  if (!merges || !merges->is_array()) r.fail("model merges is not a list");
  std::vector<std::string> merge_strings;
  std::vector<float> scores;
  if (spm) scores = hf::spm_scores(r, *merges, tokens, types);
  else merge_strings.reserve(merges->size());
  for (const Json& m : *merges) {
    if (spm) break;
    if (m.is_string()) {
      merge_strings.push_back(m.get<std::string>());
      continue;
    }
    // tokenizers >= 0.20 writes [left, right]; the GGUF form is "left right".
    if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string())
      r.fail("merge " + shown(m) + " is neither \"left right\" nor [left, right]");
    const std::string& left = m[0].get_ref<const std::string&>();
    const std::string& right = m[1].get_ref<const std::string&>();
    if (left.empty() || right.empty() || left.find(' ') != std::string::npos || right.find(' ') != std::string::npos)
      r.fail("merge " + shown(m) + " has an empty part or a space in a part");
    merge_strings.push_back(left + " " + right);
  }

  // tokenizer_config.json, generation_config.json, config.json: BOS, EOS and what else ends a turn.
  const std::string cfg_path = files.dir + "/tokenizer_config.json";
  const Reader rc(cfg_path);
  const Json cfg = files.tokenizer_config_json ? hf::parse_json(*files.tokenizer_config_json, cfg_path, kMaxDepth)
                                               : Json::object();
  const Reader rg(files.dir + "/generation_config.json");
  const Json gen = files.generation_config_json
                       ? hf::parse_json(*files.generation_config_json, rg.path(), kMaxDepth)
                       : Json::object();
  auto id_of = [&](const std::string& text, const Reader& from, const char* key) -> int64_t {
    if (const auto it = added_ids.find(text); it != added_ids.end()) return it->second;
    if (const auto it = vocab->find(text); it != vocab->end()) return it->get<int64_t>();
    from.fail(std::string(key) + " " + shown(text) + " is not a token of tokenizer.json");
  };
  std::vector<int64_t> eos = hf::token_ids(rg.field(gen, "eos_token_id"), rg.path(), "eos_token_id");
  if (eos.empty()) eos = config_eos;
  std::optional<int64_t> eos_id;
  if (const auto t = token_text(rc, cfg, "eos_token")) eos_id = id_of(*t, rc, "eos_token");
  else if (!eos.empty()) eos_id = eos[0];
  std::optional<int64_t> bos_id;
  const std::vector<int64_t> gen_bos = hf::token_ids(rg.field(gen, "bos_token_id"), rg.path(), "bos_token_id");
  if (const auto t = token_text(rc, cfg, "bos_token")) bos_id = id_of(*t, rc, "bos_token");
  else if (!gen_bos.empty()) bos_id = gen_bos[0];
  else bos_id = config_bos;
  const std::string prefix = template_prefix(r, tok);
  bool add_bos = !prefix.empty();
  if (!prefix.empty() && (!bos_id || id_of(prefix, r, "post_processor token") != *bos_id))
    r.fail("post_processor puts " + shown(prefix) + " before the text, which is not the BOS token");
  if (rc.field(cfg, "add_bos_token")) add_bos = rc.flag(cfg, "add_bos_token", false, "");
  if (rc.flag(cfg, "add_eos_token", false, "")) rc.fail("add_eos_token = true is not supported");
  for (int64_t id : eos)
    if (id >= vocab_rows) rg.fail("eos_token_id " + std::to_string(id) + " is outside the vocabulary");
  if (eos_id && *eos_id >= vocab_rows) rg.fail("eos token id is outside the vocabulary");
  if (bos_id && (*bos_id < 0 || *bos_id >= vocab_rows)) rg.fail("bos token id is outside the vocabulary");

  std::optional<std::string> chat_template, tool_use;
  if (const Json* t = rc.field(cfg, "chat_template")) {
    if (t->is_string()) {
      chat_template = t->get<std::string>();
    } else if (t->is_array()) {  // [{"name": "default" | "tool_use" | ..., "template": "..."}]
      for (const Json& e : *t) {
        const Json* name = rc.field(e, "name");
        const Json* text = rc.field(e, "template");
        if (!name || !name->is_string() || !text || !text->is_string())
          rc.fail("chat_template entry " + shown(e) + " lacks a name or template");
        if (*name == Json("default")) chat_template = text->get<std::string>();
        if (*name == Json("tool_use")) tool_use = text->get<std::string>();
      }
    } else {
      rc.fail("chat_template is neither a string nor a list of named templates");
    }
  }
  if (files.chat_template_jinja) chat_template = files.chat_template_jinja;

  if (spm) {
    metadata["tokenizer.ggml.model"] = GgufValue{std::in_place_type<std::string>, "llama"};
    metadata["tokenizer.ggml.scores"] = float_array(scores);
    metadata["tokenizer.ggml.add_space_prefix"] = GgufValue{std::in_place_type<bool>, spm_text.prepend_each};
    if (!spm_text.metaspace.empty())
      metadata["fathom.metaspace_prefix"] = GgufValue{std::in_place_type<std::string>, spm_text.metaspace};
    // Added tokens are matched in the text before it is escaped, as tokenizers matches them.
    metadata["fathom.split_added_tokens"] = GgufValue{std::in_place_type<bool>, true};
    if (unk_id)
      metadata["tokenizer.ggml.unknown_token_id"] = GgufValue{std::in_place_type<uint32_t>, static_cast<uint32_t>(*unk_id)};
  } else {
    metadata["tokenizer.ggml.model"] = GgufValue{std::in_place_type<std::string>, "gpt2"};
    metadata["tokenizer.ggml.pre"] = GgufValue{std::in_place_type<std::string>, pre};
    metadata["tokenizer.ggml.merges"] = string_array(std::move(merge_strings));
  }
  if (nfc) metadata["fathom.normalizer"] = GgufValue{std::in_place_type<std::string>, "NFC"};
  // llama.cpp's names imply ignore_merges for Llama 3's regex only; GPT-4o's (gpt-oss) needs the key.
  if (!spm && ignore_merges) metadata["fathom.ignore_merges"] = GgufValue{std::in_place_type<bool>, true};
  metadata["tokenizer.ggml.tokens"] = string_array(std::move(tokens));
  metadata["tokenizer.ggml.token_type"] = int_array(types);
  if (bos_id) metadata["tokenizer.ggml.bos_token_id"] = GgufValue{std::in_place_type<uint32_t>, static_cast<uint32_t>(*bos_id)};
  if (eos_id) metadata["tokenizer.ggml.eos_token_id"] = GgufValue{std::in_place_type<uint32_t>, static_cast<uint32_t>(*eos_id)};
  metadata["tokenizer.ggml.add_bos_token"] = GgufValue{std::in_place_type<bool>, add_bos && bos_id.has_value()};
  std::vector<int32_t> eog;
  for (int64_t id : eos) eog.push_back(static_cast<int32_t>(id));
  if (!eog.empty()) metadata["fathom.eog_token_ids"] = int_array(eog);
  // Sampling defaults, as vLLM reads them (do_sample aside): llama.cpp's general.sampling.* keys.
  for (const auto& [key, name] : {std::pair<const char*, const char*>{"temperature", "temp"}, {"top_p", "top_p"},
                                  {"min_p", "min_p"}, {"repetition_penalty", "penalty_repeat"}, {"top_k", "top_k"}}) {
    const Json* v = rg.field(gen, key);
    if (!v) continue;
    if (!v->is_number()) rg.fail(std::string(key) + " = " + shown(*v) + " is not a number");
    const std::string gguf_key = std::string("general.sampling.") + name;
    if (std::string_view(key) == "top_k") {
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > vocab_rows)
        rg.fail("top_k = " + shown(*v) + " is not a count of tokens");
      metadata[gguf_key] = GgufValue{std::in_place_type<int32_t>, static_cast<int32_t>(v->get<int64_t>())};
    } else {
      metadata[gguf_key] = GgufValue{std::in_place_type<float>, v->get<float>()};
    }
  }
  if (chat_template) metadata["tokenizer.chat_template"] = GgufValue{std::in_place_type<std::string>, *chat_template};
  if (tool_use) metadata["tokenizer.chat_template.tool_use"] = GgufValue{std::in_place_type<std::string>, *tool_use};
}

}  // namespace fathom
