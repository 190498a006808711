#include "engine/constraint/grammar.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>
#include <variant>
#include <vector>

#include "base/error.h"
#include "base/json_depth.h"
#include "engine/constraint/constraint_bounds.h"
#include "engine/model/tokenizer.h"

namespace fathom {

struct CompiledConstraint {
  xgrammar::CompiledGrammar grammar;
};

struct ConstraintCompiler::Impl {
  // xgrammar's own cache is off: it has no bound by default and would keep every schema a client
  // ever sent; ConstraintCompiler's cache (bounded by bytes) does the reusing.
  explicit Impl(xgrammar::TokenizerInfo info) : compiler(info, /*max_threads=*/1, /*cache_enabled=*/false) {}
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

// What xgrammar's exception says, without its log prefix ("[02:09:15] /path/to/file.cc:3567: ")
// and without an internal check's expression: a client sees what is wrong with its input, never
// the server's paths, clock or the library's internals.
std::string library_message(std::string m) {
  if (!m.empty() && m[0] == '[') {
    const size_t stamp = m.find("] ");
    const size_t source = stamp == std::string::npos ? stamp : m.find(": ", stamp + 2);
    if (source != std::string::npos) m.erase(0, source + 2);
  }
  if (m.rfind("Check failed", 0) == 0) return "the grammar engine could not compile it (an internal check failed)";
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n' || m.back() == ':')) m.pop_back();
  return m;
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

// A structural tag (OutputConstraint::kTagged) checked as a client's constraint would be: its
// nesting, and every JSON Schema, grammar and regex in it against ConstraintBounds (walked
// iteratively: the tag itself is parsed by xgrammar's recursive descent).
void check_structural_tag_bounds(const std::string& text) {
  constexpr int kMaxTagLevels = 32;  // a tag's own nesting, schemas apart
  if (json_nesting_depth(text, ConstraintBounds::kMaxSchemaLevels) > ConstraintBounds::kMaxSchemaLevels)
    throw Error("the structural tag nests too deep");
  const nlohmann::json tag = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!tag.is_object()) throw Error("the structural tag is not a JSON object");
  std::vector<std::pair<const nlohmann::json*, int>> todo = {{&tag, 0}};
  while (!todo.empty()) {
    const auto [node, level] = todo.back();
    todo.pop_back();
    if (level > kMaxTagLevels) throw Error("the structural tag nests more than " + std::to_string(kMaxTagLevels) + " levels");
    if (node->is_object()) {
      const std::string type = node->contains("type") && (*node)["type"].is_string() ? (*node)["type"].get<std::string>() : "";
      if (type == "json_schema" && node->contains("json_schema")) {
        check_schema_bounds((*node)["json_schema"]);
        continue;
      }
      if (type == "grammar" && node->contains("grammar") && (*node)["grammar"].is_string())
        check_grammar_bounds((*node)["grammar"].get<std::string>());
      if (type == "regex" && node->contains("pattern") && (*node)["pattern"].is_string() &&
          regex_group_depth((*node)["pattern"].get<std::string>()) > ConstraintBounds::kMaxRegexGroups)
        throw Error("a regex in the structural tag nests more than " +
                    std::to_string(ConstraintBounds::kMaxRegexGroups) + " groups");
    }
    if (node->is_structured())
      for (const nlohmann::json& child : *node) todo.push_back({&child, level + 1});
  }
}

xgrammar::Grammar structural_tag_grammar(const std::string& text) {
  auto result = xgrammar::Grammar::FromStructuralTag(text);
  if (const auto* grammar = std::get_if<xgrammar::Grammar>(&result)) return *grammar;
  throw Error("the structural tag cannot be used");
}

// kTagged: the structural tag `text`, then one of the tagged JSON values.
xgrammar::Grammar tagged_grammar(const OutputConstraint& c) {
  if (c.tagged.empty()) throw Error("a tagged constraint needs at least one tagged value");
  check_structural_tag_bounds(c.text);
  std::vector<xgrammar::Grammar> alternatives;
  for (const OutputConstraint::Tagged& t : c.tagged) {
    const nlohmann::json begin = {{"type", "structural_tag"}, {"format", {{"type", "const_string"}, {"value", t.begin}}}};
    alternatives.push_back(xgrammar::Grammar::Concat(
        {structural_tag_grammar(begin.dump()),
         xgrammar::Grammar::FromJSONSchema(bounded_schema_text(t.schema), /*any_whitespace=*/false, std::nullopt,
                                           std::nullopt, t.strict)}));
  }
  return xgrammar::Grammar::Concat({structural_tag_grammar(c.text), xgrammar::Grammar::Union(alternatives)});
}

}  // namespace

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, Limits limits)
    : impl_(std::make_unique<Impl>(tokenizer_info(tokenizer, vocab_size))), limits_(limits), worker_([this] { work(); }) {}

