#pragma once
// The `model` drafter (Speculation::kModel, docs/speculative.md): a second, smaller model with the
// target's vocabulary (a smaller sibling, or the same model quantized harder), beside the target
// with its own backend and KV cache, proposing k greedy tokens a round. Greedy drafts are a point
// mass q, so the verifier's rule (keep draft d iff the token drawn from the target's row is d)
// keeps the output exactly the target's, greedy or sampled with a seed.
//
// It keeps each sequence's K/V between rounds: a round first computes what the sequence gained
// since the last one (the kept drafts and the verify step's own token), found as the longest
// common prefix of the tokens it computed and the sequence's tokens, so a rejected draft's K/V is
// just written over. A sequence's first round computes its whole prompt, up to `max_chunk` tokens
// a round (a long prompt is caught up over several steps, the sequence decoding plainly meanwhile,
// so no step waits for the draft model's whole prefill). The rounds of a step's sequences run
// together: one pass computes every sequence's catch-up, then each one-token pass advances every
// sequence still drafting (the draft model's weights are read once a pass for all of them, as the
// target's are once a step).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"

namespace fathom {

class Backend;
class Model;
struct ModelOptions;

class DraftModel {
 public:
  // `model` and `backend` (built for it) are the caller's and outlive this.
  DraftModel(const Model& model, Backend& backend, int32_t max_chunk = 512);

  // Throws fathom::Error unless `draft` reads and writes the target's tokens: the same vocabulary
  // size, the same text for every token id, the same end-of-generation ids.
  static void check_vocabulary(const Model& target, const Model& draft);

  // One sequence's round: up to k greedy drafts continuing `tokens` (its prompt and output, the last
  // token not computed by the target yet) for the sequence `id` (> 0, one round each a call).
  struct Round {
    uint64_t id = 0;
    std::span<const int32_t> tokens;
    int32_t k = 0;
    std::vector<int32_t> drafts;  // out
  };
  // Every round's drafts, computed together. A round gets none while its prompt is caught up (at
  // most max_chunk tokens of catching up a call, over all rounds) or when the draft's KV cache has
  // no room for it even after dropping the caches of sequences not in this call (least recently
  // used first). Throws what the backend throws (the rounds' caches are then forgotten).
  void propose(std::span<Round> rounds);
  // The sequence `id` is gone: its blocks go back.
  void forget(uint64_t id);

  // Wall seconds a draft of one sequence costs: a one-token pass's time over the sequences it
  // advanced (moving average; 0 before the first).
  double seconds_per_draft() const { return seconds_per_draft_; }
  int64_t passes() const { return passes_; }          // one-token passes run
  int64_t pass_rows() const { return pass_rows_; }    // drafts they computed (rows over all passes)
  const Model& model() const { return model_; }
  int32_t cached_sequences() const { return static_cast<int32_t>(states_.size()); }

 private:
  struct State {
    explicit State(BlockAllocator& pool) : table(pool) {}
    std::vector<int32_t> computed;  // tokens whose K/V are in `table`, in order
    BlockTable table;
    uint64_t last_used = 0;
  };
  // Blocks for `positions` positions of `st`; frees the caches of sequences not in `rounds`
  // (LRU) when short.
  bool ensure_blocks(State& st, int32_t positions, std::span<const Round> rounds);
  // One forward of the steps (tokens, pos0 over their state's blocks): the argmax of every step
  // that wants its last row's logits, in order; the states' `computed` extended.
  struct Step {
    State* st;
    std::span<const int32_t> tokens;
    int32_t pos0;
    bool logits;
  };
  std::vector<int32_t> run(const std::vector<Step>& steps);

  const Model& model_;
  Backend& backend_;
  const int32_t max_chunk_;
  BlockAllocator blocks_;
  std::unordered_map<uint64_t, State> states_;
  uint64_t clock_ = 0;
  std::vector<float> logits_;
  double seconds_per_draft_ = 0;
  int64_t passes_ = 0, pass_rows_ = 0;
};

// A draft model loaded from `path` (GGUF or Hugging Face directory) on the backend and with the
// options the target runs with (threads, precision, KV type and budget), its vocabulary checked
// against `target`'s. Throws fathom::Error.
struct LoadedDraftModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DraftModel> draft;
};
LoadedDraftModel load_draft_model(const std::string& path, const Model& target, const ModelOptions& options);

}  // namespace fathom
