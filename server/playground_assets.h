#pragma once
// The playground's static files (server/playground/*.html, .js, .css, .svg) as compiled into the
// binary by server/playground/embed_assets.cmake.
#include <cstddef>
#include <span>

namespace fathom {

struct EmbeddedFile {
  const char* name;           // file name, e.g. "app.js"
  const unsigned char* data;  // `size` bytes (a trailing 0 beyond them, not part of the file)
  size_t size;
};

std::span<const EmbeddedFile> playground_files();

}  // namespace fathom
