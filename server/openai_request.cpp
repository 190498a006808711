#include "server/openai_request.h"

#include <charconv>
#include <cmath>

#include "base/error.h"
#include "engine/model/model.h"
#include "server/attention_options.h"
#include "server/bounded_json.h"
#include "server/chat_input.h"
#include "server/config.h"
#include "server/harmony.h"
#include "server/json_fields.h"
#include "server/known_fields.h"
#include "server/request_rules.h"
#include "server/schema_rules.h"

namespace fathom {

namespace {

using nlohmann::json;


[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

[[noreturn]] void bad_type(const std::string& param, const char* expected) {
  throw ApiError(400, "'" + param + "' must be " + expected, param, "invalid_type");
}

// The value of `key`, or nullptr when absent or null (null means "use the default" in OpenAI's API).
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15;
}

std::optional<int64_t> get_int(const json& body, const char* key, int64_t min, int64_t max) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!is_integral(*v)) bad_type(key, "an integer");
  const int64_t x = integer_value(*v);  // saturates above INT64_MAX: such a value is out of range here
  const bool above = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
  if (above || x < min || x > max) {
    // Appended piece by piece: GCC 12's -Wrestrict misreads the chained operator+ once inlined.
    std::string message = "'";
    message.append(key).append("' must be between ").append(std::to_string(min)).append(" and ");
    message.append(std::to_string(max)).append(", got ");
    message.append(above ? std::to_string(v->get<uint64_t>()) : std::to_string(x));
    bad(key, message);
  }
  return x;
}

// A sampling parameter: a number within its range (server/request_rules.h).
std::optional<float> get_sampling(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_type(key, "a number");
  return check_sampling_number(key, v->get<double>(), key);
}

// Any integer (type-checked only); the rules check the range.
std::optional<int64_t> get_any_int(const json& body, const char* key) {
  return get_int(body, key, INT64_MIN, INT64_MAX);
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_type(key, "true or false");
  return v->get<bool>();
}

std::vector<int32_t> token_ids(const json& array, const Model& model, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const json& v : array) {
    if (!v.is_number_integer()) bad_type(param, "a string or an array of token ids");
    const int64_t id = integer_value(v);
    if (id < 0 || id >= model.vocab())
      bad(param, "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(model.vocab()) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool all_integers(const json& array) {
  for (const json& v : array)
    if (!v.is_number_integer()) return false;
  return true;
}

constexpr size_t kMaxPrompts = 32;  // prompts in one /v1/completions request

// "prompt": a string, an array of token ids, or an array of either (one prompt each, up to
// kMaxPrompts). Each prompt's text for `echo` goes to `texts` (the string as sent, or the ids
// decoded).
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const Model& model, std::vector<std::string>& texts) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  std::vector<std::vector<int32_t>> prompts;
  auto add_text = [&](const std::string& text) {
    prompts.push_back(model.tokenizer().encode(text));
    texts.push_back(text);
  };
  auto add_ids = [&](const json& ids) {
    prompts.push_back(token_ids(ids, model, "prompt"));
    texts.push_back(model.tokenizer().decode(prompts.back()));
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
    return prompts;
  }
  if (!p->is_array()) bad_type("prompt", "a string, an array of token ids, or an array of either");
  if (p->empty()) bad("prompt", "'prompt' is empty");
  if (all_integers(*p)) {
    add_ids(*p);
    return prompts;
  }
  if (p->size() > kMaxPrompts) bad("prompt", "at most " + std::to_string(kMaxPrompts) + " prompts per request");
  for (const json& one : *p) {
    if (one.is_string()) add_text(one.get<std::string>());
    else if (one.is_array() && !one.empty() && all_integers(one)) add_ids(one);
    else bad_type("prompt", "a string, an array of token ids, or an array of either");
  }
  return prompts;
}

