// Tokenizer CLI (used by tests/e2e/test_tokenizer.py; handy for debugging prompts).
//
// MODEL.gguf may also be a Hugging Face model directory (its tokenizer.json and companions).
//
//   tokenize MODEL.gguf [--no-special] [--no-bos]   UTF-8 text on stdin -> {"ids": [...]}
//   tokenize MODEL.gguf --batch [...]               JSON array of strings -> {"ids": [[...], ...]}
//   tokenize MODEL.gguf --decode [--special]        JSON array of ids (or of arrays) -> {"text": ...}
//   tokenize MODEL.gguf --stream                    JSON array of ids (or of arrays) -> {"pieces": [...]}
//                                                   from the incremental detokenizer (last: flush())
//   tokenize MODEL.gguf --chat [--family NAME] [--no-generation-prompt]
//                                                   JSON [{"role","content"}...] -> {"text": prompt}
//   tokenize MODEL.gguf --info                      vocabulary facts (size, BOS/EOS, end-of-generation)
//   tokenize --pretokenize PRE                      JSON array of strings -> {"words": [[...], ...]}, the
//                                                   BPE pre-tokenizer of tokenizer.ggml.pre = PRE alone;
//                                                   a text given as an array of byte values (any bytes,
//                                                   invalid UTF-8 too) has its words as such arrays
//
// --special (with --decode) writes control tokens as their text instead of dropping them.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/bpe_pretokenizer.h"
#include "engine/model/chat_template.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_dir.h"
#include "engine/model/tokenizer.h"

namespace {

using nlohmann::json;

std::string read_stdin() {
  std::cin >> std::noskipws;
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void print(const json& j) {
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

std::vector<int32_t> ids_from_json(const json& j) {
  if (!j.is_array()) throw fathom::Error("expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const json& v : j) {
    if (!v.is_number_integer()) throw fathom::Error("expected a JSON array of token ids");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

std::string decode(const fathom::Tokenizer& tok, const std::vector<int32_t>& ids, bool special) {
  if (!special) return tok.decode(ids);
  // Control tokens as their text, everything between them through decode().
  std::string out;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    if (tok.is_control(id)) {
      out += tok.decode(run) + tok.piece(id);
      run.clear();
    } else {
      run.push_back(id);
    }
  }
  return out + tok.decode(run);
}

int usage() {
  std::fprintf(stderr,
               "usage: tokenize MODEL.gguf [--no-special] [--no-bos] [--batch | --decode [--special] | --stream |\n"
               "                --chat [--family NAME] [--no-generation-prompt] | --info]\n"
               "       tokenize --pretokenize PRE\n");
  return 2;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  if (std::strcmp(argv[1], "--pretokenize") == 0) {
    if (argc != 3) return usage();
    const fathom::PreTokenizer kind = fathom::pre_tokenizer_for(argv[2]);
    const json in = json::parse(read_stdin());
    json all = json::array();
    std::vector<std::string_view> words;
    for (const json& s : in) {
      const bool as_bytes = s.is_array();
      std::string text;
      if (as_bytes) {
        for (const json& b : s) {
          if (!b.is_number_unsigned() || b.get<uint64_t>() > 255) throw fathom::Error("expected byte values 0-255");
          text.push_back(static_cast<char>(b.get<uint8_t>()));
        }
      } else {
        text = s.get<std::string>();
      }
      words.clear();
      fathom::pre_tokenize(kind, text, words);
      json w = json::array();
      for (std::string_view v : words) {
        if (as_bytes) {
          w.push_back(json(std::vector<uint8_t>(v.begin(), v.end())));
        } else {
          w.push_back(std::string(v));
        }
      }
      all.push_back(w);
    }
    print({{"words", all}});
    return 0;
  }
  const std::string path = argv[1];
  bool no_special = false, no_bos = false, batch = false, do_decode = false, special = false, stream = false;
  bool chat = false, no_gen = false, info = false;
  std::string family;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-special") no_special = true;
    else if (a == "--no-bos") no_bos = true;
    else if (a == "--batch") batch = true;
    else if (a == "--decode") do_decode = true;
    else if (a == "--special") special = true;
    else if (a == "--stream") stream = true;
    else if (a == "--chat") chat = true;
    else if (a == "--no-generation-prompt") no_gen = true;
    else if (a == "--info") info = true;
    else if (a == "--family" && i + 1 < argc) family = argv[++i];
    else return usage();
  }
  // A directory: a Hugging Face checkpoint's tokenizer files (the weights are not needed).
  std::error_code ec;
  auto file = std::filesystem::is_directory(path, ec) ? fathom::open_hf_tokenizer(path) : fathom::GgufFile::open(path);
  auto tok = fathom::Tokenizer::from_gguf(*file);
  const fathom::EncodeOptions opts{!no_bos, !no_special};

  if (info) {
    json eog = json::array();
    for (int32_t id : tok->end_of_generation_ids()) eog.push_back(id);
    print({{"vocab_size", tok->vocab_size()}, {"bos_id", tok->bos_id()}, {"eos_id", tok->eos_id()},
           {"add_bos", tok->add_bos()}, {"end_of_generation_ids", eog}});
    return 0;
  }
  if (chat) {
    const json msgs = json::parse(read_stdin());
    if (!msgs.is_array()) throw fathom::Error("--chat expects a JSON array of messages");
    std::vector<fathom::ChatMessage> messages;
    for (const json& m : msgs) messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    const std::string text = file->get_string("tokenizer.chat_template").value_or("");
    if (family.empty() && text.empty())
      family = fathom::default_family_for_architecture(file->get_string("general.architecture").value_or(""));
    const std::string bos = tok->bos_id() >= 0 ? tok->piece(tok->bos_id()) : "";
    const auto tmpl = fathom::ChatTemplate::resolve(text, family, bos);
    const fathom::RenderedChat rendered = tmpl.render(messages, !no_gen);
    // ids: the prompt as the server tokenizes it (special tokens only where the template wrote them).
    const std::vector<int32_t> ids = tok->encode(rendered.text, fathom::EncodeOptions{false, true, &rendered.content});
    print({{"text", rendered.text}, {"family", tmpl.family_name()}, {"ids", ids}});
    return 0;
  }
  if (do_decode || stream) {
    const json in = json::parse(read_stdin());
    const bool many = !in.empty() && in.is_array() && in[0].is_array();
    if (stream) {
      auto pieces_of = [&](const json& ids) {
        fathom::IncrementalDetokenizer detok(*tok);
        json pieces = json::array();
        for (int32_t id : ids_from_json(ids)) pieces.push_back(detok.push(id));
        pieces.push_back(detok.flush());
        return pieces;
      };
      json out = json::array();
      if (many) {
        for (const json& ids : in) out.push_back(pieces_of(ids));
      } else {
        out = pieces_of(in);
      }
      print({{"pieces", out}});
    } else if (many) {
      json texts = json::array();
      for (const json& ids : in) texts.push_back(decode(*tok, ids_from_json(ids), special));
      print({{"text", texts}});
    } else {
      print({{"text", decode(*tok, ids_from_json(in), special)}});
    }
    return 0;
  }
  if (batch) {
    const json in = json::parse(read_stdin());
    if (!in.is_array()) throw fathom::Error("--batch expects a JSON array of strings");
    json all = json::array();
    for (const json& s : in) all.push_back(tok->encode(s.get<std::string>(), opts));
    print({{"ids", all}});
    return 0;
  }
  print({{"ids", tok->encode(read_stdin(), opts)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 1;
  }
}
