// libFuzzer target: structure-aware output constraints -> the server's checks -> xgrammar's
// compiler over the real SmolLM2 vocabulary, compiled on a thread with a 256 KiB stack (as in
// tests/unit/test_constraint_bounds.cpp), so that a recursive walk without a bound is a crash here
// rather than a pass by luck on an 8 MiB stack. The bytes drive a generator of the shapes that
// attack recursion: $ref chains thousands long and cycles (with odd spellings), nested objects,
// arrays, anyOf/allOf, enums, regex patterns with nested groups; and EBNF grammars with nested
// parentheses, classes, comments and Regex macros. Every input must end compiled or in a
// fathom::Error (a 400); anything else is a finding. Sizes of fans and enums stay moderate: their
// cost is compile time, not stack (see the session note on compile-time bounds).
// The model: $FATHOM_FUZZ_MODEL, default models/smollm2-135m-instruct-q4_1.gguf (run from the repo root).
#include <fuzzer/FuzzedDataProvider.h>
#include <pthread.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/constraint/grammar.h"
#include "engine/model/model.h"
#include "server/schema_rules.h"

namespace {

using json = nlohmann::json;
const fathom::Model* g_model = nullptr;
fathom::ConstraintCompiler* g_compiler = nullptr;

// Runs f on a 256 KiB stack; a fathom::Error is an answer (400), any other exception a finding.
void on_small_stack(const std::function<void()>& f) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  auto body = [](void* p) -> void* {
    try {
      (*static_cast<const std::function<void()>*>(p))();
    } catch (const fathom::Error&) {
    }
    return nullptr;
  };
  if (pthread_create(&thread, &attr, body, const_cast<std::function<void()>*>(&f)) != 0) std::abort();
  pthread_attr_destroy(&attr);
  pthread_join(thread, nullptr);
}

std::string def_name(int i) {
  std::string name = "d";
  name += std::to_string(i);
  return name;
}

// A $ref: to the root, to a def (sometimes spelled with an empty segment), or nowhere.
std::string ref(FuzzedDataProvider& p, int defs) {
  switch (p.ConsumeIntegralInRange(0, 7)) {
    case 0: return "#";
    case 1: return "#/";
    case 2: return "#/$defs//" + def_name(p.ConsumeIntegralInRange(0, defs));
    case 3: return "#/properties/a";
    case 4: return p.ConsumeRandomLengthString(16);
    default: return "#/$defs/" + def_name(p.ConsumeIntegralInRange(0, defs));
  }
}

// A regex: random metacharacters, or groups nested k deep.
std::string regex(FuzzedDataProvider& p) {
  if (p.ConsumeBool()) {
    const int k = p.ConsumeIntegralInRange(0, 3000);
    return std::string(k, '(') + "a" + std::string(k, ')');
  }
  static const char kAlphabet[] = "()[]\\a|*+?{}^$.,0123456789-";
  std::string s;
  for (int n = p.ConsumeIntegralInRange(0, 64); n > 0 && p.remaining_bytes(); --n)
    s += kAlphabet[p.ConsumeIntegralInRange<size_t>(0, sizeof(kAlphabet) - 2)];
  return s;
}

json schema(FuzzedDataProvider& p, int depth, int defs) {
  const int kind = depth > 6 || !p.remaining_bytes() ? 9 : p.ConsumeIntegralInRange(0, 9);
  switch (kind) {
    case 0: {
      json props = json::object(), required = json::array();
      for (int n = p.ConsumeIntegralInRange(1, 3); n > 0; --n) {
        const std::string key = p.ConsumeBool() ? "a" : p.ConsumeRandomLengthString(8);
        props[key] = schema(p, depth + 1, defs);
        if (p.ConsumeBool()) required.push_back(key);
      }
      return {{"type", "object"}, {"properties", props}, {"required", required}};
    }
    case 1: return {{"type", "array"}, {"items", schema(p, depth + 1, defs)}};
    case 2: {
      json options = json::array();
      for (int n = p.ConsumeIntegralInRange(1, 4); n > 0; --n) options.push_back(schema(p, depth + 1, defs));
      return {{p.ConsumeBool() ? "anyOf" : "oneOf", options}};
    }
    case 3: return {{"$ref", ref(p, defs)}};
    case 4: {
      json values = json::array();
      for (int n = p.ConsumeIntegralInRange(1, 64); n > 0; --n) values.push_back(p.ConsumeRandomLengthString(8));
      return {{"enum", values}};
    }
    case 5: return {{"type", "string"}, {"pattern", regex(p)}};
    case 6: return {{"allOf", {schema(p, depth + 1, defs)}}};
    case 7: return {{"type", "object"}, {"patternProperties", {{regex(p), schema(p, depth + 1, defs)}}}};
    case 8: return {{"type", "array"}, {"prefixItems", {schema(p, depth + 1, defs)}}, {"items", false}};
    default: return {{"type", p.PickValueInArray({"integer", "string", "boolean", "null", "number"})}};
  }
}