// Sets tools.format to the template's call format.
ChatPrompt chat_prompt(const json& body, const Model& model, ToolPlan& tools, bool add_generation_prompt = true,
                       std::string_view raw_body = {}) {
  const ChatTemplate* tmpl = nullptr;
  try {
    tmpl = &model.chat_template();
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  const ToolRendering rendering = tool_rendering(*tmpl, tools.offered());
  tools.format = rendering.format;
  const ChatInput input = chat_input(body, tools, rendering, add_generation_prompt, raw_body);
  ChatPrompt out;
  std::string text;
  try {
    out.ids = model.encode_chat(input, &text);
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  out.reasoning = reasoning_mode(*tmpl, tools.offered(), text);
  return out;
}

void parse_stop(const json& body, StopConditions& stop) {
  const json* s = field(body, "stop");
  if (!s) return;
  auto add = [&](const json& v) {
    if (!v.is_string()) bad_type("stop", "a string or an array of up to 4 strings");
    add_stop_string(v.get<std::string>(), stop, "stop");
  };
  if (s->is_array()) {
    for (const json& v : *s) add(v);
  } else {
    add(*s);
  }
}

void parse_logit_bias(const json& body, const Model& model, SamplingParams& sampling) {
  const json* b = field(body, "logit_bias");
  if (!b) return;
  if (!b->is_object()) bad_type("logit_bias", "an object mapping token ids to biases");
  for (auto it = b->begin(); it != b->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= model.vocab())
      bad("logit_bias", "logit_bias key '" + key + "' is not a token id of this model");
    if (!it->is_number()) bad_type("logit_bias", "an object mapping token ids to numbers");
    sampling.logit_bias.emplace_back(static_cast<int32_t>(id),
                                     check_sampling_number("logit_bias", it->get<double>(), "logit_bias"));
  }
}

// "fathom": {"attention": policy, "kv_read_ratio": x, "sparq"/"hip"/"alisa": {...} (see
// server/attention_options.h), "priority": int (clamped to ±limits.max_priority), "ignore_eos":
// bool, "speculative": "off" | "ngram" | "sparse" (docs/speculative.md)}. The policy starts from the server's default (config "attention").
void parse_extension(const json& body, const ServerConfig& config, Request& request) {
  const json* f = field(body, "fathom");
  if (!f) return;
  if (!f->is_object()) bad_type("fathom", "an object");
  const AttentionOptionFail fail = [](const std::string& param, const std::string& message) {
    bad("fathom." + param, "'fathom." + param + "' " + message);
  };
  check_attention_aliases(*f, fail);
  for (auto it = f->begin(); it != f->end(); ++it) {
    const std::string param = "fathom." + it.key();
    if (apply_attention_option("attention", it.key(), *it, request.attention, fail)) {
      continue;
    } else if (it.key() == "priority") {
      if (!it->is_number_integer()) bad_type(param, "an integer in [-1000000, 1000000]");
      request.priority = resolve_priority(integer_value(*it), config, param);
    } else if (it.key() == "grammar") {  // an EBNF grammar (xgrammar's dialect, root rule "root")
      if (!it->is_string() || it->get<std::string>().empty()) bad_type(param, "a non-empty EBNF grammar string");
      check_grammar_text(it->get<std::string>(), param);
      request.constraint.kind = OutputConstraint::Kind::kGrammar;
      request.constraint.text = it->get<std::string>();
    } else if (it.key() == "ignore_eos") {
      if (!it->is_boolean()) bad_type(param, "true or false");
      request.stop.ignore_eos = it->get<bool>();
    } else if (it.key() == "speculative") {
      const std::optional<Speculation> m = it->is_string() ? parse_speculation(it->get<std::string>()) : std::nullopt;
      if (!m) bad_type(param, ("one of " + std::string(kSpeculationNames)).c_str());
      request.speculative = *m;
    } else {
      bad(param, "unknown fathom option '" + it.key() + "' (" + attention_option_keys("attention") +
                     ", priority, ignore_eos, grammar, speculative)");
    }
  }
}

// "response_format": {"type": "text"} | {"type": "json_object"} |
// {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": bool}}: the
// output is constrained to it token by token (engine/constraint/grammar.h).
void parse_response_format(const json& body, OutputConstraint& constraint) {
  const json* r = field(body, "response_format");
  if (!r) return;
  if (!r->is_object() || !r->contains("type") || !(*r)["type"].is_string())
    bad_type("response_format", "an object with a 'type'");
  const std::string type = (*r)["type"].get<std::string>();
  if (type == "text") return;
  if (type == "json_object") {
    constraint.kind = OutputConstraint::Kind::kJson;
    return;
  }
  if (type != "json_schema") bad("response_format", "response_format type must be text, json_object or json_schema");
  const json* spec = field(*r, "json_schema");
  if (!spec || !spec->is_object()) bad_type("response_format.json_schema", "an object with 'name' and 'schema'");
  const json* schema = field(*spec, "schema");
  if (!schema || !(schema->is_object() || schema->is_boolean()))
    bad_type("response_format.json_schema.schema", "a JSON Schema object");
  check_schema_keywords(*schema, "response_format.json_schema.schema");
  constraint.kind = OutputConstraint::Kind::kJsonSchema;
  constraint.text = schema->dump();
  constraint.strict = get_bool(*spec, "strict").value_or(false);
}

// llama.cpp's and vLLM's spellings of structured outputs, for clients written against them:
// top-level "json_schema" (a schema) and "grammar" (GBNF, which xgrammar's EBNF reads), vLLM's
// "guided_json" (a schema or its text), "guided_grammar" and "structured_outputs" {"json" |
// "grammar"}. One output constraint per request.
void parse_peer_constraint(const json& body, OutputConstraint& constraint) {
  auto set = [&](const std::string& param, OutputConstraint c) {
    if (constraint.kind != OutputConstraint::Kind::kNone)
      bad(param, "'" + param + "' and another output constraint (response_format, fathom.grammar, ...) were both given");
    constraint = std::move(c);
  };
  auto schema = [](const json& v, const std::string& param) {
    if (v.is_string()) {
      check_schema_keywords(v.get<std::string>(), param);
      return OutputConstraint{OutputConstraint::Kind::kJsonSchema, v.get<std::string>(), false};
    }
    if (!v.is_object() && !v.is_boolean()) bad_type(param, "a JSON Schema");
    check_schema_keywords(v, param);
    return OutputConstraint{OutputConstraint::Kind::kJsonSchema, v.dump(), false};
  };
  auto grammar = [](const json& v, const std::string& param) {
    if (!v.is_string() || v.get<std::string>().empty()) bad_type(param, "a non-empty EBNF grammar string");
    check_grammar_text(v.get<std::string>(), param);
    return OutputConstraint{OutputConstraint::Kind::kGrammar, v.get<std::string>(), true};
  };
  for (const char* key : {"json_schema", "guided_json"})
    if (const json* v = field(body, key)) set(key, schema(*v, key));
  for (const char* key : {"grammar", "guided_grammar"})
    if (const json* v = field(body, key)) set(key, grammar(*v, key));
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) bad_type("structured_outputs", "an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string param = "structured_outputs." + it.key();
      if (it->is_null()) continue;
      if (it.key() == "json") set(param, schema(*it, param));
      else if (it.key() == "grammar") set(param, grammar(*it, param));
      else bad(param, "'" + param + "' is not supported (json, grammar)");
    }
  }
}

