#include "server/grpc_request.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/attention/policy.h"
#include "engine/model/model.h"
#include "engine/sampler.h"
#include "server/bounded_json.h"
#include "server/chat_input.h"
#include "server/config.h"
#include "server/harmony.h"
#include "server/openai_request.h"
#include "server/request_rules.h"
#include "server/schema_rules.h"

namespace fathom {
namespace {

namespace pb = ::fathom::v1;

[[noreturn]] void invalid(const std::string& message) { throw RpcError(grpc::StatusCode::INVALID_ARGUMENT, message); }

// The request's sampling, each field range-checked as over HTTP.
SamplingParams to_sampling(const pb::SamplingParameters& s, const Model& model) {
  const int32_t vocab = model.vocab();
  SamplingParams p = default_sampling(model);
  auto in_range = [](const char* name, double v) { return check_sampling_number(name, v, std::string("sampling.") + name); };
  if (s.has_temperature()) p.temperature = in_range("temperature", s.temperature());
  if (s.has_top_p()) p.top_p = in_range("top_p", s.top_p());
  if (s.has_top_k()) {
    if (s.top_k() < -1 || s.top_k() > vocab)
      invalid("sampling.top_k must be in [-1, " + std::to_string(vocab) + "] (0 or -1: off)");
    p.top_k = std::max(0, s.top_k());
  }
  if (s.has_min_p()) p.min_p = in_range("min_p", s.min_p());
  if (s.has_presence_penalty()) p.presence_penalty = in_range("presence_penalty", s.presence_penalty());
  if (s.has_frequency_penalty()) p.frequency_penalty = in_range("frequency_penalty", s.frequency_penalty());
  if (s.has_repetition_penalty()) p.repetition_penalty = in_range("repetition_penalty", s.repetition_penalty());
  if (s.has_seed()) p.seed = s.seed();
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id < 0 || id >= vocab)
      invalid("sampling.logit_bias key " + std::to_string(id) + " is not a token id of this model");
    p.logit_bias.emplace_back(id, check_sampling_number("logit_bias", bias, "sampling.logit_bias"));
  }
  std::sort(p.logit_bias.begin(), p.logit_bias.end());  // map order is unspecified; keep requests reproducible
  if (s.has_logprobs()) {
    if (s.logprobs() < 0 || s.logprobs() > kMaxTopLogprobs)
      invalid("sampling.logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    p.logprobs = s.logprobs();
  }
  validate(p, vocab);  // the sampler's own checks (fathom::Error -> INVALID_ARGUMENT)
  return p;
}

// Chat input and tools in the HTTP API's JSON shape, so that the same code (server/tools.h, the
// chat template) reads both protocols.
// The chat input's tools as JSON text in the order a client writes them (name, description,
// parameters in its own key order, strict): what the template prints with tojson.
std::string ordered_tools_text(const pb::GenerateRequest& in) {
  using nlohmann::ordered_json;
  ordered_json tools = ordered_json::array();
  for (const pb::FunctionTool& t : in.tools()) {
    ordered_json function = {{"name", t.name()}, {"description", t.description()}};
    if (!t.parameters().empty()) function["parameters"] = parse_bounded_ordered_json(t.parameters());
    function["strict"] = t.strict();
    tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return ordered_json{{"tools", std::move(tools)}}.dump();
}

nlohmann::json chat_body(const pb::GenerateRequest& in) {
  using nlohmann::json;
  json messages = json::array();
  for (const pb::ChatMessage& m : in.chat().messages()) {
    json msg = {{"role", m.role()}, {"content", m.content()}};
    if (m.tool_calls_size() > 0) {
      json calls = json::array();
      for (const pb::ToolCall& c : m.tool_calls())
        calls.push_back({{"id", c.id()}, {"type", "function"}, {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) msg["tool_call_id"] = m.tool_call_id();
    messages.push_back(std::move(msg));
  }
  json body = {{"messages", std::move(messages)}};
  if (in.tools_size() > 0) {
    json tools = json::array();
    for (int i = 0; i < in.tools_size(); ++i) {
      const pb::FunctionTool& t = in.tools(i);
      json function = {{"name", t.name()}, {"description", t.description()}, {"strict", t.strict()}};
      if (!t.parameters().empty()) {
        check_schema_keywords(t.parameters(), "tools[" + std::to_string(i) + "].parameters");  // also: JSON, depth
        function["parameters"] = json::parse(t.parameters());
      }
      tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    body["tools"] = std::move(tools);
  }
  const std::string& choice = in.tool_choice();
  if (choice == "none" || choice == "auto" || choice == "required") body["tool_choice"] = choice;
  else if (!choice.empty()) body["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice}}}};
  return body;
}

}  // namespace

// The ids of `in`, each inside the vocabulary (else INVALID_ARGUMENT).
std::vector<int32_t> checked_token_ids(const v1::TokenIds& in, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t id : in.ids()) {
    if (id < 0 || id >= vocab)
      invalid("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  return ids;
}

// The id the server reports; the same rule as /v1/models (file name without .gguf by default).
std::string model_id(const ServerConfig& config) {
  if (!config.model_name.empty()) return config.model_name;
  return std::filesystem::path(config.model).stem().string();
}

Request to_engine_request(const v1::GenerateRequest& in, const Model& model, const ServerConfig& config,
                          ToolPlan& tools, ReasoningMode& reasoning) {
  check_served_model(in.model(), config, "model");
  Request r;
  r.attention = config.attention;
  if (!in.attention().empty()) {
    try {
      r.attention.kind = policy_kind(in.attention());
    } catch (const Error& e) {
      invalid(e.what());
    }
  }
  if (in.kv_read_ratio() != 0.0) {
    if (!(in.kv_read_ratio() > 0.0 && in.kv_read_ratio() <= 1.0)) invalid("kv_read_ratio must be in (0, 1]");
    r.attention.kv_read_ratio = in.kv_read_ratio();
  }
  r.speculative = config.speculative;
  if (!in.speculative().empty()) {
    const std::optional<Speculation> m = parse_speculation(in.speculative());
    if (!m) invalid("speculative must be one of " + std::string(kSpeculationNames));
    r.speculative = *m;
  }
  const int32_t vocab = model.vocab();
  switch (in.input_case()) {
    case pb::GenerateRequest::kText:
      if (in.text().empty()) invalid("text is empty");
      r.prompt = model.tokenizer().encode(in.text());  // BOS when the vocabulary asks for it
      break;
    case pb::GenerateRequest::kTokenIds:
      r.prompt = checked_token_ids(in.token_ids(), vocab);
      break;
    case pb::GenerateRequest::kChat:
      try {
        const nlohmann::json body = chat_body(in);
        tools = parse_tools(body);
        ChatPrompt prompt = encode_chat_body(body, model, tools, in.tools_size() > 0 ? ordered_tools_text(in) : "");
        r.prompt = std::move(prompt.ids);
        reasoning = prompt.reasoning;
      } catch (const ApiError& e) {  // the HTTP API's 400s: INVALID_ARGUMENT naming the field
        invalid(e.param.empty() ? std::string(e.what()) : e.param + ": " + e.what());
      }
      break;
    case pb::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if ((in.tools_size() > 0 || !in.tool_choice().empty()) && in.input_case() != pb::GenerateRequest::kChat)
    invalid("tools and tool_choice need chat input");
  if (r.prompt.empty()) invalid("the prompt is empty: set text or token_ids");

  check_prompt_fits(r.prompt.size(), model, "text");
  r.max_tokens = resolve_max_tokens(in.has_max_tokens() ? std::optional<int64_t>(in.max_tokens()) : std::nullopt,
                                    r.prompt.size(), model, config, "max_tokens");
  r.n = resolve_n(in.n() == 0 ? std::nullopt : std::optional<int64_t>(in.n()), config, "n");
  r.priority = resolve_priority(in.priority(), config, "priority");
  for (const std::string& s : in.stop()) add_stop_string(s, r.stop, "stop");
  r.stop.ignore_eos = in.ignore_eos();
  if (in.has_constraint()) {
    const pb::OutputConstraint& c = in.constraint();
    switch (c.kind_case()) {
      case pb::OutputConstraint::kJsonObject:
        if (c.json_object()) r.constraint.kind = OutputConstraint::Kind::kJson;
        break;
      case pb::OutputConstraint::kJsonSchema:
        if (c.json_schema().empty()) invalid("constraint.json_schema is empty");
        check_schema_keywords(c.json_schema(), "constraint.json_schema");
        r.constraint = {OutputConstraint::Kind::kJsonSchema, c.json_schema(), c.strict()};
        break;
      case pb::OutputConstraint::kGrammar:
        if (c.grammar().empty()) invalid("constraint.grammar is empty");
        check_grammar_text(c.grammar(), "constraint.grammar");
        r.constraint = {OutputConstraint::Kind::kGrammar, c.grammar(), true};
        break;
      case pb::OutputConstraint::KIND_NOT_SET:
        break;
    }
  }
  if (const OutputConstraint c = tool_constraint(tools); c.kind != OutputConstraint::Kind::kNone) {
    if (r.constraint.kind != OutputConstraint::Kind::kNone) invalid("a named or required tool_choice takes no constraint");
    r.constraint = c;
  }
  // A harmony model's JSON answer goes in its final channel, after the analysis (as over HTTP).
  if (reasoning.harmony) r.constraint = harmony_answer_constraint(r.constraint);
  // A reasoning model's thinking: counted in usage, free of any constraint (as over HTTP).
  r.thinking = thinking_span(reasoning, model.tokenizer());
  r.shown_tokens = shown_call_tokens(tools, model.tokenizer());
  r.sampling = to_sampling(in.sampling(), model);
  return r;
}

}  // namespace fathom
