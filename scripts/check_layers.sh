#!/usr/bin/env bash
# Layers point one way: base <- kernels <- engine <- server (docs/architecture.md). Fails, naming
# the offending lines, when a file includes a header from a layer above its own. Run by ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
check() {  # check DIR PATTERN WHY
  local hits
  hits=$(grep -rnE "#include \"($2)/" "$1" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.inc' || true)
  if [ -n "$hits" ]; then
    echo "layering: $1 must not include $2 ($3):"
    echo "$hits"
    status=1
  fi
}
check base 'kernels|engine|server' "base is the bottom layer"
check kernels 'engine|server' "kernels depend on base only"
check engine 'server' "the engine knows no protocol"
check kernels/ref 'kernels/cpu|kernels/cuda' "the references are the specification: they use no kernel"
check kernels/cuda 'kernels/cpu' "the CUDA kernels share only kernels/*.h with the CPU's"
[ $status -eq 0 ] && echo "layering: ok"
exit $status
