// Renders chat templates with fathom::jinja, many cases in one process (for
// tests/e2e/test_jinja_conformance.py, and by hand).
//
//   jinja_render < cases.jsonl > results.jsonl
//
// Each input line is a JSON object:
//   {"template": "PATH"} or {"source": "TEMPLATE TEXT"},
//   "context": {...}                    the template's variables (messages, tools, ...)
//   "now": "2024-07-26T10:11:12"        optional: the time strftime_now() sees
//   "trusted": ["bos_token", ...]       optional: RenderOptions::trusted_keys
//   "max_steps": N                      optional: Limits::max_steps (templates are parsed per value)
// Each output line: {"text": "...", "content": [[begin, end], ...]} or {"error": "message"}.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "base/jinja/template.h"

namespace {

std::tm parse_now(const std::string& s) {
  std::tm t{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, se = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &se) != 6)
    throw fathom::Error("now must be YYYY-MM-DDTHH:MM:SS");
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = se;
  std::tm copy = t;
  const time_t when = timegm(&copy);  // fills tm_wday / tm_yday
  gmtime_r(&when, &t);
  return t;
}

}  // namespace

int main() {
  std::map<std::string, fathom::jinja::Template> cache;
  std::map<std::string, std::string> parse_errors;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::ordered_json out;
    try {
      const auto c = nlohmann::ordered_json::parse(line);
      std::string key, source;
      fathom::jinja::Limits limits;
      if (c.contains("max_steps")) limits.max_steps = c["max_steps"].get<uint64_t>();
      if (c.contains("template")) {
        key = "file:" + c["template"].get<std::string>() + "#" + std::to_string(limits.max_steps);
        if (!cache.count(key) && !parse_errors.count(key)) {
          std::ifstream f(c["template"].get<std::string>(), std::ios::binary);
          if (!f) throw fathom::Error("cannot read " + c["template"].get<std::string>());
          std::stringstream ss;
          ss << f.rdbuf();
          source = ss.str();
        }
      } else {
        source = c.at("source").get<std::string>();
        key = "text:" + source + "#" + std::to_string(limits.max_steps);
      }
      if (!cache.count(key) && !parse_errors.count(key)) {
        try {
          cache.emplace(key, fathom::jinja::Template::parse(source, limits));
        } catch (const fathom::jinja::Error& e) {
          parse_errors[key] = e.what();
        }
      }
      if (parse_errors.count(key)) throw fathom::jinja::Error(parse_errors[key]);
      fathom::jinja::RenderOptions opt;
      if (c.contains("now")) opt.now = parse_now(c["now"].get<std::string>());
      if (c.contains("trusted")) opt.trusted_keys = c["trusted"].get<std::vector<std::string>>();
      const auto r = cache.at(key).render(c.value("context", nlohmann::ordered_json::object()), opt);
      out["text"] = r.text;
      out["content"] = r.content;
    } catch (const std::exception& e) {
      out = nlohmann::ordered_json::object();
      out["error"] = e.what();
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
