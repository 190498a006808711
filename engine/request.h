#pragma once
// What a client asks the engine for, and what the engine streams back. Protocol-free: the HTTP
// and gRPC layers translate into and out of these.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/model/model_config.h"
#include "engine/sampler.h"
#include "engine/speculative/drafter.h"

namespace fathom {

struct StopConditions {
  std::vector<std::string> strings;  // generation ends before the first occurrence; never emitted
  std::vector<int32_t> token_ids;    // extra stop tokens (not emitted)
  bool ignore_eos = false;           // do not stop on the model's end-of-generation tokens
};

// Grammar-constrained decoding: what every choice's output must match. Each decode step masks
// the tokens that cannot continue a match before sampling (engine/constraint/grammar.h).
// A reasoning model's thinking span: its tokens are counted (RequestUsage::reasoning_tokens) and
// an output constraint leaves them free, applying from the token after `end` (</think>). `open`:
// the prompt left <think> open, so the output starts inside the span; otherwise the output may
// open it with `start` as its first token (a constraint's first tokens are allowed too, and any of
// them starts the grammar at once). end < 0: no span.
struct ThinkingSpan {
  int32_t start = -1, end = -1;  // token ids of <think> and </think>
  bool open = false;
  // A span that text markers open and close instead (gpt-oss's analysis channel: "<|channel|>analysis"
  // … "<|end|>"): its tokens are counted (engine/text_span_counter.h); constraints leave it to the
  // grammar, which allows the analysis itself. Both set or both empty; at most 64 bytes each.
  std::string open_text, close_text;
};

struct OutputConstraint {
  enum class Kind { kNone, kJson, kJsonSchema, kGrammar, kTagged };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema (JSON); kGrammar: an EBNF grammar (root rule "root"); kTagged: an
  // xgrammar structural tag (JSON) the output starts with, which may match nothing
  std::string text;
  bool strict = true;  // kJsonSchema: no properties beyond the schema's (additionalProperties false)
  // kTagged: after `text`, one of these: `begin` as written, then one JSON value of `schema`
  // (compact, `strict` as above). A harmony model's tool call or final answer after the analysis
  // it may open with (server/harmony.h).
  struct Tagged {
    std::string begin;
    std::string schema;
    bool strict = false;
  };
  std::vector<Tagged> tagged = {};
};

struct Request {
  std::string id;                // for logs; the engine assigns one when empty
  std::vector<int32_t> prompt;   // token ids, BOS included when wanted
  SamplingParams sampling;
  int32_t max_tokens = 16;       // per choice; clamped to the context
  int32_t n = 1;                 // choices sampled from one prefill of the prompt
  int32_t priority = 0;          // higher is scheduled first; FCFS within a priority
  StopConditions stop;
  AttentionPolicy attention;     // decode attention policy (prefill is dense)
  // Speculative decoding (docs/speculative.md): drafts verified by one dense pass. Anything but
  // kOff makes the output exactly the dense model's: every decode step is dense (`attention` only
  // picks kSparse's draft policy) and drafts are kept only where they equal what that step would emit.
  Speculation speculative = Speculation::kOff;
  OutputConstraint constraint;   // none by default
  ThinkingSpan thinking;         // a reasoning model's (none by default)
  // Control tokens whose text the output shows (detokenizing drops control tokens otherwise): a
  // tool format's markers, such as Mistral's [TOOL_CALLS], which the server parses. At most 8.
  std::vector<int32_t> shown_tokens;
  // Scores of the prompt's own tokens (the completions API's `echo` with `logprobs`): -1 off,
  // else each prompt token's logprob and this many top alternatives. Such a request's prompt is
  // prefilled in full (no prefix cache), keeping every position's logits.
  int32_t prompt_logprobs = -1;
  // An embedding request (anything but kNone): the prompt is prefilled and its final hidden states
  // pooled this way; nothing is generated (max_tokens, n, sampling, stop and constraint unused). Its
  // one event carries the pooled vector. Mean and CLS pooling compute the whole prompt (no prefix
  // cache: every position's hidden state is wanted); last-token pooling may start from cached blocks.
  Pooling embedding = Pooling::kNone;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

// One event of a request's stream. Events of different choices interleave.
struct StreamEvent {
  int32_t choice = 0;
  std::vector<int32_t> token_ids;      // tokens accepted this step (usually one)
  std::string text;                    // text that became final this step (stop strings held back)
  std::vector<SampledToken> logprobs;  // per token id, when sampling.logprobs >= 0
  // On a choice's first event when Request::prompt_logprobs >= 0: one entry per prompt token;
  // the first has no logprob (NaN, no alternatives): nothing precedes it.
  std::vector<SampledToken> prompt_logprobs;
  // An embedding request's result, on its last event (finish kStop): the pooled final hidden
  // state, dim floats, not normalised.
  std::vector<float> embedding;
  FinishReason finish = FinishReason::kNone;  // set on the choice's last event
  std::string error;                   // for kError
};

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // served from the prefix cache
  int32_t completion_tokens = 0;     // summed over choices
  int32_t reasoning_tokens = 0;      // of completion_tokens, those inside the thinking span (Request::thinking)
};

}  // namespace fathom
