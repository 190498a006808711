#pragma once
// Drafters of speculative decoding (docs/speculative.md): what proposes the tokens one dense pass
// then verifies. A drafter only proposes; the output is the verifier's, so no drafter changes it.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace fathom {

// A request's speculative decoding. kOff: one token per step. kNgram: prompt lookup over the
// sequence's own tokens (no model). kSparse: the same model decoding through a sparse attention
// policy over the same KV cache (a few cheap steps per dense verify step). kModel: a smaller draft
// model with the same tokenizer, loaded beside the model (engine/speculative/draft_model.h).
// kAuto: per sequence and round, the first of them whose cost rule says it pays (prompt lookup,
// then the draft model when there is one, then sparse).
enum class Speculation { kOff, kNgram, kSparse, kModel, kAuto };
inline constexpr Speculation kDrafters[] = {Speculation::kNgram, Speculation::kSparse, Speculation::kModel};

const char* speculation_name(Speculation s);  // "off", "ngram", "sparse", "model", "auto"
std::optional<Speculation> parse_speculation(std::string_view name);
inline constexpr std::string_view kSpeculationNames = "off, ngram, sparse, model, auto";

// Prompt lookup (n-gram matching, as vLLM's "ngram" and llama.cpp's lookup decoding): the longest
// suffix of `tokens` of n_max down to n_min tokens that also occurs earlier, and the tokens that
// followed its latest earlier occurrence, at most `max` of them. Empty when no suffix recurs.
// O(tokens.size() * n_max) comparisons.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t max, int32_t n_max = 4, int32_t n_min = 2);

}  // namespace fathom
