#pragma once
// SentencePiece vocabularies (tokenizer.ggml.model = "llama": Llama 2, Gemma, ...): a serialized
// sentencepiece ModelProto is built from the GGUF vocabulary and run by libsentencepiece.
// Control tokens are split out of the text here first (they never come out of sentencepiece);
// user-defined tokens (Gemma's "\n\n", "<td>", space runs) are matched by sentencepiece itself.
//
// libsentencepiece runs inside a dlopen()ed module (sentencepiece_module.h): its bundled
// protobuf would otherwise collide with gRPC's in one process.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/tokenizer.h"

namespace fathom {

// The sentencepiece settings a GGUF vocabulary implies, and the ModelProto bytes built from them.
struct SentencePieceSpec {
  bool bpe = true;              // model_type BPE (scores are merge ranks) or UNIGRAM (log probabilities)
  bool byte_fallback = false;   // <0x00>..<0xFF> tokens exist
  bool add_dummy_prefix = false;  // tokenizer.ggml.add_space_prefix
  int32_t unk_id = -1;
};
// pieces/scores/types: the GGUF arrays (types as tokenizer.ggml.token_type). Pieces made only of
// spaces are written as U+2581 runs, as in the original model files (the GGUF converter stores
// them with real spaces). Throws fathom::Error on a vocabulary sentencepiece would reject.
std::string build_sentencepiece_model_proto(const std::vector<std::string>& pieces, const std::vector<double>& scores,
                                            const std::vector<int32_t>& types, const SentencePieceSpec& spec);

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const GgufFile& file);
  ~SentencePieceTokenizer() override;
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string token_bytes(int32_t id) const override;

 private:
  struct Impl;  // owns the SentencePieceModule
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
