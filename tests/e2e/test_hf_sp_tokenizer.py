"""SentencePiece-style tokenizer.json (BPE with byte_fallback, spaces as U+2581: Llama 2, Mistral,
Gemma) loaded by fathom (engine/model/hf_sentencepiece.cpp -> libsentencepiece) against the
`tokenizers` package on the same file: ids with and without special-token parsing and BOS, and the
decoded text.

Vocabularies:
  * tests/fixtures/sp_tokenizers/{llama2-legacy,mistral,gemma}: small BPEs trained by sentencepiece
    and converted by transformers' LlamaTokenizer / GemmaTokenizer (scripts/sp_tokenizer_fixtures.py),
    in the shapes the published files have (Prepend+Replace normalizer; Metaspace "first";
    Replace + Split(" ")), and edited variants of them (Metaspace "always", no pre-tokenizer);
  * Llama 2's real 32k vocabulary (llama.cpp's ggml-vocab-llama-spm.gguf),
    written as tokenizer.json the way transformers converts a tokenizer.model (every split of a
    piece into two pieces a merge, ranked by the piece's id), checked against `tokenizers` and
    against llama.cpp's expected ids of its test lines.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from test_tokenizer import CORPUS, read_gguf_metadata

ROOT = Path(__file__).resolve().parents[2]
TOKENIZE = ROOT / os.environ.get("FATHOM_BUILD", "build") / "tokenize"
FIXTURES = ROOT / "tests" / "fixtures" / "sp_tokenizers"
CACHE = Path(os.environ.get("FATHOM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fathom")
VOCABS = CACHE / "llama-cpp-python-0.3.36" / "src" / "vendor" / "llama.cpp" / "models"

# Where SentencePiece-style tokenizers differ: spaces at the start, runs of them, a literal "▁",
# text right after a special token, characters no token holds (byte fallback), unknown scripts.
SP_LINES = [
    " Hello", "  Hello  world", "Hello\n\n\nworld", "\u2581Hello \u2581\u2581 x\u2581", "\u2581", " ", "  ", "\t \n",
    "<s>Hello</s> world<s> ", "[INST] What is 2+2? [/INST] 4</s>[INST]x[/INST]",
    "<bos><start_of_turn>user\n  hi<end_of_turn>\n<start_of_turn>model\n", "a<table><td>b</td>\n\n\nc▁▁d",
    "ꙮ𓀀𝔘 ɐ ʎ ☃ \U0001F9D1\u200D\U0001F680", "1234567890 3.14159 -42 1e10", "é e\u0301 ß ǅ ﬁ",
    "<unk><pad><mask><eos>", "x<s", "</s", "[INST", "Grüße aus Köln, ça va?",
]
TEXTS = CORPUS + SP_LINES


def fathom(path, payload, *flags):
    r = subprocess.run([str(TOKENIZE), str(path), *flags], input=json.dumps(payload), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def check(path, tok, texts):
    """fathom's ids equal tokenizers' with special tokens parsed or not, with BOS or not; decoding
    them equals tokenizers' decode (special tokens skipped)."""
    assert TOKENIZE.exists(), f"{TOKENIZE} is not built (set FATHOM_BUILD)"
    for flags, add_special, parse_special in (([], True, True), (["--no-bos"], False, True),
                                              (["--no-bos", "--no-special"], False, False)):
        got = fathom(path, texts, "--batch", *flags)["ids"]
        tok.encode_special_tokens = not parse_special
        try:
            want = [tok.encode(t, add_special_tokens=add_special).ids for t in texts]
        finally:
            tok.encode_special_tokens = False
        bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
        assert not bad, f"{path.name} {flags}: {len(bad)} of {len(texts)} lines differ, first: {bad[0]!r}"
    decoded = fathom(path, want, "--decode")["text"]
    want_text = [tok.decode(ids, skip_special_tokens=True) for ids in want]
    bad = [(t, g, w) for t, g, w in zip(texts, decoded, want_text) if g != w]
    assert not bad, f"{path.name}: {len(bad)} decodes differ, first: {bad[0]!r}"
    return len(texts)


def variant(tmp_path, name, edit):
    src = FIXTURES / name
    j = json.loads((src / "tokenizer.json").read_text())
    edit(j)
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    (tmp_path / "tokenizer_config.json").write_bytes((src / "tokenizer_config.json").read_bytes())
    return tmp_path


@pytest.mark.parametrize("name", ["llama2-legacy", "mistral", "gemma"])
def test_fixture_matches_tokenizers(name):
    path = FIXTURES / name
    assert check(path, Tokenizer.from_file(str(path / "tokenizer.json")), TEXTS) > 60


