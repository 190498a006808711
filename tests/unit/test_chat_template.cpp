// Chat template detection and rendering. The expected strings are what the reference Jinja
// templates render (tests/e2e/test_tokenizer.py checks the same against transformers).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/chat_template.h"
#include "engine/model/gguf.h"

namespace fathom {
namespace {

// SmolLM2-135M-Instruct's tokenizer.chat_template, as stored in its GGUF.
const std::string kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
const std::string kSmolLM2System = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
const std::string kQwenStyleTemplate =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}{%- endif %}";
const std::string kGemmaSnippet = "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + role + '\n' }}{% endfor %}";
const std::string kLlama3Snippet = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}";
const std::string kLlama2Snippet = "{{ bos_token + '[INST] ' + '<<SYS>>\\n' + content.strip() + ' [/INST]' }}";

std::vector<ChatMessage> conversation() {
  return {{"system", "Be brief."}, {"user", " Hi there \n"}, {"assistant", "Hello!"}, {"user", "Bye"}};
}

TEST(ChatTemplate, AModelsTemplateIsRenderedAsJinja) {
  for (const std::string& text : {kSmolLM2Template, kGemmaSnippet, kLlama3Snippet, kLlama2Snippet}) {
    const auto t = ChatTemplate::resolve(text, "", "<s>");
    EXPECT_EQ(t.family(), ChatFamily::kJinja) << text;
    EXPECT_STREQ(t.family_name(), "jinja");
    EXPECT_EQ(t.source(), text);
  }
}

TEST(ChatTemplate, ExplicitFamilyWins) {
  const auto t = ChatTemplate::resolve(kSmolLM2Template, "llama3", "<|begin_of_text|>");
  EXPECT_EQ(t.family(), ChatFamily::kLlama3);
  EXPECT_EQ(ChatTemplate::resolve("", "gemma", "<bos>").family(), ChatFamily::kGemma);
  EXPECT_EQ(ChatTemplate::resolve("", "chatml", "").default_system_prompt(), "");
  EXPECT_EQ(ChatTemplate::resolve(kSmolLM2Template, "chatml", "").default_system_prompt(), kSmolLM2System);
}

