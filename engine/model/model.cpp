#include "engine/model/model.h"

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_dir.h"

namespace fathom {

Model::~Model() = default;

const ChatTemplate& Model::chat_template() const {
  if (!chat_template_)
    throw Error(file_->path() + ": the model has no chat template; name a family with --chat-template");
  return *chat_template_;
}

namespace {

std::vector<int32_t> encode_rendered(const Tokenizer& tokenizer, const RenderedChat& r) {
  // The template writes BOS itself where its model wants one (apply_chat_template tokenizes with
  // add_special_tokens=False too).
  return tokenizer.encode(r.text, EncodeOptions{/*add_bos=*/false, /*parse_special=*/true, &r.content});
}

bool is_family_name(const std::string& name) {
  return name == "chatml" || name == "gemma" || name == "llama2" || name == "llama3";
}

// The operator's --chat-template when it names a file: its text (a Jinja template).
std::string read_template_file(const std::string& path) {
  constexpr size_t kMaxTemplateBytes = 1 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("--chat-template '" + path + "' is neither a family (chatml, gemma, llama2, llama3) nor a readable file");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxTemplateBytes) throw Error("--chat-template '" + path + "' is over 1 MiB");
  return text.str();
}

}  // namespace

std::vector<int32_t> Model::encode_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  return encode_rendered(tokenizer(), chat_template().render(messages, add_generation_prompt));
}

std::vector<int32_t> Model::encode_chat(const ChatInput& input, std::string* rendered_text) const {
  const RenderedChat r = chat_template().render(input);
  if (rendered_text != nullptr) *rendered_text = r.text;
  return encode_rendered(tokenizer(), r);
}

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& chat_template) {
  std::unique_ptr<Model> m(new Model());
  // A directory is a Hugging Face checkpoint, translated into what a GGUF file would hold.
  m->file_ = open_model_file(path);
  m->config_ = ModelConfig::from_gguf(*m->file_);
  m->weights_ = ModelWeights::from_gguf(*m->file_, m->config_);
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  const GgufFile& f = *m->file_;
  m->sampling_defaults_ = SamplingDefaults{f.get_float("general.sampling.temp"), f.get_float("general.sampling.top_p"),
                                           f.get_float("general.sampling.min_p"),
                                           f.get_float("general.sampling.penalty_repeat"),
                                           f.get_int("general.sampling.top_k")};
  const Tokenizer& tok = *m->tokenizer_;
  const std::string bos = tok.bos_id() >= 0 ? tok.piece(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.piece(tok.eos_id()) : "";
  std::string family, template_text, tool_use_text;
  if (is_family_name(chat_template)) {
    family = chat_template;
    template_text = m->file_->get_string("tokenizer.chat_template").value_or("");
  } else if (!chat_template.empty()) {
    template_text = read_template_file(chat_template);
  } else {
    template_text = m->file_->get_string("tokenizer.chat_template").value_or("");
    tool_use_text = m->file_->get_string("tokenizer.chat_template.tool_use").value_or("");
    // A GGUF without a template (the Gemma 3 270M file has none) falls back to its architecture's family.
    if (template_text.empty()) family = default_family_for_architecture(m->config_.arch_name);
  }
  if (!family.empty() || !template_text.empty())
    m->chat_template_ = ChatTemplate::resolve(template_text, family, bos, eos, tool_use_text);
  return m;
}

}  // namespace fathom
