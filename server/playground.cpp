#include "server/playground.h"

#include "base/error.h"
#include "server/playground_assets.h"

namespace fathom {

namespace {

constexpr std::string_view kIndex = "index.html";
constexpr std::string_view kPrefix = "/playground/";

// What the page may load: its own scripts, styles and images, and fetch() to its own origin (the
// API and /metrics). No inline script or style element, no eval, no plugins, no framing, no forms.
constexpr const char* kCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

std::string_view content_type(std::string_view name) {
  auto ends = [&](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

// The file served at `path`: index.html at "/", any other file at /playground/<name>.
const EmbeddedFile* find_file(std::string_view path) {
  std::string_view name;
  if (path == "/") name = kIndex;
  else if (path.size() > kPrefix.size() && path.substr(0, kPrefix.size()) == kPrefix)
    name = path.substr(kPrefix.size());
  else return nullptr;
  if (path != "/" && name == kIndex) return nullptr;  // one address per file
  for (const EmbeddedFile& f : playground_files())
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

bool is_playground_path(std::string_view path) { return find_file(path) != nullptr; }

HttpResponse playground_response(std::string_view path) {
  const EmbeddedFile* f = find_file(path);
  FATHOM_CHECK(f != nullptr);
  HttpResponse r;
  r.content_type = std::string(content_type(f->name));
  r.body.assign(reinterpret_cast<const char*>(f->data), f->size);
  r.headers = {{"Cache-Control", "no-cache"},
               {"Content-Security-Policy", kCsp},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"},
               {"X-Frame-Options", "DENY"}};
  return r;
}

}  // namespace fathom
