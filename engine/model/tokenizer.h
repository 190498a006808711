#pragma once
// Tokenizers built from a GGUF vocabulary (tokenizer.ggml.*):
//   "llama" -> SentencePiece (a serialized ModelProto built from the GGUF vocabulary, run by
//              libsentencepiece), "gpt2" -> byte-level BPE (our own implementation, with the
//              pre-tokenizer regex chosen by tokenizer.ggml.pre).
// Special/control tokens (e.g. <|im_start|>, <start_of_turn>) are matched as whole tokens when
// parse_special is set, never split into pieces.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fathom {

class GgufFile;

struct EncodeOptions {
  bool add_bos = true;        // prepend BOS when the vocabulary asks for it (tokenizer.ggml.add_bos_token)
  bool parse_special = true;  // recognise special-token text in the input
  // Byte ranges [begin, end) of the input, ascending, where no special-token text is recognised,
  // user-defined tokens included (message content inside a rendered chat prompt:
  // RenderedChat::content). Null: none.
  const std::vector<std::pair<size_t, size_t>>* literal = nullptr;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws fathom::Error for an unsupported or malformed vocabulary.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);

  virtual std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
  // The bytes this token contributes to the text (may be part of a UTF-8 character; may be
  // empty for control tokens such as BOS). For SentencePiece the leading-space marker of a
  // word-initial piece becomes a space; byte tokens <0xAB> become the byte.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Whole-sequence decode (concatenated token_bytes, with the tokenizer's leading-space rule).
  // Invalid UTF-8 (a byte sequence no character completes) becomes U+FFFD, one per maximal
  // invalid subpart as Python's errors="replace" does, so the result is always valid UTF-8.
  virtual std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_.at(id); }  // the vocabulary string
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  // The vocabulary asks for EOS after a text (tokenizer.ggml.add_eos_token: embedding models whose
  // pooling reads the last token). Only embeddings' inputs honour it (server/embeddings.cpp):
  // a generation prompt ending in EOS would ask the model to continue past its end.
  bool add_eos() const { return add_eos_; }
  // SentencePiece vocabularies with add_space_prefix: the first word's leading space is not text.
  bool strips_leading_space() const { return strip_leading_space_; }
  bool is_control(int32_t id) const;
  // Tokens that end generation: EOS, EOT and the chat templates' end-of-turn tokens.
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }
  bool is_end_of_generation(int32_t id) const;
  // A harmony vocabulary (gpt-oss: <|start|>, <|channel|>, <|message|>, <|end|>, <|return|> and
  // <|call|> are tokens), loaded as llama.cpp loads it: the markers that structure an answer
  // (<|channel|>, <|message|>, <|start|>, <|end|>, <|constrain|>) are user-defined tokens, so the
  // output text shows them (server/harmony.h reads it) and output constraints can write them;
  // <|return|> and <|call|> end generation, <|end|> (one message of several) does not.
  bool harmony() const { return harmony_; }
  // -1 when `text` is not exactly one token of the vocabulary. `text` is looked up as a vocabulary
  // string first (e.g. "<|im_end|>", "Ġthe"), then as plain text that encodes to a single token
  // (e.g. " the").
  int32_t token_id(std::string_view text) const;

 protected:
  // A run of plain text, or one special token recognised in the input.
  struct TextSpan {
    std::string_view text;
    int32_t special_id = -1;  // >= 0: this span is the text of that special token
  };
  // Fills piece_ids_ and the special-token index from pieces_/token_types_. Control (3) and
  // unknown (2) tokens are matched only with parse_special; user-defined (4) tokens always, when
  // `match_user_defined` (SentencePiece matches those itself).
  void index_vocabulary(bool match_user_defined);
  // Splits `text` at special-token text, leftmost-longest match first (as HF's added-token
  // matcher and llama.cpp do); the plain spans between are left for the tokenizer's model.
  std::vector<TextSpan> split_special(std::string_view text, const EncodeOptions& opts) const;
  // Fills eog_ids_: EOS, tokenizer.ggml.eot_token_id/eom_token_id, fathom.eog_token_ids (a Hugging Face
  // checkpoint's EOS list) and end-of-turn tokens by name (harmony's: see harmony()).
  void collect_end_of_generation(const GgufFile& file);
  // Sets harmony_ and retypes the harmony markers (see harmony()); before index_vocabulary.
  void adopt_harmony_conventions();

  std::vector<std::string> pieces_;
  std::vector<int32_t> token_types_;  // tokenizer.ggml.token_type (1 normal, 3 control, 4 user-defined, 6 byte)
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_ids_;
  bool strip_leading_space_ = false;  // decode drops the space the encoder put before the first word
  bool harmony_ = false;
  std::unordered_map<std::string_view, int32_t> piece_ids_;  // views into pieces_ (never resized after)

 private:
  struct SpecialToken {
    int32_t id;
    bool always;  // user-defined: matched even without parse_special
  };
  std::unordered_map<std::string_view, SpecialToken> special_by_text_;
  std::vector<uint32_t> special_lengths_[256];  // by first byte: distinct special-token lengths, longest first
};

// Turns a stream of token ids into text pieces without ever emitting half a UTF-8 character:
// bytes of an incomplete character are held back until the character completes; invalid bytes
// become U+FFFD exactly as in Tokenizer::decode, so the pushed pieces plus flush() concatenate
// to decode() of the whole sequence.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back at end of stream: an incomplete trailing character, as U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace fathom
