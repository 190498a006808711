#pragma once
// Grammar-constrained decoding over xgrammar's C++ core (the engine vLLM, SGLang and TensorRT-LLM
// use; built from its PyPI sdist by scripts/setup_xgrammar.sh). A ConstraintCompiler holds the
// model's vocabulary once and compiles OutputConstraints (JSON, JSON Schema, EBNF), caching them
// by text; each sequence runs its own ConstraintMatcher: before a token is sampled,
// mask_logits() sets every token that cannot continue a match to -inf; accept() advances it.
// xgrammar stays behind this header (the rest of the engine sees only these classes).
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace fathom {

class Tokenizer;
struct CompiledConstraint;  // xgrammar's compiled grammar, shared by every sequence using it

class ConstraintCompiler {
 public:
  // `vocab_size`: the model's logit rows (may exceed the tokenizer's pieces).
  ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size);
  ~ConstraintCompiler();
  // Throws fathom::Error naming the problem for an invalid or unsupported schema / grammar.
  std::shared_ptr<const CompiledConstraint> compile(const OutputConstraint& constraint);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledConstraint>> cache_;
};

class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled);
  ~ConstraintMatcher();
  // Computes the next position's allowed-token mask from the tokens accepted so far; needs no
  // logits, so the scheduler runs it on another thread while the forward pass computes them.
  void prepare_mask(int32_t vocab_size);
  // logits: (vocab_size) of the next position; disallowed tokens become -inf. Uses the prepared
  // mask when prepare_mask() ran since the last accept(), else computes it now.
  void mask_logits(float* logits, int32_t vocab_size);
  // Advances past `token`; false when the grammar does not allow it (a sampler bug).
  bool accept(int32_t token);
  // The output is complete: the grammar matched and only a stop token could follow.
  bool complete() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
