#!/usr/bin/env bash
# Builds xgrammar's C++ core (grammar-constrained decoding: JSON Schema, JSON, EBNF, regex ->
# per-step token masks; the engine vLLM, SGLang and TensorRT-LLM use) from its PyPI source
# distribution into a cache outside the checkout, once: $FATHOM_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/fathom)/xgrammar-$VERSION/{src,build/libxgrammar.a}.
# The sdist's sha256 is checked against the one PyPI's simple index publishes. CMake finds the result through
# FATHOM_XGRAMMAR_DIR (same default). Idempotent: does nothing when the library is there.
set -euo pipefail
VERSION=0.2.8
cache=${FATHOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fathom}
dir="$cache/xgrammar-$VERSION"
[ -f "$dir/build/libxgrammar.a" ] && exit 0
echo "setup: building xgrammar $VERSION (C++ core, from its PyPI sdist) into $dir"
mkdir -p "$dir"
python3 - "$VERSION" "$dir" <<'PY'
import hashlib, re, sys, tarfile, urllib.parse, urllib.request, pathlib, shutil
version, out = sys.argv[1], pathlib.Path(sys.argv[2])
index = "https://pypi.org/simple/xgrammar/"
html = urllib.request.urlopen(index, timeout=60).read().decode()
name = f"xgrammar-{version}.tar.gz"
link = next(m for m in re.findall(r'href="([^"]+)"', html) if name in m)
url, _, digest = urllib.parse.urljoin(index, link.replace("&amp;", "&")).partition("#sha256=")
data = urllib.request.urlopen(url, timeout=120).read()
if not digest or hashlib.sha256(data).hexdigest() != digest:
    sys.exit("xgrammar sdist: sha256 mismatch")
tmp = out / "sdist.tar.gz"
tmp.write_bytes(data)
shutil.rmtree(out / "src", ignore_errors=True)
with tarfile.open(tmp) as t:
    t.extractall(out, filter="data")
(out / f"xgrammar-{version}").rename(out / "src")
tmp.unlink()
PY
mkdir -p "$dir/build"
# The sdist's cmake/config.cmake turns the Python bindings on; a config.cmake in the build
# directory is read first. -fno-lto: a plain static library any of our compilers can link.
printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\nset(XGRAMMAR_ENABLE_CPPTRACE OFF)\n' \
  > "$dir/build/config.cmake"
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-fno-lto" >/dev/null
cmake --build "$dir/build" -j"$(nproc)" --target xgrammar >/dev/null
echo "setup: xgrammar built: $dir/build/libxgrammar.a"
