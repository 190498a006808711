# Writes the playground's static files into one C++ source of byte arrays, so the page ships inside
# the binary (no files to install, nothing fetched at run time).
#   cmake -DOUT=<file.cpp> -DFILES="a;b;c" -P embed_assets.cmake
# Each file is served under its own name (server/playground.cpp maps URLs to names).
if(NOT OUT OR NOT FILES)
  message(FATAL_ERROR "embed_assets.cmake needs -DOUT=<file.cpp> and -DFILES=<list>")
endif()

set(arrays "")
set(table "")
set(index 0)
foreach(path IN LISTS FILES)
  get_filename_component(name "${path}" NAME)
  file(READ "${path}" hex HEX)
  string(LENGTH "${hex}" hex_length)
  math(EXPR size "${hex_length} / 2")
  # Two hex digits -> "0xNN,", 16 bytes a line (CMake's regexes have no {n}: the pattern is repeated).
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line)
  string(REGEX REPLACE "(${line})" "\\1\n    " bytes "${bytes}")
  string(APPEND arrays "// ${name}: ${size} bytes\nconstexpr unsigned char kFile${index}[] = {\n    ${bytes}0};\n")
  string(APPEND table "    {\"${name}\", kFile${index}, ${size}},\n")
  math(EXPR index "${index} + 1")
endforeach()

set(text "// Generated from server/playground/ by server/playground/embed_assets.cmake: do not edit.
#include \"server/playground_assets.h\"

namespace fathom {

namespace {

${arrays}
constexpr EmbeddedFile kFiles[] = {
${table}};

}  // namespace

std::span<const EmbeddedFile> playground_files() { return kFiles; }

}  // namespace fathom
")
# Rewritten only when the content changes, so an unchanged page recompiles nothing.
file(CONFIGURE OUTPUT "${OUT}" CONTENT "${text}" @ONLY)