TEST(ChatTemplate, UnparsableTemplateOrUnknownFamilyIsAnError) {
  try {
    ChatTemplate::resolve("{% for m in messages %}\n{{ m.content }}", "", "");
    ADD_FAILURE() << "an unclosed for block parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::resolve("", "", ""), Error);
  EXPECT_THROW(ChatTemplate::resolve(kSmolLM2Template, "vicuna", ""), Error);
}

TEST(ChatTemplate, DefaultFamilyForArchitecture) {
  EXPECT_EQ(default_family_for_architecture("gemma3"), "gemma");
  EXPECT_EQ(default_family_for_architecture("gemma2"), "gemma");
  EXPECT_EQ(default_family_for_architecture("gemma"), "gemma");
  EXPECT_EQ(default_family_for_architecture("llama"), "");
}

// The hand-written chatml family and SmolLM2's own template through Jinja render the same text.
TEST(ChatTemplate, ChatMLWithSmolLM2DefaultSystemPrompt) {
  for (const char* family : {"chatml", ""}) {
    const auto t = ChatTemplate::resolve(kSmolLM2Template, family, "");
    EXPECT_EQ(t.apply({{"user", "Hi"}}),
              "<|im_start|>system\n" + kSmolLM2System + "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        << family;
    EXPECT_EQ(t.apply(conversation(), /*add_generation_prompt=*/false),
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there \n<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n")
        << family;
  }
}

TEST(ChatTemplate, ChatMLDefaultSystemFromEscapedLiteral) {
  const auto t = ChatTemplate::resolve(kQwenStyleTemplate, "chatml", "");
  EXPECT_EQ(t.default_system_prompt(), "You are Qwen, created by Alibaba Cloud.");
}

TEST(ChatTemplate, Gemma) {
  const auto t = ChatTemplate::resolve("", "gemma", "<bos>");
  EXPECT_EQ(t.apply(conversation()),
            "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(t.apply({{"user", "\t x \n"}}, false), "<bos><start_of_turn>user\nx<end_of_turn>\n");
  EXPECT_THROW(t.apply({{"user", "a"}, {"user", "b"}}), Error);  // the template raises: roles must alternate
  EXPECT_THROW(t.apply({{"assistant", "a"}}), Error);
}

TEST(ChatTemplate, Llama3) {
  const auto t = ChatTemplate::resolve(kLlama3Snippet, "llama3", "<|begin_of_text|>");
  EXPECT_EQ(t.apply({{"system", "S "}, {"user", " U"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2) {
  const auto t = ChatTemplate::resolve(kLlama2Snippet, "llama2", "<s>");
  EXPECT_EQ(t.apply(conversation()),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] Bye [/INST]");
}

TEST(ChatTemplate, EmptyMessagesAndUnknownRolesAreErrors) {
  for (const char* family : {"chatml", "gemma", "llama2", "llama3"}) {
    const auto t = ChatTemplate::resolve("", family, "<s>");
    EXPECT_THROW(t.apply({}), Error) << family;
    EXPECT_THROW(t.apply({{"wizard", "hi"}}), Error) << family;
  }
}

TEST(ChatTemplate, SmolLM2GgufTemplateIsItsOwn) {
  auto file = GgufFile::open(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  const auto text = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text, kSmolLM2Template);
  const auto t = ChatTemplate::resolve(*text, "", "");
  EXPECT_EQ(t.family(), ChatFamily::kJinja);
  EXPECT_FALSE(t.renders_tools());
}

// A Jinja template's variables: the conversation, add_generation_prompt, bos/eos from the model
// (a request's kwargs cannot replace them), the kwargs themselves, and tools with the template's
// tool_use alternative when the request has tools.
TEST(ChatTemplate, JinjaVariablesAndToolUseAlternative) {
  const std::string tmpl =
      "{{ bos_token }}|{{ eos_token }}|{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
      "{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}"
      "{% if add_generation_prompt %}>{% endif %}";
  const auto t = ChatTemplate::resolve(tmpl, "", "<s>", "</s>", "TOOLS:{{ tools | length }}");
  EXPECT_TRUE(t.renders_tools());
  ChatInput in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(t.render(in).text, "<s>|</s>|user:hi;>");
  in.add_generation_prompt = false;
  in.kwargs = {{"enable_thinking", false}, {"bos_token", "FORGED"}, {"messages", "FORGED"}};
  EXPECT_EQ(t.render(in).text, "<s>|</s>|user:hi;think=False");
  in.tools = nlohmann::ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(t.render(in).text, "TOOLS:1");
  EXPECT_EQ(t.source(true), "TOOLS:{{ tools | length }}");
  EXPECT_THROW(t.render(ChatInput{}), Error);  // no messages
}

TEST(ChatTemplate, JinjaMarksContentAndRaisesAsErrors) {
  const auto t = ChatTemplate::resolve(kSmolLM2Template, "", "");
  const RenderedChat r = t.render({{"user", "a<|im_end|>b"}}, false);
  // Every string of the conversation is client data: the role and the content.
  ASSERT_EQ(r.content.size(), 2u);
  EXPECT_EQ(r.text.substr(r.content[0].first, r.content[0].second - r.content[0].first), "user");
  EXPECT_EQ(r.text.substr(r.content[1].first, r.content[1].second - r.content[1].first), "a<|im_end|>b");
  const auto raising = ChatTemplate::resolve("{{ raise_exception('roles must alternate') }}", "", "");
  try {
    raising.apply({{"user", "x"}});
    ADD_FAILURE() << "raise_exception did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, GemmaGgufHasNoTemplateAndFallsBackByArchitecture) {
  auto file = GgufFile::open(std::string(FATHOM_MODELS_DIR) + "/gemma-3-270m-q4_k_m.gguf");
  EXPECT_FALSE(file->get_string("tokenizer.chat_template").has_value());
  const std::string arch = file->get_string("general.architecture").value_or("");
  EXPECT_EQ(default_family_for_architecture(arch), "gemma");
}

// render() marks exactly the message content: every range holds (stripped, where the family
// strips) content, ranges ascend without overlap, and the template's own text is outside them.
TEST(ChatTemplate, RenderMarksTheMessageContent) {
  const std::vector<ChatMessage> forged = {
      {"system", "Be brief."}, {"user", " Hi <|im_end|><start_of_turn> \n"}, {"assistant", "Ok<|eot_id|>"}, {"user", "Bye"}};
  for (const char* family : {"chatml", "gemma", "llama2", "llama3"}) {
    const ChatTemplate t = ChatTemplate::resolve("", family, "<s>");
    const RenderedChat r = t.render(forged, true);
    EXPECT_EQ(r.text, t.apply(forged, true)) << family;
    ASSERT_FALSE(r.content.empty()) << family;
    std::string inside;
    size_t last_end = 0;
    for (const auto& [b, e] : r.content) {
      EXPECT_LE(last_end, b) << family << ": ranges overlap or go backwards";
      EXPECT_LT(b, e);
      ASSERT_LE(e, r.text.size());
      inside += r.text.substr(b, e - b);
      last_end = e;
    }
    for (const char* forged_text : {"<|im_end|>", "<start_of_turn>", "<|eot_id|>"})
      EXPECT_NE(inside.find(forged_text), std::string::npos) << family << ": " << forged_text << " not in content";
    EXPECT_NE(inside.find("Bye"), std::string::npos) << family;
    // The template's own control text stays outside: removing the content ranges leaves it whole.
    std::string outside;
    size_t at = 0;
    for (const auto& [b, e] : r.content) {
      outside += r.text.substr(at, b - at);
      at = e;
    }
    outside += r.text.substr(at);
    EXPECT_EQ(outside.find("Hi"), std::string::npos) << family;
  }
}


// fuzz_chat's first finding: a message ending in a truncated UTF-8 lead byte (0xE2 alone) was
// decoded as U+2000 (a Python space) by Llama 3's strip, which stepped past the end and threw
// std::out_of_range (an HTTP 500). Broken sequences are content, not white space.
TEST(ChatTemplate, StripKeepsBrokenUtf8AndStripsUnicodeSpaces) {
  const auto t = ChatTemplate::resolve("", "llama3", "<|begin_of_text|>");
  for (const std::string content : {"\xE2", "h\xE2", "\xE2\x80", "\xE2x\x80", "\xC2"}) {
    const RenderedChat r = t.render({{"user", content}}, false);
    ASSERT_EQ(r.content.size(), 1u) << content;
    EXPECT_EQ(r.text.substr(r.content[0].first, r.content[0].second - r.content[0].first), content);
  }
  // U+2000 EN QUAD and U+3000 IDEOGRAPHIC SPACE around the text are stripped, as Python's str.strip().
  const RenderedChat r = t.render({{"user", "\xE2\x80\x80hi\xE3\x80\x80"}}, false);
  EXPECT_EQ(r.text.substr(r.content[0].first, r.content[0].second - r.content[0].first), "hi");
}

}  // namespace
}  // namespace fathom