void reject_unsupported(const json& body, ApiKind kind) {
  if (kind == ApiKind::kChat && get_bool(body, "echo").value_or(false)) bad("echo", "'echo' is a /v1/completions field");
  if (field(body, "suffix")) bad("suffix", "'suffix' is not supported");
  if (kind != ApiKind::kChat)
    if (const json* t = field(body, "tools"); t && !(t->is_array() && t->empty())) bad("tools", "tools are a /v1/chat/completions field");
  if (const json* f = field(body, "functions"); f && !(f->is_array() && f->empty()))
    bad("functions", "'functions' is the deprecated spelling: send 'tools'");
  if (const json* f = field(body, "function_call"); f && !f->is_null())
    bad("function_call", "'function_call' is the deprecated spelling: send 'tool_choice'");

}

// Everything the two endpoints share; the prompt is already in out.engine.prompt.
void parse_common(const json& body, const Model& model, const ServerConfig& config, ApiRequest& out) {
  Request& r = out.engine;
  SamplingParams& s = r.sampling;
  s = default_sampling(model);
  if (auto v = get_sampling(body, "temperature")) s.temperature = *v;
  if (auto v = get_sampling(body, "top_p")) s.top_p = *v;
  if (auto v = get_int(body, "top_k", -1, model.vocab())) s.top_k = *v < 0 ? 0 : static_cast<int32_t>(*v);
  if (auto v = get_sampling(body, "min_p")) s.min_p = *v;
  if (auto v = get_sampling(body, "presence_penalty")) s.presence_penalty = *v;
  if (auto v = get_sampling(body, "frequency_penalty")) s.frequency_penalty = *v;
  if (auto v = get_sampling(body, "repetition_penalty")) s.repetition_penalty = *v;
  if (auto v = get_any_int(body, "seed")) s.seed = static_cast<uint64_t>(*v);
  r.n = resolve_n(get_any_int(body, "n"), config, "n");
  if (auto v = get_int(body, "best_of", 1, config.max_n); v && *v != r.n) bad("best_of", "'best_of' other than n is not supported");
  parse_stop(body, r.stop);
  parse_logit_bias(body, model, s);
  // vLLM's top-level extension, for clients written against it; "fathom": {"ignore_eos"} too.
  if (auto v = get_bool(body, "ignore_eos")) r.stop.ignore_eos = *v;
  parse_response_format(body, r.constraint);
  parse_peer_constraint(body, r.constraint);
  r.attention = config.attention;
  r.speculative = config.speculative;
  parse_extension(body, config, r);
  reject_unsupported(body, out.kind);
  if (const json* u = field(body, "user"); u && !u->is_string()) bad_type("user", "a string");

  out.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_type("stream_options", "an object");
    out.include_usage = get_bool(*so, "include_usage").value_or(false);
  }

  // max_tokens: every prompt plus its completion must fit in the context.
  const char* max_param = "max_tokens";
  if (out.kind == ApiKind::kChat && field(body, "max_completion_tokens")) max_param = "max_completion_tokens";
  const std::optional<int64_t> asked = get_any_int(body, max_param);
  r.max_tokens = INT32_MAX;
  auto fit = [&](size_t prompt_tokens) {
    check_prompt_fits(prompt_tokens, model, out.kind == ApiKind::kChat ? "messages" : "prompt");
    r.max_tokens = std::min(r.max_tokens, resolve_max_tokens(asked, prompt_tokens, model, config, max_param));
  };
  if (out.prompts.empty()) fit(r.prompt.size());
  for (const std::vector<int32_t>& prompt : out.prompts) fit(prompt.size());
}

}  // namespace

