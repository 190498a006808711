#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer + ASan + UBSan for SECONDS (default 30).
# Builds build-fuzz/fuzz_gguf with clang++ (Debian: clang, libclang-rt-14-dev), writes a seed
# corpus of small valid GGUF files (tests/fuzz/make_corpus.py) plus the first 64 KiB of the
# default models, and exits non-zero when the fuzzer finds a crash, leak, hang or UB.
# Findings are saved as build-fuzz/crash-* etc.; replay one with: build-fuzz/fuzz_gguf FILE
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
out=build-fuzz
cxx=${FUZZ_CXX:-clang++}
sources=(tests/fuzz/fuzz_gguf.cpp engine/model/gguf.cpp engine/model/gguf_values.cpp
  base/error.cpp kernels/ggml_type.cpp)
mkdir -p "$out/corpus" "$out/seeds"

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (install clang and libclang-rt-14-dev: scripts/setup.sh)" >&2
  exit 1
fi

# Rebuild only when a source or header changed; the build takes a few seconds.
if [ ! -x "$out/fuzz_gguf" ] ||
  [ -n "$(find "${sources[@]}" engine/model/gguf.h base/error.h kernels/ggml_type.h \
    scripts/fuzz.sh -newer "$out/fuzz_gguf" 2>/dev/null)" ]; then
  echo "fuzz: building $out/fuzz_gguf"
  "$cxx" -std=c++20 -I. -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Werror \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "${sources[@]}" -o "$out/fuzz_gguf"
fi

# Seeds are regenerated every run (cheap); the corpus directory keeps what the fuzzer
# learned between runs.
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import gguf' 2>/dev/null; then
  .venv/bin/python tests/fuzz/make_corpus.py "$out/seeds" models/*.gguf
else
  echo "fuzz: .venv with the gguf package missing (run scripts/setup.sh); fuzzing without seeds" >&2
fi

echo "fuzz: running for ${seconds}s"
# -timeout: one input taking over 10 s is a hang; -rss_limit_mb: 2 GiB is far above what a
# 64 KiB input may legitimately need. libFuzzer exits non-zero on any finding.
"$out/fuzz_gguf" "$out/corpus" "$out/seeds" \
  -dict=tests/fuzz/gguf.dict -max_total_time="$seconds" -max_len=65536 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/" \
  2> "$out/fuzz.log" || {
  status=$?
  tail -n 60 "$out/fuzz.log" >&2
  echo "fuzz: FAILED (exit $status); the input is saved as $out/crash-*/leak-*/timeout-*; full log: $out/fuzz.log" >&2
  exit "$status"
}
grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' "$out/fuzz.log" || true
echo "fuzz: OK, no findings in ${seconds}s"