def test_metaspace_always_and_gemma_without_split(tmp_path):
    def always(j):  # a prefix on every run of text between added tokens that lacks a space
        j["pre_tokenizer"]["prepend_scheme"] = "always"

    def no_split(j):  # Gemma 1/2's published form
        j["pre_tokenizer"] = None
    for name, edit in (("mistral", always), ("gemma", no_split)):
        (tmp_path / name).mkdir()
        path = variant(tmp_path / name, name, edit)
        check(path, Tokenizer.from_file(str(path / "tokenizer.json")), TEXTS)


def info(path):
    return fathom(path, None, "--info")


def test_bos_eos_and_end_of_generation():
    llama = info(FIXTURES / "llama2-legacy")
    assert (llama["bos_id"], llama["eos_id"], llama["add_bos"]) == (1, 2, True)
    gemma = info(FIXTURES / "gemma")
    assert (gemma["bos_id"], gemma["eos_id"]) == (2, 1)
    assert 6 in gemma["end_of_generation_ids"]  # <end_of_turn>


def refusal(tmp_path, edit):
    path = variant(tmp_path, "llama2-legacy", edit)
    r = subprocess.run([str(TOKENIZE), str(path), "--info"], capture_output=True, text=True, timeout=60)
    return r.stderr if r.returncode != 0 else "loaded"


def test_what_is_not_implemented_exactly_is_refused_by_name(tmp_path):
    def drop_merge(j):  # libsentencepiece would still merge the pair
        j["model"]["merges"].pop(5)

    def interleave(j):  # two merges making one token, another between them
        m = j["model"]["merges"]
        makes = {}
        for i, (a, b) in enumerate(m):
            makes.setdefault(a + b, []).append(i)
        first = next(v for v in makes.values() if len(v) > 1 and v[0] > 0)
        m.insert(first[0], m.pop(first[0] - 1))  # the merge before the group, now inside it

    cases = {
        "merges lacks that pair": drop_merge,
        "not consecutive": interleave,
        "Metaspace split = true": lambda j: j.update(normalizer=None, pre_tokenizer={
            "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}),
        "normalizer step {\"type\":\"NFKC\"}": lambda j: j["normalizer"]["normalizers"].__setitem__(1, {"type": "NFKC"}),
        "decoder": lambda j: j["decoder"]["decoders"].pop(),
        "normalized = true": lambda j: j["added_tokens"][1].update(normalized=True),
        "ignore_merges": lambda j: j["model"].update(ignore_merges=True),
        "byte tokens": lambda j: j["model"]["vocab"].pop("<0x41>"),
        "Unigram": lambda j: j["model"].update(type="Unigram"),
    }
    for word, edit in cases.items():
        err = refusal(tmp_path, edit)
        assert word in err, (word, err)


def llama_cpp_vocab_dir(name, out):
    """tokenizer.json of llama.cpp's SentencePiece vocabulary file as transformers 4.x converted a
    tokenizer.model (SentencePieceExtractor with the piece scores, as Llama 2's published file was
    made): every split of a piece into two pieces a merge, the pieces' merges by their ids, ranked
    by the piece's score (Llama 2's whitespace pieces, scored -1e9, last); control and user-defined
    pieces added tokens; Llama 2's legacy normalizer and decoder, BOS by the post-processor."""
    meta = read_gguf_metadata(VOCABS / f"ggml-vocab-{name}.gguf")
    tokens, types, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.scores"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, pid in vocab.items():
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(scores[pid], l, r) for l, r in sorted(splits, key=lambda s: (vocab[s[0]], vocab[s[1]]))]
    merges = [(l, r) for score, l, r in sorted(merges, key=lambda m: m[0], reverse=True) if score]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    tok.add_tokens([AddedToken(t, special=types[i] in (2, 3), normalized=False)
                    for i, t in enumerate(tokens) if types[i] in (2, 3, 4)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        bos_token=bos, eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]], add_bos_token=True)))
    return tok


@pytest.mark.parametrize("name", ["llama-spm"])
def test_real_vocabulary_matches_tokenizers_and_llama_cpp(name, tmp_path):
    if not (VOCABS / f"ggml-vocab-{name}.gguf").is_file():
        pytest.fail(f"{VOCABS} lacks ggml-vocab-{name}.gguf: run scripts/setup.sh", pytrace=False)
    tok = llama_cpp_vocab_dir(name, tmp_path)
    inp = VOCABS / f"ggml-vocab-{name}.gguf.inp"
    want = [[int(t) for t in l.split()] for l in inp.with_suffix(".out").read_text(encoding="utf-8").split("\n")]
    lines = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:len(want)]
    got = fathom(tmp_path, lines, "--batch", "--no-bos")["ids"]
    bad = [(t, g, w) for t, g, w in zip(lines, got, want) if g != w]
    assert not bad, f"{name}: {len(bad)} of {len(lines)} of llama.cpp's lines differ, first: {bad[0]!r}"
    assert check(tmp_path, tok, TEXTS + lines) > 100