json parse_json_body(const std::string& body) {
  // A NUL byte is never valid JSON; refuse it rather than let any reader stop at it.
  if (body.find('\0') != std::string::npos)
    throw ApiError(400, "the request body contains a NUL byte (not valid JSON)", "", "invalid_json");
  // nlohmann's parser is iterative, but a million nested brackets still cost memory and
  // time for nothing: no valid request nests deeper than a handful of levels.
  JsonTextFault fault;
  json j = parse_bounded_json(body, &fault);
  if (fault == JsonTextFault::kTooDeep)
    throw ApiError(400, "request body nests deeper than 64 levels", "", "invalid_json");
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  return j;
}

void check_model_name(const json& body, const ServerConfig& config) {
  const json* m = field(body, "model");
  if (!m) return;
  if (!m->is_string()) bad_type("model", "a string");
  check_served_model(m->get<std::string>(), config, "model");
}

ApiRequest parse_completion_request(const json& body, const Model& model, const ServerConfig& config) {
  ApiRequest out;
  out.kind = ApiKind::kCompletion;
  out.model = config.model_name;
  check_known_fields(body, out.kind, config);
  std::vector<std::string> texts;
  out.prompts = completion_prompts(body, model, texts);
  out.engine.prompt = out.prompts[0];
  if (auto v = get_int(body, "logprobs", 0, kMaxTopLogprobs)) {
    out.logprobs = true;
    out.top_logprobs = static_cast<int32_t>(*v);
  }
  if (get_bool(body, "echo").value_or(false)) {
    // With logprobs, the echoed prompt tokens are scored too (the engine keeps every prompt
    // position's logits; evaluation harnesses score continuations this way).
    if (out.logprobs) out.engine.prompt_logprobs = out.top_logprobs;
    out.echo = std::move(texts);
  }
  parse_common(body, model, config, out);
  out.engine.sampling.logprobs = out.logprobs ? out.top_logprobs : -1;
  return out;
}

