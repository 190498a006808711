#include "engine/constraint/constraint_bounds.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/error.h"

namespace fathom {
namespace {

using json = nlohmann::json;

// A client's text in a message, cut short: an error never echoes a 600 KiB $ref back.
std::string clip(std::string_view s) {
  constexpr size_t kShown = 80;
  return s.size() <= kShown ? std::string(s) : std::string(s.substr(0, kShown)) + "...";
}

// xgrammar's reading of a $ref (json_schema_converter.cc, ResolveRef): "#" is the root; "#/a/b"
// walks object keys a then b (no ~0/~1 unescaping); anything else is not followed (it becomes
// "any value"), and neither is a path that does not exist (compiling fails). nullptr: not followed.
const json* resolve_ref(const json& root, std::string_view uri) {
  if (uri == "#") return &root;
  if (uri.size() < 2 || uri[0] != '#' || uri[1] != '/') return nullptr;
  const json* at = &root;
  for (size_t begin = 2;;) {
    const size_t slash = uri.find('/', begin);
    const std::string_view part = uri.substr(begin, slash == std::string_view::npos ? slash : slash - begin);
    // xgrammar skips empty segments, so "#/$defs//a" would be a second name for "#/$defs/a", and
    // its memo of generated $refs (by spelling) would not stop a cycle through both.
    if (part.empty()) throw Error("the JSON schema's $ref '" + clip(uri) + "' has an empty path segment");
    if (!at->is_object()) return nullptr;
    const auto it = at->find(std::string(part));
    if (it == at->end()) return nullptr;
    at = &*it;
    if (slash == std::string_view::npos) return at;
    begin = slash + 1;
  }
}

// The schema as a graph: a node per JSON object or array (pre-order: a parent before its
// children), an edge to each object or array it holds and, for an object whose "$ref" names one,
// to that node.
struct SchemaGraph {
  std::vector<const json*> nodes;
  std::vector<int32_t> parent;            // -1: the root
  std::vector<std::vector<int32_t>> out;  // children, then the $ref target
  std::vector<uint8_t> is_target;         // some $ref names this node
};

SchemaGraph build_graph(const json& root) {
  SchemaGraph g;
  std::vector<std::pair<const json*, int32_t>> todo{{&root, -1}};
  while (!todo.empty()) {
    const auto [value, parent] = todo.back();
    todo.pop_back();
    const auto id = static_cast<int32_t>(g.nodes.size());
    g.nodes.push_back(value);
    g.parent.push_back(parent);
    g.out.emplace_back();
    if (parent >= 0) g.out[parent].push_back(id);
    for (const json& child : *value)
      if (child.is_structured()) todo.emplace_back(&child, id);
  }
  g.is_target.assign(g.nodes.size(), 0);
  std::unordered_map<const json*, int32_t> id_of;
  id_of.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) id_of.emplace(g.nodes[i], static_cast<int32_t>(i));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const json& node = *g.nodes[i];
    if (!node.is_object()) continue;
    const auto ref = node.find("$ref");
    if (ref == node.end() || !ref->is_string()) continue;
    const json* target = resolve_ref(root, ref->get_ref<const std::string&>());
    if (!target || !target->is_structured()) continue;
    const int32_t t = id_of.at(target);
    g.out[i].push_back(t);
    g.is_target[t] = 1;
  }
  return g;
}

// An upper bound on the depth of xgrammar's recursion over the schema, in JSON levels.
// xgrammar descends from the root into subschemas and, at a $ref it has not generated yet, into
// the schema the $ref names (a rule per $ref spelling, allocated before descending: a cycle stops
// there). So its stack is a walk along this graph's edges, and a node can be on it more than once
// only inside a strongly connected component, each time in the descent from a different entry: the
// root, or a $ref target above it or at it. A component of one node without a self-loop counts 1;
// any other counts, per node, 1 + the $ref targets among the node and its ancestors. The bound is
// the heaviest path through the components (Tarjan's algorithm yields them sinks first), all
// iterative, linear in the schema's size.
int64_t expanded_depth(const SchemaGraph& g) {
  const auto n = static_cast<int32_t>(g.nodes.size());
  std::vector<int64_t> entries(n);  // 1 + $ref targets among the node and its ancestors
  for (int32_t v = 0; v < n; ++v) entries[v] = 1 + g.is_target[v] + (g.parent[v] >= 0 ? entries[g.parent[v]] - 1 : 0);

  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1), open;
  std::vector<uint8_t> is_open(n, 0);
  std::vector<int64_t> heaviest;  // per component: its weight + the heaviest path after it
  std::vector<int32_t> members;
  struct Frame {
    int32_t node;
    size_t next_edge;
  };
  std::vector<Frame> calls;
  int32_t visited = 0;
  auto enter = [&](int32_t v) {
    index[v] = low[v] = visited++;
    open.push_back(v);
    is_open[v] = 1;
    calls.push_back({v, 0});
  };
  enter(0);
  while (!calls.empty()) {
    Frame& f = calls.back();
    const int32_t v = f.node;
    if (f.next_edge < g.out[v].size()) {
      const int32_t w = g.out[v][f.next_edge++];
      if (index[w] < 0) enter(w);
      else if (is_open[w]) low[v] = std::min(low[v], index[w]);
      continue;
    }
    calls.pop_back();
    if (!calls.empty()) low[calls.back().node] = std::min(low[calls.back().node], low[v]);
    if (low[v] != index[v]) continue;
    const auto c = static_cast<int32_t>(heaviest.size());
    members.clear();
    for (int32_t w = -1; w != v;) {
      w = open.back();
      open.pop_back();
      is_open[w] = 0;
      component[w] = c;
      members.push_back(w);
    }
    const bool self_loop = std::find(g.out[v].begin(), g.out[v].end(), v) != g.out[v].end();
    int64_t weight = 0, after = 0;
    if (members.size() == 1 && !self_loop) weight = 1;
    else
      for (const int32_t w : members) weight += entries[w];
    for (const int32_t w : members)
      for (const int32_t next : g.out[w])
        if (component[next] != c) after = std::max(after, heaviest[component[next]]);
    heaviest.push_back(weight + after);
  }
  return heaviest[component[0]];
}

