// libFuzzer target: a request's raw bytes as the HTTP transport sees them (server/http_framing.h),
// around Boost.Beast's parser. Input: [1 byte: the size of the pieces the bytes arrive in][bytes].
// Checked, beyond "no crash, out-of-range read, leak, UB, hang":
// - the raw-head scan of the bytes as they arrive in pieces ends as one scan of them all, so a
//   head sent a byte at a time cannot slip a folded line past it;
// - a head the scan found complete and unfolded, and that Beast's parser then accepts, holds no
//   folded line for Beast to join: every LF in it ends a CRLF, and no CRLF is followed by a space
//   or tab (a proxy would read such a line as a field of its own);
// - a head framing_error lets through with Transfer-Encoding is chunked for Beast, and its body,
//   read with the transport's limit (4 KiB here), is never longer than the limit.
#include <boost/beast/http.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "server/http_framing.h"

namespace {

namespace bhttp = boost::beast::http;
constexpr size_t kBodyLimit = 4096;

bool folded_or_bare_lf(std::string_view head) {
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i] != '\n') continue;
    if (i == 0 || head[i - 1] != '\r') return true;
    if (i + 1 < head.size() && (head[i + 1] == ' ' || head[i + 1] == '\t')) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = data[0] % 16 + 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  size_t from_whole = 0;
  const fathom::RawHead whole = fathom::scan_raw_head(bytes, from_whole);
  size_t from = 0, seen = 0;
  fathom::RawHead arriving = fathom::RawHead::kIncomplete;
  while (arriving == fathom::RawHead::kIncomplete && seen < bytes.size()) {
    seen = std::min(bytes.size(), seen + piece);
    arriving = fathom::scan_raw_head(bytes.substr(0, seen), from);
  }
  if (arriving != whole) std::abort();
  if (whole != fathom::RawHead::kComplete) return 0;  // incomplete: the transport waits; folded: 400

  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(16 << 10);
  parser.body_limit(boost::none);  // as the transport reads a head (http_transport.cpp parse_head)
  boost::beast::error_code ec;
  const size_t head_bytes = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec || !parser.is_header_done()) return 0;  // a 400 (or more bytes to wait for)
  if (folded_or_bare_lf(bytes.substr(0, head_bytes))) std::abort();

  const auto& head = parser.get();
  const std::optional<fathom::FramingError> bad = fathom::framing_error(head, parser.chunked());
  if (bad) return 0;
  if (head.count(bhttp::field::transfer_encoding) > 0 && !parser.chunked()) std::abort();
  if (parser.content_length().value_or(0) > kBodyLimit) return 0;  // 413 from its Content-Length
  parser.body_limit(kBodyLimit);
  std::string_view rest = bytes.substr(head_bytes);
  while (!ec && !parser.is_done() && !rest.empty()) {
    const size_t used = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (used == 0) break;
    rest.remove_prefix(used);
  }
  if (parser.get().body().size() > kBodyLimit) std::abort();
  return 0;
}
