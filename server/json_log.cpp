#include "server/json_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string_view>

#include <spdlog/details/log_msg.h>

namespace fathom {
namespace {

void append_escaped(std::string_view s, spdlog::memory_buf_t& out) {
  for (const char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out.append(std::string_view(u));
        } else {
          out.push_back(c);
        }
    }
  }
}

class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char time[96];
    std::snprintf(time, sizeof time, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                  utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(millis));
    dest.append(std::string_view("{\"time\":\""));
    dest.append(std::string_view(time));
    dest.append(std::string_view("\",\"level\":\""));
    const auto level = spdlog::level::to_string_view(msg.level);
    dest.append(level.data(), level.data() + level.size());
    dest.append(std::string_view("\",\"logger\":\""));
    append_escaped(std::string_view(msg.logger_name.data(), msg.logger_name.size()), dest);
    char thread[32];
    std::snprintf(thread, sizeof thread, "\",\"thread\":%zu,\"msg\":\"", msg.thread_id);
    dest.append(std::string_view(thread));
    append_escaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("\"}\n"));
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonLogFormatter>(); }
};

}  // namespace

std::unique_ptr<spdlog::formatter> make_json_log_formatter() { return std::make_unique<JsonLogFormatter>(); }

}  // namespace fathom