void check_regex(std::string_view regex, const std::string& where) {
  if (regex_group_depth(regex) > ConstraintBounds::kMaxRegexGroups)
    throw Error(where + " nests more than " + std::to_string(ConstraintBounds::kMaxRegexGroups) + " groups");
}

// An EBNF string literal's text from `at` (just past its opening quote) to its closing quote,
// with xgrammar's escapes decoded where they could spell a regex metacharacter; `at` moves past it.
std::string ebnf_string(std::string_view g, size_t& at) {
  std::string text;
  auto hex = [&](size_t digits) {
    uint32_t cp = 0;
    for (size_t k = 0; k < digits && at < g.size() && std::isxdigit(static_cast<unsigned char>(g[at])); ++k, ++at)
      cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(g[at])) ? g[at] - '0'
                                                                                          : (g[at] | 0x20) - 'a' + 10);
    return cp < 0x80 ? static_cast<char>(cp) : 'x';  // only ASCII can be a metacharacter
  };
  while (at < g.size() && g[at] != '"' && g[at] != '\n' && g[at] != '\r') {
    if (g[at] != '\\' || at + 1 >= g.size()) {
      text += g[at++];
      continue;
    }
    const char e = g[at + 1];
    at += 2;
    if (e == 'u') text += hex(4);
    else if (e == 'U') text += hex(8);
    else if (e == 'x') text += hex(2);
    else text += e;  // \\ \" \( ...: the character itself (\n and the like are harmless letters)
  }
  ++at;  // the closing quote
  return text;
}

}  // namespace

int regex_group_depth(std::string_view regex) {
  int depth = 0, deepest = 0;
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c == '\\') {
      ++i;  // the escaped character (a UTF-8 tail byte is never a metacharacter)
    } else if (c == '[') {  // a class ends at the first unescaped ']', as in xgrammar
      for (++i; i < regex.size() && regex[i] != ']'; ++i)
        if (regex[i] == '\\') ++i;
    } else if (c == '(') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ')' && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_schema_bounds(const json& schema) {
  if (!schema.is_structured()) return;  // true / false
  const SchemaGraph g = build_graph(schema);
  if (expanded_depth(g) > ConstraintBounds::kMaxSchemaLevels)
    throw Error("the JSON schema nests more than " + std::to_string(ConstraintBounds::kMaxSchemaLevels) +
                " levels of objects and arrays, counting each $ref as the schema it names");
  for (const json* node : g.nodes) {
    if (!node->is_object()) continue;
    if (const auto p = node->find("pattern"); p != node->end() && p->is_string())
      check_regex(p->get_ref<const std::string&>(), "a 'pattern' in the JSON schema");
    if (const auto p = node->find("patternProperties"); p != node->end() && p->is_object())
      for (const auto& [key, value] : p->items()) check_regex(key, "a 'patternProperties' key in the JSON schema");
  }
}

void check_grammar_bounds(std::string_view g) {
  int depth = 0;
  for (size_t i = 0; i < g.size();) {
    const char c = g[i++];
    if (c == '#') {  // a comment, to the end of the line
      while (i < g.size() && g[i] != '\n') ++i;
    } else if (c == '"') {
      check_regex(ebnf_string(g, i), "a string in the grammar (read as a regex)");
    } else if (c == '[') {
      for (; i < g.size() && g[i] != ']'; ++i)
        if (g[i] == '\\') ++i;
      ++i;
    } else if (c == '(') {
      if (++depth > ConstraintBounds::kMaxGrammarParens)
        throw Error("the grammar nests more than " + std::to_string(ConstraintBounds::kMaxGrammarParens) +
                    " parentheses");
    } else if (c == ')' && depth > 0) {
      --depth;
    }
  }
}

}  // namespace fathom
