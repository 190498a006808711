#pragma once
// The web playground: a page at `/` (http.playground, on by default) for chatting with the model and
// watching /metrics, made of static files compiled into the binary (server/playground/, embedded by
// server/playground/embed_assets.cmake). `/` is index.html; the other files are /playground/<name>.
//
// The files are public (no API key needed to load them: they are the same bytes in every build and
// hold no data); everything the page does goes through the API with the key the user types, so with
// http.api_keys set the page is usable only with a key. Every response carries a Content-Security-
// Policy that allows scripts, styles and connections to this origin only (no inline script, no
// framing), nosniff and no-referrer, and `Cache-Control: no-cache`, so that an upgraded binary never
// meets a stale page.
#include <string_view>

#include "server/http_transport.h"

namespace fathom {

// True when GET `path` names a playground file ("/", "/playground/app.js", ...).
bool is_playground_path(std::string_view path);

// The file's 200 response; is_playground_path(path) must hold.
HttpResponse playground_response(std::string_view path);

}  // namespace fathom
