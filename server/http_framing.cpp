#include "server/http_framing.h"

#include <boost/beast/core.hpp>

#include <vector>

namespace fathom {

namespace beast = boost::beast;
namespace bhttp = beast::http;

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

RawHead scan_raw_head(std::string_view bytes, size_t& from) {
  for (size_t i = bytes.find("\r\n", from); i != std::string_view::npos; i = bytes.find("\r\n", i + 2)) {
    if (i + 2 >= bytes.size()) {
      from = i;
      return RawHead::kIncomplete;
    }
    const char next = bytes[i + 2];
    if (next == ' ' || next == '\t') return RawHead::kFolded;
    if (next == '\r') return RawHead::kComplete;  // an empty line: no field can follow
  }
  from = bytes.empty() ? 0 : bytes.size() - 1;  // a final '\r' may start the next CRLF
  return RawHead::kIncomplete;
}

std::optional<FramingError> framing_error(const bhttp::request_header<>& head, bool beast_chunked) {
  std::vector<std::string_view> codings;  // every Transfer-Encoding line, as one list
  bool has_transfer_encoding = false;
  const auto [first, last] = head.equal_range(bhttp::field::transfer_encoding);
  for (auto field = first; field != last; ++field) {
    has_transfer_encoding = true;
    const std::string_view value = field->value();
    size_t start = 0;
    while (start <= value.size()) {
      size_t end = value.find(',', start);
      if (end == std::string_view::npos) end = value.size();
      std::string_view item = value.substr(start, end - start);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
      if (!item.empty()) codings.push_back(item);  // empty list elements are allowed (RFC 9110 §5.6.1)
      start = end + 1;
    }
  }
  if (!has_transfer_encoding) return std::nullopt;  // Content-Length alone: Beast checks it
  if (head.count(bhttp::field::content_length) > 0)
    return FramingError{400, "a request must not carry both Content-Length and Transfer-Encoding"};
  if (head.version() < 11) return FramingError{400, "Transfer-Encoding is not allowed in an HTTP/1.0 request"};
  if (codings.empty() || !beast::iequals(codings.back(), "chunked"))
    return FramingError{400, "chunked is not the final transfer coding, so the body's length is unknown"};
  for (size_t i = 0; i + 1 < codings.size(); ++i)
    if (beast::iequals(codings[i], "chunked")) return FramingError{400, "chunked is applied more than once"};
  if (codings.size() > 1)
    return FramingError{501, "transfer coding '" + std::string(codings.front().substr(0, 64)) +
                                 "' is not implemented; only chunked is"};
  if (!beast_chunked) return FramingError{400, "malformed Transfer-Encoding"};
  return std::nullopt;
}

}  // namespace fathom
