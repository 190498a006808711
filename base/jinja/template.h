#pragma once
// fathom::jinja: chat templates rendered as Hugging Face's apply_chat_template renders them with
// Python's jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF's
// tojson / raise_exception / strftime_now / {% generation %}), with the byte ranges of the output
// that came from the caller's data. See docs/jinja.md.
//
//   auto t = fathom::jinja::Template::parse(source);          // throws jinja::Error (with line)
//   fathom::jinja::RenderOptions opt;
//   opt.trusted_keys = {"bos_token", "eos_token"};
//   fathom::jinja::Rendered r = t.render(context, opt);        // throws jinja::Error
//   // r.text: the prompt; r.content: ranges to encode with special tokens NOT recognised
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/jinja/error.h"
#include "base/jinja/limits.h"

namespace fathom::jinja {

// The rendered text and the byte ranges [begin, end) of it that came from untrusted context data
// (message content, tool definitions, any value not under a trusted key): ascending,
// non-overlapping, adjacent ranges merged. Same shape as engine's RenderedChat.
struct Rendered {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content;
};

struct RenderOptions {
  // Top-level context keys whose strings (all of them, at any depth) count as template text:
  // e.g. bos_token and eos_token, when they come from the model rather than the request.
  // Everything else in the context is untrusted.
  std::vector<std::string> trusted_keys;
  // The local time strftime_now() formats; unset: the real local time at render.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses `source`. Throws jinja::Error for a syntax error (line set) or a source over the limits.
  static Template parse(std::string_view source, const Limits& limits = {});
  // Renders with `context` as the template's variables (messages, tools, add_generation_prompt,
  // bos_token, ...). An ordered_json keeps the object key order the caller gave (templates that
  // print tools with tojson show it); a plain json is rendered in its (sorted) order.
  Rendered render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;
  Rendered render(const nlohmann::json& context, const RenderOptions& options = {}) const;
  const Limits& limits() const { return limits_; }

 private:
  struct Parsed;
  std::shared_ptr<const Parsed> parsed_;
  Limits limits_;
};

}  // namespace fathom::jinja
