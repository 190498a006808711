#pragma once
// Log lines as JSON objects (config "log_format": "json"), one per line on stderr, for log
// collectors: {"time": "2026-11-26T01:02:03.456Z", "level": "info", "logger": "fathom",
// "thread": 1234, "msg": "..."}. Request lines carry the request's X-Request-Id in msg
// ("request_id=..."), the same id the client got in its response header.
#include <memory>

#include <spdlog/formatter.h>

namespace fathom {

std::unique_ptr<spdlog::formatter> make_json_log_formatter();

}  // namespace fathom
