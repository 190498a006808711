#include "server/cli_args.h"

#include <charconv>

#include "base/error.h"

namespace fathom {

void CliArgs::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw Error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (flags_.count(name) && !has_value) {
      set_flags_.insert(name);
    } else if (options_.count(name)) {
      if (!has_value) {
        if (i + 1 >= argc) throw Error("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name].push_back(value);
    } else {
      throw Error("unknown option --" + name);
    }
  }
}

std::optional<std::string> CliArgs::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

const std::vector<std::string>& CliArgs::all(const std::string& name) const {
  static const std::vector<std::string> kEmpty;
  auto it = values_.find(name);
  return it == values_.end() ? kEmpty : it->second;
}

std::string CliArgs::require(const std::string& name) const {
  auto v = get(name);
  if (!v) throw Error("missing required option --" + name);
  return *v;
}

int64_t CliArgs::get_int(const std::string& name, int64_t fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size()) throw Error("option --" + name + " needs an integer, got '" + *v + "'");
  return out;
}

double CliArgs::get_double(const std::string& name, double fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    const double out = std::stod(*v, &used);
    if (used != v->size()) throw std::invalid_argument("trailing");
    return out;
  } catch (const std::exception&) {
    throw Error("option --" + name + " needs a number, got '" + *v + "'");
  }
}

}  // namespace fathom
