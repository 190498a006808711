#include "engine/speculative/draft_model.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/batch_plan.h"
#include "engine/model/model.h"
#include "engine/model/tokenizer.h"

namespace fathom {

DraftModel::DraftModel(const Model& model, Backend& backend, int32_t max_chunk)
    : model_(model),
      backend_(backend),
      max_chunk_(std::max(1, max_chunk)),
      blocks_(backend.kv_blocks(), backend.kv_layout().block_size) {}

void DraftModel::check_vocabulary(const Model& target, const Model& draft) {
  const Tokenizer& t = target.tokenizer();
  const Tokenizer& d = draft.tokenizer();
  if (t.vocab_size() != d.vocab_size())
    throw Error("the draft model's vocabulary has " + std::to_string(d.vocab_size()) + " tokens, the model's " +
                std::to_string(t.vocab_size()) + ": a draft model needs the model's tokenizer");
  for (int32_t id = 0; id < t.vocab_size(); ++id)
    if (t.piece(id) != d.piece(id))
      throw Error("the draft model's token " + std::to_string(id) + " is not the model's: a draft model needs the "
                  "model's tokenizer");
  std::vector<int32_t> te = t.end_of_generation_ids(), de = d.end_of_generation_ids();
  std::sort(te.begin(), te.end());
  std::sort(de.begin(), de.end());
  if (te != de) throw Error("the draft model ends generations on other tokens than the model");
}

bool DraftModel::ensure_blocks(uint64_t id, State& st, int32_t positions) {
  while (!st.table.reserve(positions)) {
    // Full: the least recently used other sequence's cache goes (it catches up again if it
    // drafts later).
    auto victim = states_.end();
    for (auto it = states_.begin(); it != states_.end(); ++it)
      if (it->first != id && (victim == states_.end() || it->second.last_used < victim->second.last_used)) victim = it;
    if (victim == states_.end()) return false;
    forget(victim->first);
  }
  return true;
}

int32_t DraftModel::run(State& st, std::span<const int32_t> tokens, int32_t pos0) {
  BatchPlan plan;
  SeqStep step;
  step.tokens = tokens;
  step.pos0 = pos0;
  step.blocks = &st.table.blocks();
  step.logits = LogitsWanted::kLast;
  plan.seqs.push_back(step);
  backend_.forward(plan, logits_);
  st.computed.resize(static_cast<size_t>(pos0));
  st.computed.insert(st.computed.end(), tokens.begin(), tokens.end());
  const int32_t vocab = model_.vocab();
  return static_cast<int32_t>(std::max_element(logits_.begin(), logits_.begin() + vocab) - logits_.begin());
}

std::vector<int32_t> DraftModel::propose(uint64_t id, std::span<const int32_t> tokens, int32_t k) {
  const auto len = static_cast<int32_t>(tokens.size());
  if (k <= 0 || len == 0) return {};
  if (len >= model_.config().context_length) {  // past the draft model's context: no drafts
    forget(id);
    return {};
  }
  State& st = states_.try_emplace(id, blocks_).first->second;
  st.last_used = ++clock_;
  // What it computed before and the sequence still has (a rejected draft's position is not).
  // The last token is computed again whatever: its row gives the first draft.
  int32_t keep = 0;
  const int32_t common = std::min(static_cast<int32_t>(st.computed.size()), len - 1);
  while (keep < common && st.computed[static_cast<size_t>(keep)] == tokens[static_cast<size_t>(keep)]) ++keep;
  st.computed.resize(static_cast<size_t>(keep));
  // Catching up a prompt: max_chunk_ tokens a round, no drafts until the rest fits one.
  if (len - keep > max_chunk_) {
    if (!ensure_blocks(id, st, keep + max_chunk_)) {
      forget(id);
      return {};
    }
    run(st, tokens.subspan(static_cast<size_t>(keep), static_cast<size_t>(max_chunk_)), keep);
    return {};
  }
  // Positions: the sequence's tokens, then drafts 1 … k-1 (draft k is never computed here).
  k = std::min(k, model_.config().context_length - len + 1);
  if (k <= 0) return {};
  if (!ensure_blocks(id, st, len + k - 1)) {
    forget(id);
    return {};
  }
  const Tokenizer& tok = model_.tokenizer();
  const std::vector<int32_t>& eog = tok.end_of_generation_ids();
  std::vector<int32_t> drafts;
  int32_t next = run(st, tokens.subspan(static_cast<size_t>(keep)), keep);
  const auto t0 = std::chrono::steady_clock::now();
  int32_t passes = 0;
  for (;;) {
    if (next >= tok.vocab_size()) break;  // a padded logit row: no token of the vocabulary
    drafts.push_back(next);
    if (static_cast<int32_t>(drafts.size()) == k || std::find(eog.begin(), eog.end(), next) != eog.end()) break;
    const int32_t one[1] = {next};
    next = run(st, one, len + static_cast<int32_t>(drafts.size()) - 1);
    ++passes;
  }
  if (passes > 0) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / passes;
    seconds_per_pass_ = seconds_per_pass_ == 0 ? s : 0.8 * seconds_per_pass_ + 0.2 * s;
  }
  return drafts;
}

LoadedDraftModel load_draft_model(const std::string& path, const Model& target, const ModelOptions& options) {
  LoadedDraftModel d;
  d.model = Model::load(path, options.chat_template);
  DraftModel::check_vocabulary(target, *d.model);
  d.backend = make_backend(*d.model, options);
  d.draft = std::make_unique<DraftModel>(*d.model, *d.backend);
  return d;
}

void DraftModel::forget(uint64_t id) { states_.erase(id); }  // its BlockTable gives the blocks back

}  // namespace fathom
