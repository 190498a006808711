#include "base/jinja/template.h"

#include <algorithm>

#include "base/jinja/interp.h"
#include "base/jinja/parser.h"

namespace fathom::jinja {

struct Template::Parsed {
  fathom::jinja::Body body;
};

namespace {

template <typename Json>
Value from_json(const Json& j, bool tainted, int depth) {
  if (depth < 0) throw Error("context nesting too deep");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw Error("context integer too large (fathom's integers are 64-bit)");
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(TString(j.template get<std::string>(), tainted));
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x, tainted, depth - 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.set(Value::string(TString(it.key(), tainted)), from_json(it.value(), tainted, depth - 1));
      return Value::make_dict(std::move(d));
    }
    default: throw Error("unsupported JSON value in the context (binary)");
  }
}

template <typename Json>
Rendered render_impl(const Body& body, const Limits& limits, const Json& context, const RenderOptions& options) {
  if (!context.is_object()) throw Error("the template context must be a JSON object");
  std::unordered_map<std::string, Value> vars;
  for (auto it = context.begin(); it != context.end(); ++it) {
    const bool trusted =
        std::find(options.trusted_keys.begin(), options.trusted_keys.end(), it.key()) != options.trusted_keys.end();
    vars[it.key()] = from_json(it.value(), !trusted, limits.max_value_depth);
  }
  std::tm now{};
  if (options.now) {
    now = *options.now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  Interp in(limits, now);
  TString out = in.render(body, std::move(vars));
  return Rendered{std::move(out.text), std::move(out.taint)};
}

}  // namespace

Template Template::parse(std::string_view source, const Limits& limits) {
  Template t;
  auto p = std::make_shared<Parsed>();
  p->body = parse_template(source, limits);
  t.parsed_ = std::move(p);
  t.limits_ = limits;
  return t;
}

Rendered Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  return render_impl(parsed_->body, limits_, context, options);
}
Rendered Template::render(const nlohmann::json& context, const RenderOptions& options) const {
  return render_impl(parsed_->body, limits_, context, options);
}

}  // namespace fathom::jinja
