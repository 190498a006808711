#!/usr/bin/env bash
# Builds xgrammar's C++ core (grammar-constrained decoding: JSON Schema, JSON, EBNF, regex ->
# per-step token masks; the engine vLLM, SGLang and TensorRT-LLM use) from its PyPI source
# distribution into a cache outside the checkout, once: $FATHOM_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/fathom)/xgrammar-$VERSION/{src,build/libxgrammar.a}.
# The sdist's sha256 is checked against the one PyPI's simple index publishes (fetch_sdist.py). CMake finds the result through
# FATHOM_XGRAMMAR_DIR (same default). Idempotent: does nothing when the library is there.
set -euo pipefail
VERSION=0.2.8
cache=${FATHOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fathom}
dir="$cache/xgrammar-$VERSION"
[ -f "$dir/build/libxgrammar.a" ] && exit 0
echo "setup: building xgrammar $VERSION (C++ core, from its PyPI sdist) into $dir"
python3 "$(dirname "$0")/fetch_sdist.py" xgrammar "$VERSION" "$dir"
mkdir -p "$dir/build"
# The sdist's cmake/config.cmake turns the Python bindings on; a config.cmake in the build
# directory is read first. -fno-lto: a plain static library any of our compilers can link.
printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\nset(XGRAMMAR_ENABLE_CPPTRACE OFF)\n' \
  > "$dir/build/config.cmake"
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-fno-lto" >/dev/null
cmake --build "$dir/build" -j"$(nproc)" --target xgrammar >/dev/null
echo "setup: xgrammar built: $dir/build/libxgrammar.a"
