// SentencePiece tokenizer: the ModelProto writer, and encode/decode around the processor that
// runs in the dlopen()ed module (sentencepiece_module.h says why it is isolated).
#include "engine/model/sentencepiece_tokenizer.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/sentencepiece_module.h"

namespace fathom {
namespace {

// SentencePiece piece types (ModelProto.SentencePiece.Type); 4 is USER_DEFINED, 5 UNUSED.
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;
constexpr const char kSpaceMarker[] = "\xE2\x96\x81";  // U+2581, sentencepiece's escaped space

// Just enough of the protobuf wire format to write a sentencepiece ModelProto
// (field numbers from sentencepiece_model.proto).
class ProtoWriter {
 public:
  void varint_field(int field, uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  void int32_field(int field, int32_t v) { varint_field(field, static_cast<uint64_t>(static_cast<int64_t>(v))); }
  void float_field(int field, float v) {
    tag(field, 5);
    char b[4];
    std::memcpy(b, &v, 4);  // little-endian fixed32 (x86/ARM hosts)
    out_.append(b, 4);
  }
  void bytes_field(int field, std::string_view s) {
    tag(field, 2);
    varint(s.size());
    out_.append(s);
  }
  std::string& str() { return out_; }

 private:
  void tag(int field, int wire_type) { varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

namespace field {
constexpr int kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr int kPiecePiece = 1, kPieceScore = 2, kPieceType = 3;
constexpr int kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35, kTrainerUnkId = 40,
              kTrainerBosId = 41, kTrainerEosId = 42, kTrainerPadId = 43;
constexpr int kNormName = 1, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4, kNormEscapeWhitespaces = 5;
constexpr uint64_t kModelTypeUnigram = 1, kModelTypeBpe = 2;
}  // namespace field

bool only_spaces(const std::string& s) { return !s.empty() && s.find_first_not_of(' ') == std::string::npos; }

// "<0xAB>" -> 0xAB, or -1.
int byte_piece_value(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = p[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

std::string build_sentencepiece_model_proto(const std::vector<std::string>& pieces, const std::vector<double>& scores,
                                            const std::vector<int32_t>& types, const SentencePieceSpec& spec) {
  const size_t n = pieces.size();
  if (scores.size() != n || types.size() != n) throw Error("sentencepiece vocabulary: pieces, scores and types differ in length");
  if (spec.unk_id < 0 || static_cast<size_t>(spec.unk_id) >= n) throw Error("sentencepiece vocabulary: no unknown token");
  ProtoWriter model;
  std::string repeated_space;
  for (size_t id = 0; id < n; ++id) {
    ProtoWriter p;
    if (only_spaces(pieces[id])) {
      repeated_space.clear();
      for (size_t k = 0; k < pieces[id].size(); ++k) repeated_space += kSpaceMarker;
      p.bytes_field(field::kPiecePiece, repeated_space);
    } else {
      if (pieces[id].empty()) throw Error("sentencepiece vocabulary: token " + std::to_string(id) + " is empty");
      p.bytes_field(field::kPiecePiece, pieces[id]);
    }
    p.float_field(field::kPieceScore, static_cast<float>(scores[id]));
    int32_t type = static_cast<int32_t>(id) == spec.unk_id ? kUnknown : types[id];
    if (type == kUnknown && static_cast<int32_t>(id) != spec.unk_id) type = kControl;  // sentencepiece allows one
    if (type == kByte && !spec.byte_fallback) type = kNormal;
    if (type < 1 || type > 6) type = kNormal;
    if (type != kNormal) p.varint_field(field::kPieceType, static_cast<uint64_t>(type));
    model.bytes_field(field::kModelPieces, p.str());
  }
  ProtoWriter trainer;
  trainer.varint_field(field::kTrainerModelType, spec.bpe ? field::kModelTypeBpe : field::kModelTypeUnigram);
  trainer.int32_field(field::kTrainerVocabSize, static_cast<int32_t>(n));
  trainer.varint_field(field::kTrainerByteFallback, spec.byte_fallback ? 1 : 0);
  trainer.int32_field(field::kTrainerUnkId, spec.unk_id);
  // BOS/EOS/PAD are added by fathom, never by sentencepiece.
  trainer.int32_field(field::kTrainerBosId, -1);
  trainer.int32_field(field::kTrainerEosId, -1);
  trainer.int32_field(field::kTrainerPadId, -1);
  model.bytes_field(field::kModelTrainerSpec, trainer.str());
  // No normalization (GGUF vocabularies carry none we could apply); spaces become U+2581.
  ProtoWriter norm;
  norm.bytes_field(field::kNormName, "identity");
  norm.varint_field(field::kNormAddDummyPrefix, spec.add_dummy_prefix ? 1 : 0);
  norm.varint_field(field::kNormRemoveExtraWhitespaces, 0);
  norm.varint_field(field::kNormEscapeWhitespaces, 1);
  model.bytes_field(field::kModelNormalizerSpec, norm.str());
  return std::move(model.str());
}

struct SentencePieceTokenizer::Impl {
  std::unique_ptr<SentencePieceModule> processor;  // libsentencepiece, isolated in its own module
  // fathom.metaspace_prefix of a tokenizer.json's Metaspace pre-tokenizer: "first" or "always" puts a
  // space before a run of text (the run at offset 0 only, or every run) unless it starts with one.
  std::string metaspace;
  std::vector<std::string> text_of;  // per token: its text (U+2581 -> space, byte tokens -> the byte)
};

SentencePieceTokenizer::SentencePieceTokenizer(const GgufFile& file) : impl_(std::make_unique<Impl>()) {
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) throw Error(file.path() + ": missing tokenizer.ggml.tokens");
  pieces_ = std::move(*tokens);
  const size_t n = pieces_.size();
  std::vector<double> scores = file.get_float_array("tokenizer.ggml.scores").value_or(std::vector<double>{});
  if (scores.empty())
    for (size_t id = 0; id < n; ++id) scores.push_back(-static_cast<double>(id));  // rank order
  if (scores.size() != n) throw Error(file.path() + ": tokenizer.ggml.scores does not match the token count");
  if (auto types = file.get_int_array("tokenizer.ggml.token_type")) {
    if (types->size() != n) throw Error(file.path() + ": tokenizer.ggml.token_type does not match the token count");
    token_types_.assign(types->begin(), types->end());
  } else {
    token_types_.assign(n, kNormal);
  }
  auto id_key = [&](const char* key) -> int32_t {
    auto v = file.get_int(key);
    if (!v) return -1;
    if (*v < 0 || *v >= static_cast<int64_t>(n))
      throw Error(file.path() + ": " + key + " = " + std::to_string(*v) + " is out of range");
    return static_cast<int32_t>(*v);
  };
  bos_id_ = id_key("tokenizer.ggml.bos_token_id");
  eos_id_ = id_key("tokenizer.ggml.eos_token_id");
  // llama.cpp's default for SentencePiece vocabularies that do not say: add BOS.
  add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token").value_or(true) && bos_id_ >= 0;
  add_eos_ = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && eos_id_ >= 0;

  // A tokenizer.json's added tokens are matched in the raw text (hf_tokenizer.h), user-defined ones
  // even without parse_special, as tokenizers matches them.
  const bool split_added = file.get_bool("fathom.split_added_tokens").value_or(false);
  index_vocabulary(/*match_user_defined=*/split_added);
  collect_end_of_generation(file);

  SentencePieceSpec spec;
  spec.add_dummy_prefix = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  impl_->metaspace = file.get_string("fathom.metaspace_prefix").value_or("");
  if (!impl_->metaspace.empty() && impl_->metaspace != "first" && impl_->metaspace != "always")
    throw Error(file.path() + ": fathom.metaspace_prefix '" + impl_->metaspace + "' is neither first nor always");
  if (!impl_->metaspace.empty() && spec.add_dummy_prefix)
    throw Error(file.path() + ": fathom.metaspace_prefix with tokenizer.ggml.add_space_prefix");
  strip_leading_space_ = spec.add_dummy_prefix || !impl_->metaspace.empty();
  spec.unk_id = id_key("tokenizer.ggml.unknown_token_id");
  if (spec.unk_id < 0) {
    auto it = piece_ids_.find("<unk>");
    if (it == piece_ids_.end()) throw Error(file.path() + ": the SentencePiece vocabulary has no unknown token");
    spec.unk_id = it->second;
  }
  int byte_tokens = 0;
  for (size_t id = 0; id < n; ++id) byte_tokens += token_types_[id] == kByte && byte_piece_value(pieces_[id]) >= 0;
  spec.byte_fallback = byte_tokens == 256;
  // BPE vocabularies store merge ranks as scores (whole numbers: 0, -1, -2, ...); unigram
  // vocabularies store log probabilities.
  spec.bpe = true;
  for (size_t id = 0; id < n && spec.bpe; ++id)
    if (token_types_[id] == kNormal && scores[id] != std::floor(scores[id])) spec.bpe = false;

  // With split_added, a user-defined token some merge makes (score < 0) is a normal piece; one no
  // merge makes is a control piece: libsentencepiece never makes it from text (hf_sentencepiece.h).
  std::vector<int32_t> proto_types = token_types_;
  if (split_added)
    for (size_t id = 0; id < n; ++id)
      if (proto_types[id] == 4) proto_types[id] = scores[id] < 0 ? kNormal : kControl;
  const std::string proto = build_sentencepiece_model_proto(pieces_, scores, proto_types, spec);
  try {
    impl_->processor = std::make_unique<SentencePieceModule>(proto);
  } catch (const Error& e) {
    throw Error(file.path() + ": " + e.what());
  }
  if (impl_->processor->piece_size() != static_cast<int>(n))
    throw Error(file.path() + ": sentencepiece loaded " + std::to_string(impl_->processor->piece_size()) + " of " +
                std::to_string(n) + " tokens");

  impl_->text_of.resize(n);
  for (size_t id = 0; id < n; ++id) {
    std::string& t = impl_->text_of[id];
    const int32_t type = token_types_[id];
    if (type == kControl || type == kUnknown) continue;  // no text
    if (type == kByte && byte_piece_value(pieces_[id]) >= 0) {
      t = std::string(1, static_cast<char>(byte_piece_value(pieces_[id])));
      continue;
    }
    const std::string& p = pieces_[id];
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, kSpaceMarker) == 0) {
        t += ' ';
        i += 3;
      } else {
        t += p[i++];
      }
    }
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<int32_t> ids;
  if (opts.add_bos && add_bos_) ids.push_back(bos_id_);
  std::vector<int> piece_ids;
  std::string prefixed;
  for (const TextSpan& span : split_special(text, opts)) {
    if (span.special_id >= 0) {
      ids.push_back(span.special_id);
      continue;
    }
    const std::string& scheme = impl_->metaspace;
    if (!scheme.empty() && (scheme == "always" || span.text.data() == text.data()) && !span.text.starts_with(' ') &&
        !span.text.starts_with(kSpaceMarker)) {
      prefixed.assign(1, ' ');
      prefixed.append(span.text);
      piece_ids = impl_->processor->encode(prefixed);
    } else {
      piece_ids = impl_->processor->encode(span.text);
    }
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  return ids;
}

std::string SentencePieceTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) throw Error("token id " + std::to_string(id) + " is out of range");
  return impl_->text_of[id];
}

}  // namespace fathom