// A root schema with $defs: a few generated ones, then maybe a chain thousands long (each link a
// bare $ref or one wrapped in an object) that ends in a leaf or loops back.
json schema_document(FuzzedDataProvider& p) {
  const int defs = p.ConsumeIntegralInRange(0, 6);
  const int chain = p.ConsumeBool() ? p.ConsumeIntegralInRange(0, 6000) : 0;
  json all = json::object();
  for (int i = 0; i < defs; ++i) all[def_name(i)] = schema(p, 1, defs + chain);
  const bool wrapped = p.ConsumeBool();
  for (int i = defs; i < defs + chain; ++i) {
    const json link = {{"$ref", "#/$defs/" + def_name(i + 1)}};
    all[def_name(i)] = wrapped ? json{{"type", "object"}, {"properties", {{"x", link}}}} : link;
  }
  all[def_name(defs + chain)] = p.ConsumeBool() ? json{{"$ref", "#/$defs/" + def_name(defs)}} : json{{"type", "integer"}};
  json root = schema(p, 0, defs + chain);
  if (root.is_object() && p.ConsumeBool()) root["$ref"] = "#/$defs/" + def_name(p.ConsumeIntegralInRange(0, defs));
  root["$defs"] = all;
  return root;
}

std::string grammar(FuzzedDataProvider& p) {
  std::string g = "root ::= ";
  const int nest = p.ConsumeBool() ? p.ConsumeIntegralInRange(0, 5000) : p.ConsumeIntegralInRange(0, 8);
  g += std::string(nest, '(');
  for (int n = p.ConsumeIntegralInRange(1, 8); n > 0 && p.remaining_bytes(); --n) {
    switch (p.ConsumeIntegralInRange(0, 5)) {
      case 0: g += " \"" + p.ConsumeRandomLengthString(8) + "\""; break;
      case 1: g += " [a-z(]"; break;
      case 2: g += " Regex(\"" + regex(p) + "\")"; break;
      case 3: g += " # ((( comment\n "; break;
      case 4: g += " rest"; break;
      default: g += " " + p.ConsumeRandomLengthString(8); break;
    }
  }
  g += std::string(nest, ')');
  g += "\nrest ::= \"x\" | \"y\" rest\n";
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("FATHOM_FUZZ_MODEL");
  g_model = fathom::Model::load(path ? path : "models/smollm2-135m-instruct-q4_1.gguf").release();
  g_compiler = new fathom::ConstraintCompiler(g_model->tokenizer(), g_model->vocab());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  fathom::OutputConstraint c;
  try {
    if (p.ConsumeBool()) {
      const json doc = schema_document(p);
      fathom::check_schema_keywords(doc, "fuzz");
      // The generator's random strings may be invalid UTF-8, which a parsed request never holds:
      // written as the server writes JSON (invalid bytes -> U+FFFD), not thrown on here.
      c = {fathom::OutputConstraint::Kind::kJsonSchema, doc.dump(-1, ' ', false, json::error_handler_t::replace),
           p.ConsumeBool()};
    } else {
      c = {fathom::OutputConstraint::Kind::kGrammar, grammar(p), true};
      fathom::check_grammar_text(c.text, "fuzz");
    }
  } catch (const fathom::Error&) {
    return 0;  // a 400 from the server's checks
  }
  on_small_stack([&] { g_compiler->compile(c); });
  return 0;
}
