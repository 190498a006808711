#pragma once
// Minimal command-line parsing for the subcommands: --name value / --name=value options and
// --flag switches, each declared up front; anything undeclared is an error.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fathom {

class CliArgs {
 public:
  CliArgs(std::set<std::string> options, std::set<std::string> flags)
      : options_(std::move(options)), flags_(std::move(flags)) {}
  // Throws fathom::Error for an unknown option, a missing value, or a stray argument.
  void parse(int argc, char** argv, int first);

  bool has(const std::string& name) const { return values_.count(name) || set_flags_.count(name); }
  std::optional<std::string> get(const std::string& name) const;
  const std::vector<std::string>& all(const std::string& name) const;
  std::string require(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  bool flag(const std::string& name) const { return set_flags_.count(name) > 0; }

 private:
  std::set<std::string> options_, flags_;
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> set_flags_;
};

}  // namespace fathom