ConstraintCompiler::~ConstraintCompiler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(const OutputConstraint& c) {
  std::string key = std::to_string(static_cast<int>(c.kind)) + (c.strict ? "s" : "n") + c.text;
  for (const OutputConstraint::Tagged& t : c.tagged) {  // each field's length first: the key is unambiguous
    key += '\0' + std::to_string(t.begin.size()) + ':' + t.begin + std::to_string(t.schema.size()) + ':' + t.schema;
    key += t.strict ? 's' : 'n';
  }
  Result result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      use_order_.splice(use_order_.end(), use_order_, it->second.use);  // now the most recently used
      return it->second.compiled;
    }
    if (auto it = compiling_.find(key); it != compiling_.end()) {
      result = it->second;  // the same constraint is on its way: wait for that one
    } else {
      if (static_cast<int32_t>(compiling_.size()) >= limits_.max_compiling)
        throw ConstraintQueueFull(std::to_string(limits_.max_compiling) + " output constraints are compiling");
      Job job{key, c, {}};
      result = job.done.get_future().share();
      compiling_.emplace(key, result);
      queue_.push_back(std::move(job));
    }
  }
  wake_.notify_one();
  if (result.wait_for(limits_.deadline) != std::future_status::ready)
    throw Error("the output constraint did not compile within " + std::to_string(limits_.deadline.count()) +
                " ms (it goes on compiling, and the same constraint sent again is served once it has; fewer anyOf "
                "alternatives and smaller repetition counts compile faster)");
  return result.get();  // rethrows the compilation's Error
}

void ConstraintCompiler::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;  // the queued jobs' promises break: their waiters get an exception
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::shared_ptr<const CompiledConstraint> compiled;
    std::exception_ptr error;
    try {
      compiled = compile_now(job.constraint);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      compiling_.erase(job.key);
      if (compiled) cache_locked(job.key, compiled);
    }
    if (error) job.done.set_exception(error);
    else job.done.set_value(std::move(compiled));
  }
}

void ConstraintCompiler::cache_locked(const std::string& key, std::shared_ptr<const CompiledConstraint> compiled) {
  const int64_t bytes = static_cast<int64_t>(compiled->grammar.MemorySizeBytes()) + static_cast<int64_t>(key.size());
  if (bytes > limits_.max_cache_bytes || cache_.count(key) != 0) return;  // too large to keep: used once
  while (cache_bytes_ + bytes > limits_.max_cache_bytes && !use_order_.empty()) {
    const auto evicted = cache_.find(use_order_.front());
    cache_bytes_ -= evicted->second.bytes;
    cache_.erase(evicted);
    use_order_.pop_front();
  }
  use_order_.push_back(key);
  cache_.emplace(key, Cached{std::move(compiled), bytes, std::prev(use_order_.end())});
  cache_bytes_ += bytes;
}

size_t ConstraintCompiler::cached_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

