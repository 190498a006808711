#pragma once
// Values of the Jinja interpreter: Python's object model as templates see it (None, bool, int,
// float, str, list/tuple, dict with insertion order), jinja2's Undefined, and objects (namespace,
// loop, cycler, callables). Strings carry their taint (see tstring.h). Lists and dicts are
// immutable once built (the immutable sandbox); only namespaces mutate.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/jinja/tstring.h"

namespace fathom::jinja {

class Interp;
struct Value;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject };

using List = std::vector<Value>;
struct Dict;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Namespaces, loop objects, cyclers, callables (builtins, macros, bound methods).
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  virtual std::optional<Value> getattr(const std::string& name);
  virtual bool setattr(const std::string& name, const Value& v);  // false: not assignable
  virtual bool callable() const { return false; }
  virtual Value call(Interp& in, CallArgs& args);
  virtual TString repr(int depth) const;
  virtual void clear() {}  // breaks reference cycles at the end of a render
  // How deeply the values this object holds nest (bound methods: their `self`); registered
  // objects (interp.h) stay 0: they are released one by one, never as a chain.
  int depth = 0;
};

// The deepest list/dict/bound-method nesting a value may have: destroying a value recurses
// through it, so building deeper is an error (walking is limited further by max_value_depth).
inline constexpr int kMaxBuiltDepth = 512;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // a kList written as a tuple (printed with parentheses)
  bool markup = false;  // a kString that is markupsafe.Markup (|safe, |escape): `+` HTML-escapes the other side
  bool lazy = false;   // a kList standing for a Python generator (map, select, ...): always true, no len()
  int64_t i = 0;       // kBool (0/1) and kInt
  double f = 0;
  int depth = 0;       // kList/kDict: 1 + the deepest element; kObject: Object::depth
  std::shared_ptr<const TString> s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Object> obj;
  std::shared_ptr<const std::string> hint;  // kUndefined: why ("'x' is undefined")

  static Value undefined(std::string why = "");
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(TString s);
  static Value string(std::string s) { return string(TString(std::move(s))); }
  static Value make_list(List items, bool tuple = false);
  static Value generator(List items);
  static Value make_dict(Dict d);
  static Value object(std::shared_ptr<Object> o);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_integer() const { return kind == Kind::kInt || kind == Kind::kBool; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(i); }
  const std::string& text() const { return s->text; }  // kString only
};

// A Python dict: insertion-ordered, keyed by hashable values (str, numbers, None, tuples of those).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;  // hash_key(key) -> position in items

  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value v);
  size_t size() const { return items.size(); }
};

// The dict key identity of a value (1, 1.0 and True are one key); throws for unhashable values.
std::string hash_key(const Value& v);

bool truthy(const Value& v);
// Python's type name (for messages and tests): 'str', 'int', 'dict', 'Undefined', ...
std::string type_name(const Value& v);
// str(v): strings as they are (with their taint), everything else as repr; depth bounds nesting.
TString to_str(const Value& v, int max_depth);
// repr(v) as Python prints it; tainted wholly when any string inside was.
TString repr(const Value& v, int max_depth);
std::string py_float_repr(double d);
std::string py_str_repr(std::string_view s);
// Python ==, and ordering (<0, 0, >0) for numbers, strings, sequences; throws TypeError otherwise.
bool equals(const Value& a, const Value& b, int max_depth);
int compare(const Value& a, const Value& b, int max_depth);
// Whether any string inside v is tainted.
bool any_taint(const Value& v, int max_depth);

}  // namespace fathom::jinja
