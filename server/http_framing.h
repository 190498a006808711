#pragma once
// What fathom decides itself about a request's bytes before Boost.Beast's parser reads them, and
// about what the parser read: the raw head scanned for its end and for obsolete line folding, the
// framing a request may use (RFC 9112), and which X-Request-Id values are echoed. Separate from
// the transport so that scripts/fuzz.sh can drive it (fuzz_http_head) without sockets.
#include <boost/beast/http.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fathom {

// A client's X-Request-Id is echoed when it is 1-64 of [A-Za-z0-9._-] (else one is generated).
bool valid_request_id(std::string_view id);

enum class RawHead { kIncomplete, kComplete, kFolded };

// Scans a request's raw bytes for the end of its head ("\r\n\r\n") and for a line that starts
// with a space or tab: obs-fold (RFC 9112 §5.2), which Beast's parser joins to the line before
// while a proxy may read it as a field of its own, so it is refused. `from` is where the previous
// call stopped: a head that arrives a byte at a time is scanned once.
RawHead scan_raw_head(std::string_view bytes, size_t& from);

struct FramingError {
  int status;
  std::string message;
};

// RFC 9112 §6: fathom decodes one transfer coding, chunked, which must then be the only and final
// one. Beast's parser reads `chunked, identity`, `identity` or `xchunked` as "no body" and
// `gzip, chunked` as chunked, so a proxy and fathom could disagree on where the body ends;
// those, Transfer-Encoding beside Content-Length, and Transfer-Encoding in HTTP/1.0 are refused
// here before any body is read. `beast_chunked` is the parser's reading, which must agree.
std::optional<FramingError> framing_error(const boost::beast::http::request_header<>& head, bool beast_chunked);

}  // namespace fathom
