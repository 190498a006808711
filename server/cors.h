#pragma once
// CORS for browser pages on other origins (http.cors_origins; default none: no CORS headers, and
// a preflight is refused). An allowed Origin gets Access-Control-Allow-Origin on every response of
// the server's routes (its own origin echoed with Vary: Origin; "*" when the list holds "*"), and
// a preflight (OPTIONS with Access-Control-Request-Method) is answered before the API key check,
// which a browser's preflight never carries. Credentials are never allowed: an API key travels in
// the Authorization header, which the preflight permits, not in cookies.
#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"

namespace fathom {

class Cors {
 public:
  // `origins`: "*" or exact origins ("https://app.example:8443"). Throws fathom::Error for an
  // entry that is neither (a path, no scheme, credentials in it).
  explicit Cors(std::vector<std::string> origins);

  // OPTIONS with Origin and Access-Control-Request-Method.
  static bool is_preflight(const HttpRequest& req);
  // A preflight's answer (200) when its origin is allowed, else nullopt (the caller answers 403).
  std::optional<HttpResponse> preflight(const HttpRequest& req) const;
  // Adds the response headers `req`'s origin is allowed (none without an allowed Origin).
  void decorate(const HttpRequest& req, HttpResponse& r) const;

 private:
  bool allowed(const std::string& origin) const;
  std::vector<std::string> origins_;
  bool any_ = false;  // "*"
};

}  // namespace fathom
