"""fathom's tokenizers against llama.cpp's tokenizer test vectors.

llama.cpp ships, for each vocabulary family it supports, a GGUF of the vocabulary alone
(models/ggml-vocab-NAME.gguf) with test inputs (.inp, separated by "__ggml_vocab_test__" lines) and
the ids the family's own Hugging Face tokenizer gives them (.out, one line of ids per input,
without BOS). scripts/setup.sh takes them from the llama-cpp-python sdist on PyPI into the cache.

Every family whose pre-tokenizer fathom implements must tokenize every line as the reference does:
Llama 3's BPE with `ignore_merges` (a word that is itself a token stays one: 'Cửa Việt'), GPT-2,
Qwen 2, Qwen 3.5, StarCoder, Refact, Command-R, MPT, DeepSeek LLM, DeepSeek Coder and Falcon BPE, and
Llama's and Phi-3's SentencePiece. A pre-tokenizer fathom does not implement is refused with an error
naming it, never tokenized some other way.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENIZE = ROOT / os.environ.get("FATHOM_BUILD", "build") / "tokenize"
CACHE = Path(os.environ.get("FATHOM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fathom")
VOCABS = CACHE / "llama-cpp-python-0.3.36" / "src" / "vendor" / "llama.cpp" / "models"

SUPPORTED = ["llama-bpe", "gpt-2", "qwen2", "starcoder", "refact", "command-r", "mpt", "deepseek-llm",
             "deepseek-coder", "falcon", "llama-spm", "phi-3", "qwen35"]


def vocab(name):
    path = VOCABS / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh", pytrace=False)
    return path


def tokenize(path, texts):
    return subprocess.run([str(TOKENIZE), str(path), "--batch", "--no-bos"], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_line_tokenizes_as_the_reference(name):
    path = vocab(name)
    texts = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    want = [[int(t) for t in line.split()]
            for line in path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")]
    texts = texts[:len(want)]  # the .inp ends with a separator the .out has no line for
    assert len(texts) == len(want) >= 40
    r = tokenize(path, texts)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["ids"]
    bad = [(texts[i], got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    assert not bad, f"{name}: {len(bad)} of {len(want)} lines differ, first: {bad[0]!r}"


@pytest.mark.parametrize("pre", ["chatglm-bpe", "viking", "tekken"])
def test_an_unimplemented_pre_tokenizer_is_refused_by_name(pre):
    r = subprocess.run([str(TOKENIZE), "--pretokenize", pre], input=json.dumps(["hello"]), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert f"unsupported BPE pre-tokenizer '{pre}'" in r.stderr, r.stderr
