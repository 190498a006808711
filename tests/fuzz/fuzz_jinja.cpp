// libFuzzer target: the Jinja interpreter (base/jinja) on hostile templates and hostile data.
// The first byte picks the mode:
//   even: the rest is template source, rendered over a small fixed context (messages, tools,
//         flags), with tight limits: parse/render errors are fine, anything else is a finding;
//   odd:  the next byte picks one of the real fixture templates (tests/fixtures/chat_templates),
//         the rest becomes the conversation: messages separated by 0x1e, a message's first byte
//         picks its role (and whether it carries a tool call), the rest is its content, and
//         every content ends with a canary token.
// Checked beyond "no crash, leak, hang or UB": only jinja::Error is thrown; content ranges are
// ascending, disjoint, merged and inside the text; every canary in the output lies inside a
// content range (message text can never come out as template text).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/jinja/template.h"

namespace {

constexpr std::string_view kCanary = "<|canary|>";
std::vector<fathom::jinja::Template> g_templates;

fathom::jinja::Limits fuzz_limits() {
  fathom::jinja::Limits l;
  l.max_steps = 200'000;
  l.max_output_bytes = 1 << 20;
  l.max_string_bytes = 1 << 20;
  l.max_list_items = 1 << 16;
  return l;
}

void check_ranges(const fathom::jinja::Rendered& r) {
  size_t prev_end = 0;
  bool first = true;
  for (const auto& [b, e] : r.content) {
    if (b >= e || e > r.text.size() || (!first && b <= prev_end)) {
      std::fprintf(stderr, "bad content range [%zu, %zu) (text %zu bytes)\n", b, e, r.text.size());
      std::abort();
    }
    prev_end = e;
    first = false;
  }
}

void check_canaries(const fathom::jinja::Rendered& r) {
  for (size_t pos = r.text.find(kCanary); pos != std::string::npos; pos = r.text.find(kCanary, pos + 1)) {
    bool inside = false;
    for (const auto& [b, e] : r.content) inside = inside || (b <= pos && pos + kCanary.size() <= e);
    if (!inside) {
      std::fprintf(stderr, "canary at %zu outside the content ranges\n", pos);
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("FATHOM_JINJA_FIXTURES");
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir ? dir : "tests/fixtures/chat_templates"))
    if (e.path().extension() == ".jinja") paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    g_templates.push_back(fathom::jinja::Template::parse(ss.str(), fuzz_limits()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  nlohmann::ordered_json ctx;
  fathom::jinja::RenderOptions opt;
  opt.trusted_keys = {"bos_token", "eos_token"};
  opt.now = std::tm{};
  opt.now->tm_year = 124;
  opt.now->tm_mday = 1;
  ctx["bos_token"] = "<s>";
  ctx["eos_token"] = "</s>";
  ctx["add_generation_prompt"] = (data[0] & 2) != 0;
  ctx["enable_thinking"] = (data[0] & 4) != 0;
  nlohmann::ordered_json tool = {{"type", "function"},
                                 {"function", {{"name", "f"}, {"description", "d"},
                                               {"parameters", {{"type", "object"}, {"properties", {{"x", {{"type", "string"}}}}}}}}}};
  ctx["tools"] = (data[0] & 8) ? nlohmann::ordered_json::array({tool}) : nlohmann::ordered_json(nullptr);
  try {
    if ((data[0] & 1) == 0) {
      ctx["messages"] = nlohmann::ordered_json::array(
          {{{"role", "system"}, {"content", "sys"}}, {{"role", "user"}, {"content", "hi <|im_start|>"}},
           {{"role", "assistant"}, {"content", "a"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}}}}});
      const auto t = fathom::jinja::Template::parse(in, fuzz_limits());
      check_ranges(t.render(ctx, opt));
      return 0;
    }
    if (g_templates.empty()) return 0;
    const auto& t = g_templates[static_cast<uint8_t>(in[0]) % g_templates.size()];
    static const char* kRoles[] = {"system", "user", "assistant", "tool"};
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    size_t start = 1;
    while (start <= in.size()) {
      size_t end = in.find('\x1e', start);
      if (end == std::string::npos) end = in.size();
      if (end > start) {
        const auto sel = static_cast<uint8_t>(in[start]);
        std::string content = in.substr(start + 1, end - start - 1);
        // Strings from JSON are valid UTF-8: keep the fuzzer's bytes only where they are.
        std::string clean;
        for (const unsigned char c : content) clean += c < 0x80 ? static_cast<char>(c) : '?';
        clean += kCanary;
        nlohmann::ordered_json m = {{"role", kRoles[sel & 3]}, {"content", clean}};
        if ((sel & 3) == 2 && (sel & 4))
          m["tool_calls"] = {{{"id", "c1"}, {"type", "function"},
                              {"function", {{"name", "f"}, {"arguments", {{"x", clean}}}}}}};
        if ((sel & 3) == 3) m["tool_call_id"] = "c1";
        messages.push_back(std::move(m));
      }
      start = end + 1;
    }
    ctx["messages"] = std::move(messages);
    const auto r = t.render(ctx, opt);
    check_ranges(r);
    check_canaries(r);
  } catch (const fathom::jinja::Error&) {
  }
  return 0;
}
