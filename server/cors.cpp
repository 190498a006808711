#include "server/cors.h"

#include <algorithm>
#include <cctype>

#include "base/error.h"

namespace fathom {
namespace {

// scheme "://" host [":" port], nothing after: what a browser sends as Origin.
bool is_origin(const std::string& o) {
  const size_t sep = o.find("://");
  if (sep == std::string::npos || sep == 0 || sep + 3 >= o.size()) return false;
  for (size_t i = 0; i < sep; ++i)
    if (!std::isalnum(static_cast<unsigned char>(o[i])) && o[i] != '+' && o[i] != '-' && o[i] != '.') return false;
  return o.find_first_of("/?#@ ", sep + 3) == std::string::npos;
}

}  // namespace

Cors::Cors(std::vector<std::string> origins) : origins_(std::move(origins)) {
  for (const std::string& o : origins_) {
    if (o == "*") any_ = true;
    else if (!is_origin(o)) throw Error("http.cors_origins: '" + o + "' is not \"*\" or an origin like https://host:port");
  }
}

bool Cors::allowed(const std::string& origin) const {
  return !origin.empty() && (any_ || std::find(origins_.begin(), origins_.end(), origin) != origins_.end());
}

void Cors::decorate(const HttpRequest& req, HttpResponse& r) const {
  const std::string origin = req.header("origin");
  if (!allowed(origin)) return;
  r.headers.emplace_back("Access-Control-Allow-Origin", any_ ? "*" : origin);
  if (!any_) r.headers.emplace_back("Vary", "Origin");
  r.headers.emplace_back("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
}

bool Cors::is_preflight(const HttpRequest& req) {
  return req.method == "OPTIONS" && !req.header("origin").empty() && !req.header("access-control-request-method").empty();
}

std::optional<HttpResponse> Cors::preflight(const HttpRequest& req) const {
  if (!allowed(req.header("origin"))) return std::nullopt;
  HttpResponse r;  // 200, empty: a 204 may carry no Content-Length, which every response here has
  r.content_type = "text/plain";
  decorate(req, r);
  r.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  r.headers.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id");
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  return r;
}

}  // namespace fathom
