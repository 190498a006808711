// Chat templates: the model's own Jinja template through base/jinja, or a hand-written family
// (engine/model/chat_families.cpp).
#include "engine/model/chat_template.h"

#include "base/error.h"
#include "base/jinja/template.h"

namespace fathom {
namespace {

std::shared_ptr<const jinja::Template> parse_template(const std::string& text, const char* what) {
  try {
    return std::make_shared<const jinja::Template>(jinja::Template::parse(text));
  } catch (const jinja::Error& e) {
    throw Error(std::string("the model's ") + what + " does not parse: " + e.what() +
                "; name a family (chatml, gemma, llama2, llama3) or a template file with --chat-template");
  }
}

}  // namespace

ChatTemplate ChatTemplate::resolve(const std::string& template_text, const std::string& family_name,
                                   const std::string& bos_text, const std::string& eos_text,
                                   const std::string& tool_use_text) {
  ChatTemplate t;
  t.bos_text_ = bos_text;
  t.eos_text_ = eos_text;
  if (family_name == "chatml") {
    t.family_ = ChatFamily::kChatML;
    t.default_system_ = find_default_system(template_text);
  } else if (family_name == "gemma") {
    t.family_ = ChatFamily::kGemma;
  } else if (family_name == "llama2") {
    t.family_ = ChatFamily::kLlama2;
  } else if (family_name == "llama3") {
    t.family_ = ChatFamily::kLlama3;
  } else if (!family_name.empty()) {
    throw Error("unknown chat template family '" + family_name + "' (known: chatml, gemma, llama2, llama3)");
  } else if (template_text.empty()) {
    throw Error("the model has no chat template; name a family (chatml, gemma, llama2, llama3) or a template file");
  } else {
    t.family_ = ChatFamily::kJinja;
    t.source_ = template_text;
    t.jinja_ = parse_template(template_text, "chat template");
    if (!tool_use_text.empty()) {
      t.tool_use_source_ = tool_use_text;
      t.jinja_tool_use_ = parse_template(tool_use_text, "tool_use chat template");
    }
    // A template that never names `tools` cannot describe them: the server then writes its own
    // tool section into the system turn.
    t.renders_tools_ = t.jinja_tool_use_ || template_text.find("tools") != std::string::npos;
  }
  return t;
}

const char* ChatTemplate::family_name() const {
  switch (family_) {
    case ChatFamily::kJinja: return "jinja";
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kGemma: return "gemma";
    case ChatFamily::kLlama2: return "llama2";
    case ChatFamily::kLlama3: return "llama3";
  }
  return "?";
}

const std::string& ChatTemplate::source(bool with_tools) const {
  return with_tools && jinja_tool_use_ ? tool_use_source_ : source_;
}

RenderedChat ChatTemplate::render(const ChatInput& input) const {
  if (!input.messages.is_array() || input.messages.empty()) throw Error("chat template: the message list is empty");
  if (!is_jinja()) {
    std::vector<ChatMessage> messages;
    for (const auto& m : input.messages) {
      const auto content = m.find("content");
      messages.push_back({m.value("role", std::string()),
                          content == m.end() || !content->is_string() ? std::string() : content->get<std::string>()});
    }
    return render_family(family_, messages, bos_text_, default_system_, input.add_generation_prompt);
  }
  const bool with_tools = input.tools.is_array() && !input.tools.empty();
  // apply_chat_template's variables: the special tokens and the caller's kwargs, then the
  // conversation (here last, so that kwargs from a request cannot replace them).
  nlohmann::ordered_json context = input.kwargs.is_object() ? input.kwargs : nlohmann::ordered_json::object();
  context["messages"] = input.messages;
  context["tools"] = with_tools ? input.tools : nlohmann::ordered_json();
  context["documents"] = nullptr;
  context["add_generation_prompt"] = input.add_generation_prompt;
  context["bos_token"] = bos_text_;
  context["eos_token"] = eos_text_;
  jinja::RenderOptions options;
  options.trusted_keys = {"bos_token", "eos_token"};
  const jinja::Template& tmpl = with_tools && jinja_tool_use_ ? *jinja_tool_use_ : *jinja_;
  try {
    jinja::Rendered r = tmpl.render(context, options);
    return RenderedChat{std::move(r.text), std::move(r.content)};
  } catch (const jinja::Error& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

RenderedChat ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (!is_jinja()) return render_family(family_, messages, bos_text_, default_system_, add_generation_prompt);
  ChatInput input;
  for (const ChatMessage& m : messages) input.messages.push_back({{"role", m.role}, {"content", m.content}});
  input.add_generation_prompt = add_generation_prompt;
  return render(input);
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  return render(messages, add_generation_prompt).text;
}

}  // namespace fathom
