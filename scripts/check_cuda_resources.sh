#!/usr/bin/env bash
# Compiles each CUDA source with `--resource-usage` for every architecture and fails if any
# kernel spills registers or uses local memory (spill stores/loads, a stack frame, or lmem).
# Prints one line per kernel and architecture: registers, shared memory, spills.
#   usage: check_cuda_resources.sh <nvcc> <archs "80;90"> <include dir> <file.cu>...
set -euo pipefail
nvcc=$1 archs=$2 include=$3
shift 3
status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for src in "$@"; do
  for arch in ${archs//;/ }; do
    arch=${arch%-real}; arch=${arch%-virtual}
    if ! [[ $arch =~ ^[0-9]+[a-z]?$ ]]; then
      echo "check_cuda_resources: skipping architecture '$arch' (give numeric ones, e.g. 80;90)" >&2
      continue
    fi
    log="$tmp/$(basename "$src").sm_$arch.log"
    if ! "$nvcc" -std=c++17 -O3 -I"$include" -arch="sm_$arch" --resource-usage -c "$src" -o "$tmp/out.o" >"$log" 2>&1; then
      cat "$log" >&2
      echo "check_cuda_resources: $src does not compile for sm_$arch" >&2
      exit 1
    fi
    # ptxas prints per entry: "Compiling entry function 'X' for 'sm_NN'", then
    # "N bytes stack frame, N bytes spill stores, N bytes spill loads", then
    # "Used N registers, ..., N bytes smem, ..." (an "N bytes lmem" field appears when used).
    if ! awk -v src="$(basename "$src")" -v arch="sm_$arch" '
      /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2); next }
      /bytes stack frame/ {
        stack = $1; stores = $5; loads = $9
        next
      }
      /Used [0-9]+ registers/ {
        regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
        smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
        lmem = 0; if (match($0, /[0-9]+ bytes lmem/)) lmem = substr($0, RSTART, RLENGTH - 11)
        printf "%-28s %-6s regs %3d  smem %6d B  stack %d  spill st/ld %d/%d  lmem %d  %s\n", src, arch, regs, smem, stack, stores, loads, lmem, name
        if (stack + stores + loads + lmem > 0) { printf "  ^ FAIL: spills or local memory\n"; bad = 1 }
        stack = stores = loads = 0
      }
      END { exit bad }' "$log"; then
      status=1
    fi
  done
done
if [ $status -ne 0 ]; then
  echo "check_cuda_resources: register spills or local memory use (see FAIL lines)" >&2
fi
exit $status