int64_t ConstraintCompiler::cached_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_bytes_;
}

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile_now(const OutputConstraint& c) {
  try {
    switch (c.kind) {
      // Compact JSON (no free whitespace between tokens): with whitespace allowed anywhere, small
      // models spend their whole budget on newlines inside an object.
      case OutputConstraint::Kind::kJson:
        return std::make_shared<const CompiledConstraint>(CompiledConstraint{impl_->compiler.CompileJSONSchema(
            R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt, std::nullopt, /*strict_mode=*/false)});
      case OutputConstraint::Kind::kJsonSchema:
        return std::make_shared<const CompiledConstraint>(CompiledConstraint{impl_->compiler.CompileJSONSchema(
            bounded_schema_text(c.text), /*any_whitespace=*/false, std::nullopt, std::nullopt, c.strict)});
      case OutputConstraint::Kind::kGrammar:
        check_grammar_bounds(c.text);
        return std::make_shared<const CompiledConstraint>(CompiledConstraint{impl_->compiler.CompileGrammar(c.text, "root")});
      case OutputConstraint::Kind::kTagged:
        return std::make_shared<const CompiledConstraint>(CompiledConstraint{impl_->compiler.CompileGrammar(tagged_grammar(c))});
      case OutputConstraint::Kind::kNone:
        break;
    }
    throw Error("no constraint to compile");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const char* what = c.kind == OutputConstraint::Kind::kGrammar  ? "the grammar"
                       : c.kind == OutputConstraint::Kind::kTagged ? "the tagged constraint"
                                                                   : "the JSON schema";
    throw Error(std::string(what) + " cannot be used: " + library_message(e.what()));
  }
}

struct ConstraintMatcher::Impl {
  // Where the output is: before its first token with a thinking span it may open, inside the
  // span, or under the grammar.
  enum class Phase { kMayThink, kThinking, kGrammar };
  Impl(std::shared_ptr<const CompiledConstraint> c, ThinkingSpan t)
      : compiled(std::move(c)), matcher(compiled->grammar), thinking(t),
        phase(t.end < 0 ? Phase::kGrammar : t.open ? Phase::kThinking : t.start >= 0 ? Phase::kMayThink : Phase::kGrammar) {}
  std::shared_ptr<const CompiledConstraint> compiled;
  xgrammar::GrammarMatcher matcher;
  ThinkingSpan thinking;
  Phase phase;
  std::vector<int32_t> bitmask;
  bool prepared = false;     // bitmask is for the next position
  bool all_allowed = false;  // ... and allows every token
};

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled, ThinkingSpan thinking)
    : impl_(std::make_unique<Impl>(std::move(compiled), thinking)) {}

ConstraintMatcher::~ConstraintMatcher() = default;

void ConstraintMatcher::prepare_mask(int32_t vocab_size) {
  Impl& m = *impl_;
  m.prepared = true;
  if (m.phase == Impl::Phase::kThinking) {
    m.all_allowed = true;
    return;
  }
  std::vector<int32_t>& mask = m.bitmask;
  mask.assign(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size)), 0);
  int64_t mask_shape[1] = {static_cast<int64_t>(mask.size())};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = mask_shape;
  m.all_allowed = !m.matcher.FillNextTokenBitmask(&t);
  const int32_t start = m.thinking.start;
  if (m.phase == Impl::Phase::kMayThink && !m.all_allowed && start < vocab_size)  // the span may open here
    mask[start / 32] = static_cast<int32_t>(static_cast<uint32_t>(mask[start / 32]) | (1u << (start % 32)));
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
  Impl& m = *impl_;
  m.prepared = false;
  switch (m.phase) {
    case Impl::Phase::kThinking:
      if (token == m.thinking.end) m.phase = Impl::Phase::kGrammar;
      return true;
    case Impl::Phase::kMayThink:
      if (token == m.thinking.start) {
        m.phase = Impl::Phase::kThinking;
        return true;
      }
      m.phase = Impl::Phase::kGrammar;
      break;
    case Impl::Phase::kGrammar: break;
  }
  return m.matcher.AcceptToken(token);
}

bool ConstraintMatcher::complete() const { return impl_->phase == Impl::Phase::kGrammar && impl_->matcher.IsTerminated(); }

bool ConstraintMatcher::thinking() const { return impl_->phase == Impl::Phase::kThinking; }

}  // namespace fathom
