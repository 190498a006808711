#include "engine/model/model.h"

#include "base/error.h"
#include "engine/model/gguf.h"

namespace fathom {

Model::~Model() = default;

const ChatTemplate& Model::chat_template() const {
  if (!chat_template_)
    throw Error(file_->path() + ": the model has no chat template; name a family with --chat-template");
  return *chat_template_;
}

std::vector<int32_t> Model::encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  const RenderedChat r = chat_template().render(messages, add_generation_prompt);
  // The template writes BOS itself where its family wants one.
  return tokenizer().encode(r.text, EncodeOptions{/*add_bos=*/false, /*parse_special=*/true, &r.content});
}

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& chat_template) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  m->config_ = ModelConfig::from_gguf(*m->file_);
  m->weights_ = ModelWeights::from_gguf(*m->file_, m->config_);
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  const std::string bos = m->tokenizer_->bos_id() >= 0 ? m->tokenizer_->piece(m->tokenizer_->bos_id()) : "";
  std::string family = chat_template;
  const std::string template_text = m->file_->get_string("tokenizer.chat_template").value_or("");
  // A GGUF without a template (the Gemma 3 270M file has none) falls back to its architecture's family.
  if (family.empty() && template_text.empty()) family = default_family_for_architecture(m->config_.arch_name);
  if (!family.empty() || !template_text.empty())
    m->chat_template_ = ChatTemplate::resolve(template_text, family, bos);
  return m;
}

}  // namespace fathom
