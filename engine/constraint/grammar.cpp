#include "engine/constraint/grammar.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "base/json_depth.h"
#include "engine/constraint/constraint_bounds.h"
#include "engine/model/tokenizer.h"

namespace fathom {

struct CompiledConstraint {
  xgrammar::CompiledGrammar grammar;
};

struct ConstraintCompiler::Impl {
  explicit Impl(xgrammar::TokenizerInfo info) : compiler(info, /*max_threads=*/1, /*cache_enabled=*/true) {}
  xgrammar::GrammarCompiler compiler;
};

namespace {

// The vocabulary as xgrammar reads it: each token's bytes (RAW), control tokens empty (which
// xgrammar treats as special: never allowed inside the output), stop tokens the model's
// end-of-generation ids.
xgrammar::TokenizerInfo tokenizer_info(const Tokenizer& tok, int32_t vocab_size) {
  std::vector<std::string> vocab(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) vocab[id] = tok.is_control(id) ? std::string() : tok.token_bytes(id);
  std::vector<int32_t> stops(tok.end_of_generation_ids().begin(), tok.end_of_generation_ids().end());
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, vocab_size, stops, /*add_prefix_space=*/false);
}

// The schema xgrammar compiles: `text` parsed (iteratively, after its bracket depth is bounded)
// and checked against ConstraintBounds, then written back by the same parser that checked it, so
// that what xgrammar reads (duplicate keys, say) is what was checked.
std::string bounded_schema_text(const std::string& text) {
  if (json_nesting_depth(text, ConstraintBounds::kMaxSchemaLevels) > ConstraintBounds::kMaxSchemaLevels)
    throw Error("the JSON schema nests more than " + std::to_string(ConstraintBounds::kMaxSchemaLevels) +
                " levels of objects and arrays");
  const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) throw Error("the JSON schema is not valid JSON");
  check_schema_bounds(schema);
  return schema.dump();
}

}  // namespace

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size)
    : impl_(std::make_unique<Impl>(tokenizer_info(tokenizer, vocab_size))) {}

ConstraintCompiler::~ConstraintCompiler() = default;

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(const OutputConstraint& c) {
  const std::string key = std::to_string(static_cast<int>(c.kind)) + (c.strict ? "s" : "n") + c.text;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  std::shared_ptr<const CompiledConstraint> compiled;
  try {
    switch (c.kind) {
      // Compact JSON (no free whitespace between tokens): with whitespace allowed anywhere, small
      // models spend their whole budget on newlines inside an object.
      case OutputConstraint::Kind::kJson:
        compiled = std::make_shared<const CompiledConstraint>(CompiledConstraint{
            impl_->compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt,
                                              std::nullopt, /*strict_mode=*/false)});
        break;
      case OutputConstraint::Kind::kJsonSchema:
        compiled = std::make_shared<const CompiledConstraint>(CompiledConstraint{
            impl_->compiler.CompileJSONSchema(bounded_schema_text(c.text), /*any_whitespace=*/false, std::nullopt, std::nullopt, c.strict)});
        break;
      case OutputConstraint::Kind::kGrammar:
        check_grammar_bounds(c.text);
        compiled = std::make_shared<const CompiledConstraint>(CompiledConstraint{impl_->compiler.CompileGrammar(c.text, "root")});
        break;
      case OutputConstraint::Kind::kNone:
        throw Error("no constraint to compile");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string(c.kind == OutputConstraint::Kind::kGrammar ? "the grammar" : "the JSON schema") +
                " cannot be used: " + e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_.size() >= 256) cache_.clear();  // bounded: a client cannot grow it without limit
  cache_.emplace(key, compiled);
  return compiled;
}

struct ConstraintMatcher::Impl {
  explicit Impl(std::shared_ptr<const CompiledConstraint> c)
      : compiled(std::move(c)), matcher(compiled->grammar) {}
  std::shared_ptr<const CompiledConstraint> compiled;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bitmask;
  bool prepared = false;     // bitmask is for the next position
  bool all_allowed = false;  // ... and allows every token
};

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled)
    : impl_(std::make_unique<Impl>(std::move(compiled))) {}

ConstraintMatcher::~ConstraintMatcher() = default;

void ConstraintMatcher::prepare_mask(int32_t vocab_size) {
  std::vector<int32_t>& mask = impl_->bitmask;
  mask.assign(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size)), 0);
  int64_t mask_shape[1] = {static_cast<int64_t>(mask.size())};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = mask_shape;
  impl_->all_allowed = !impl_->matcher.FillNextTokenBitmask(&t);
  impl_->prepared = true;
}

void ConstraintMatcher::mask_logits(float* logits, int32_t vocab_size) {
  if (!impl_->prepared) prepare_mask(vocab_size);
  if (impl_->all_allowed) return;
  const std::vector<int32_t>& mask = impl_->bitmask;
  // One bit per token, 1 = allowed. Inside a JSON string nearly every word is all ones: skip those.
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int32_t w = 0; w * 32 < vocab_size; ++w) {
    const uint32_t word = static_cast<uint32_t>(mask[w]);
    if (word == ~0u) continue;
    const int32_t end = std::min(vocab_size, (w + 1) * 32);
    for (int32_t id = w * 32; id < end; ++id)
      if (!((word >> (id & 31)) & 1u)) logits[id] = kMasked;
  }
}

bool ConstraintMatcher::accept(int32_t token) {
  impl_->prepared = false;
  return impl_->matcher.AcceptToken(token);
}

bool ConstraintMatcher::complete() const { return impl_->matcher.IsTerminated(); }

}  // namespace fathom
