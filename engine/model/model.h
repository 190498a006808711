#pragma once
// A loaded model: the immutable artefacts of one GGUF file or Hugging Face directory (translated at
// load into what a GGUF holds: engine/model/hf_dir.h) — the mappings, hyperparameters, weight views
// (stored formats, in the mappings), tokenizer and chat template. It runs nothing:
// a Backend (engine/backend/backend.h) takes the weights it needs from it, owns the KV cache and
// runs the forward pass. One Model may serve several backends (tests compare CPU and CUDA).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/chat_template.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"

namespace fathom {

class GgufFile;

// A checkpoint's own sampling defaults, for what a request leaves unset: llama.cpp's
// general.sampling.* keys (a Hugging Face directory's generation_config.json becomes them). Unset:
// the server's defaults (engine/sampler.h).
struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;  // general.sampling.{temp,top_p,min_p,penalty_repeat}
  std::optional<int64_t> top_k;                                         // general.sampling.top_k
};

class Model {
 public:
  // `path`: a GGUF file, or a Hugging Face model directory.
  // `chat_template`: empty for the GGUF's own template (tokenizer.chat_template, with its
  // tool_use alternative), a hand-written family name (chatml, gemma, llama2, llama3), or the path
  // of a Jinja template file. Throws fathom::Error with a one-line reason for anything wrong.
  static std::unique_ptr<Model> load(const std::string& path, const std::string& chat_template = "");
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const SamplingDefaults& sampling_defaults() const { return sampling_defaults_; }
  // Throws fathom::Error when the model has no chat template and none was configured.
  const ChatTemplate& chat_template() const;
  int32_t vocab() const { return static_cast<int32_t>(weights_.output.rows); }
  // A conversation through the chat template, tokenized: special tokens only where the template
  // wrote them (message content is text: it cannot forge a turn). Throws fathom::Error as
  // chat_template() and ChatTemplate::render do.
  std::vector<int32_t> encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // `rendered_text` (optional) gets the prompt text.
  std::vector<int32_t> encode_chat(const ChatInput& input, std::string* rendered_text = nullptr) const;
  const GgufFile& file() const { return *file_; }

 private:
  Model() = default;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  SamplingDefaults sampling_defaults_;
};

}  // namespace fathom
