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

bool DraftModel::ensure_blocks(State& st, int32_t positions, std::span<const Round> rounds) {
  const auto in_call = [&](uint64_t id) {
    return std::any_of(rounds.begin(), rounds.end(), [&](const Round& r) { return r.id == id; });
  };
  while (!st.table.reserve(positions)) {
    // Full: the least recently used cache of a sequence not drafting now goes (it catches up
    // again if it drafts later).
    auto victim = states_.end();
    for (auto it = states_.begin(); it != states_.end(); ++it)
      if (!in_call(it->first) && (victim == states_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == states_.end()) return false;
    states_.erase(victim);
  }
  return true;
}

std::vector<int32_t> DraftModel::run(const std::vector<Step>& steps) {
  BatchPlan plan;
  for (const Step& s : steps) {
    SeqStep step;
    step.tokens = s.tokens;
    step.pos0 = s.pos0;
    step.blocks = &s.st->table.blocks();
    step.logits = s.logits ? LogitsWanted::kLast : LogitsWanted::kNone;
    plan.seqs.push_back(step);
  }
  backend_.forward(plan, logits_);
  const int64_t vocab = model_.vocab();
  std::vector<int32_t> argmax;
  for (const Step& s : steps) {
    s.st->computed.resize(static_cast<size_t>(s.pos0));
    s.st->computed.insert(s.st->computed.end(), s.tokens.begin(), s.tokens.end());
    if (!s.logits) continue;
    const float* row = logits_.data() + static_cast<int64_t>(argmax.size()) * vocab;
    argmax.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  return argmax;
}

void DraftModel::propose(std::span<Round> rounds) {
  const int32_t context = model_.config().context_length;
  struct Live {
    Round* round;
    State* st;
    int32_t len, k, next = 0;
    bool done = false;
  };
  std::vector<Step> first;  // every round's catch-up: what it gained since its last round
  std::vector<Live> live;   // the rounds that draft, in the order of `first`'s logits rows
  int32_t catch_up_left = max_chunk_;
  for (Round& r : rounds) {
    r.drafts.clear();
    const auto len = static_cast<int32_t>(r.tokens.size());
    if (r.k <= 0 || len == 0) continue;
    if (len >= context) {  // past the draft model's context: no drafts
      forget(r.id);
      continue;
    }
    State& st = states_.try_emplace(r.id, blocks_).first->second;  // pointers to elements stay valid
    st.last_used = ++clock_;
    // What it computed before and the sequence still has (a rejected draft's position is not).
    // The last token is computed again whatever: its row gives the first draft.
    int32_t keep = 0;
    const int32_t common = std::min(static_cast<int32_t>(st.computed.size()), len - 1);
    while (keep < common && st.computed[static_cast<size_t>(keep)] == r.tokens[static_cast<size_t>(keep)]) ++keep;
    st.computed.resize(static_cast<size_t>(keep));
    const int32_t missing = len - keep;
    if (missing > catch_up_left) {  // a prompt caught up over several calls, no drafts meanwhile
      if (catch_up_left == 0) continue;
      if (!ensure_blocks(st, keep + catch_up_left, rounds)) {
        forget(r.id);
        continue;
      }
      first.push_back(Step{&st, r.tokens.subspan(static_cast<size_t>(keep), static_cast<size_t>(catch_up_left)), keep, false});
      catch_up_left = 0;
      continue;
    }
    // Positions: the sequence's tokens, then drafts 1 … k-1 (draft k is never computed here).
    const int32_t k = std::min(r.k, context - len + 1);
    if (k <= 0) continue;
    if (!ensure_blocks(st, len + k - 1, rounds)) {
      forget(r.id);
      continue;
    }
    catch_up_left -= missing;
    first.push_back(Step{&st, r.tokens.subspan(static_cast<size_t>(keep)), keep, true});
    live.push_back(Live{&r, &st, len, k});
  }
  if (first.empty()) return;
  const Tokenizer& tok = model_.tokenizer();
  const std::vector<int32_t>& eog = tok.end_of_generation_ids();
  try {
    std::vector<int32_t> next = run(first);
    for (size_t i = 0; i < live.size(); ++i) live[i].next = next[i];
    for (;;) {
      std::vector<Step> steps;
      std::vector<Live*> stepping;
      for (Live& l : live) {
        if (l.done) continue;
        std::vector<int32_t>& drafts = l.round->drafts;
        l.done = l.next >= tok.vocab_size();  // a padded logit row: no token of the vocabulary
        if (l.done) continue;
        drafts.push_back(l.next);
        l.done = static_cast<int32_t>(drafts.size()) == l.k || std::find(eog.begin(), eog.end(), l.next) != eog.end();
        if (l.done) continue;
        steps.push_back(Step{l.st, std::span<const int32_t>(&drafts.back(), 1), l.len + static_cast<int32_t>(drafts.size()) - 1, true});
        stepping.push_back(&l);
      }
      if (steps.empty()) break;
      const auto t0 = std::chrono::steady_clock::now();
      next = run(steps);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                       static_cast<double>(steps.size());
      seconds_per_draft_ = seconds_per_draft_ == 0 ? s : 0.8 * seconds_per_draft_ + 0.2 * s;
      ++passes_;
      pass_rows_ += static_cast<int64_t>(steps.size());
      for (size_t i = 0; i < stepping.size(); ++i) stepping[i]->next = next[i];
    }
  } catch (...) {  // the caches it was writing are not trusted
    for (Round& r : rounds) {
      r.drafts.clear();
      forget(r.id);
    }
    throw;
  }
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