ChatPrompt encode_chat_body(const json& body, const Model& model, ToolPlan& tools, std::string_view raw_body) {
  return chat_prompt(body, model, tools, /*add_generation_prompt=*/true, raw_body);
}

ApiRequest parse_chat_request(const json& body, const Model& model, const ServerConfig& config, std::string_view raw_body) {
  ApiRequest out;
  out.kind = ApiKind::kChat;
  out.model = config.model_name;
  check_known_fields(body, out.kind, config);
  out.tools = parse_tools(body);
  ChatPrompt prompt = chat_prompt(body, model, out.tools, /*add_generation_prompt=*/true, raw_body);
  out.engine.prompt = std::move(prompt.ids);
  out.reasoning = prompt.reasoning;
  out.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto v = get_int(body, "top_logprobs", 0, kMaxTopLogprobs)) {
    if (!out.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    out.top_logprobs = static_cast<int32_t>(*v);
  }
  parse_common(body, model, config, out);
  out.engine.sampling.logprobs = out.logprobs ? out.top_logprobs : -1;
  if (OutputConstraint c = tool_constraint(out.tools); c.kind != OutputConstraint::Kind::kNone) {
    if (out.engine.constraint.kind != OutputConstraint::Kind::kNone)
      bad("tool_choice", "a required or named tool_choice cannot be combined with response_format");
    out.engine.constraint = std::move(c);
  }
  // A harmony model's JSON answer goes in its final channel, after the analysis it may write first.
  if (out.reasoning.harmony) out.engine.constraint = harmony_answer_constraint(out.engine.constraint);
  // A reasoning model's thinking: counted in usage, and free of any constraint (which starts after
  // its </think>).
  out.engine.thinking = thinking_span(out.reasoning, model.tokenizer());
  out.engine.shown_tokens = shown_call_tokens(out.tools, model.tokenizer());  // the call markers parsed
  return out;
}

std::vector<int32_t> parse_tokenize_request(const json& body, const Model& model, std::string_view raw_body) {
  // Chat input as vLLM's /tokenize takes it: the conversation, its tools and template kwargs, and
  // whether the assistant's turn is opened.
  if (field(body, "messages")) {
    ToolPlan tools = parse_tools(body);
    return chat_prompt(body, model, tools, get_bool(body, "add_generation_prompt").value_or(true), raw_body).ids;
  }
  const char* key = field(body, "prompt") ? "prompt" : "text";
  const json* text = field(body, key);
  if (!text) bad("prompt", "'prompt' (or 'text' or 'messages') is required");
  if (!text->is_string()) bad_type(key, "a string");
  EncodeOptions opts;
  opts.add_bos = get_bool(body, "add_special").value_or(true);
  return model.tokenizer().encode(text->get<std::string>(), opts);
}

std::vector<int32_t> parse_detokenize_request(const json& body, const Model& model) {
  const json* t = field(body, "tokens");
  if (!t) bad("tokens", "'tokens' is required");
  if (!t->is_array()) bad_type("tokens", "an array of token ids");
  return token_ids(*t, model, "tokens");
}

}  // namespace fathom
