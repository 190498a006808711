"""fathom's tokenizer from a Hugging Face directory (tokenizer.json and companions, translated at
load by engine/model/hf_tokenizer.cpp) against the `tokenizers` package on the same file.

Directories:
  * the arch fixtures' own (tests/fixtures/arch/<name>-hf: a tiny byte-level vocabulary with
    Qwen 2's Split regex and NFC, or GPT-2's ByteLevel regex; an added special token);
  * real vocabularies written as tokenizer.json by `tokenizers` itself from llama.cpp's vocabulary
    files (Llama 3 with ignore_merges and its control tokens, Qwen 2 with NFC and its added tokens,
    GPT-2, StarCoder's digits): the ids of their 128k-150k tokens and 50k-280k merges, the
    pre-tokenizer recognised from the Split regex, added tokens as special or not;
  * a small BPE trained by `tokenizers` over GPT-4o's (tiktoken's o200k) Split, in gpt-oss's
    tokenizer.json shape, with and without `ignore_merges`, and the same vocabulary as a GGUF whose
    tokenizer.ggml.pre is "gpt-4o".
The corpus: test_tokenizer.py's (unicode scripts, emoji, digits, whitespace runs, code, special
token text), llama.cpp's test lines of each vocabulary, and text NFC changes (decomposed accents,
Hangul jamo, combining marks out of canonical order, singletons such as the Angstrom sign) for the
NFC normalizer Qwen's tokenizer.json has; and random strings of such characters.
"""
import random
import json
import os
import subprocess
import unicodedata
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from test_tokenizer import CORPUS, O200K_POOL, O200K_REGEX, PRE_TOKENIZER_CORPUS, read_gguf_metadata

ROOT = Path(__file__).resolve().parents[2]
TOKENIZE = ROOT / os.environ.get("FATHOM_BUILD", "build") / "tokenize"
ARCH = ROOT / "tests" / "fixtures" / "arch"
CACHE = Path(os.environ.get("FATHOM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fathom")
VOCABS = CACHE / "llama-cpp-python-0.3.36" / "src" / "vendor" / "llama.cpp" / "models"

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

NFC_LINES = [
    "e\u0301 (decomposed) vs \u00e9 (precomposed); A\u030a \u212b \u2126",
    "Cu\u031b\u0309a Vie\u0323\u0302t, Nguye\u0302\u0303n, Ho\u0300 Chi\u0301 Minh",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u116e\u11a8\u110b\u1165 \uac00\u11a8",
    "a\u0301\u0327 a\u0327\u0301 q\u0307\u0323 \u0f73 \u0344 \u304b\u3099",
    "Zu\u0308rich, Mu\u0308nchen, Sa\u0303o Paulo, Bogota\u0301, \u00c5ngstro\u0308m",
]
SPECIAL_LINES = [
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>system\nYou are<|im_end|>\n<|endoftext|>x<|im_end|",
    "<|endoftext|><|endoftext|> <fim_prefix>a<fim_suffix>b<fim_middle>",
    "text<|end|>more<|end|><|end|",
]


def pre_tokenizer(kind):
    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    regex = {"llama3": LLAMA3, "qwen2": QWEN2}[kind]
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# llama.cpp vocabulary -> (pre-tokenizer, ignore_merges, NFC) as the published tokenizer.json has them.
VOCAB_FAMILIES = {
    "llama-bpe": ("llama3", True, False),
    "qwen2": ("qwen2", False, True),
    "gpt-2": ("gpt2", False, False),
    "starcoder": ("digits", False, False),
}


def write_vocab_dir(name, out):
    """tokenizer.json (by `tokenizers`) and tokenizer_config.json from llama.cpp's vocabulary file."""
    kind, ignore_merges, nfc = VOCAB_FAMILIES[name]
    meta = read_gguf_metadata(VOCABS / f"ggml-vocab-{name}.gguf")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    added = [(i, t) for i, t in enumerate(tokens) if types[i] in (3, 4)]
    # An added token already in the model's vocabulary keeps its id there (as published files have it).
    for i, t in added:
        got = tok.add_tokens([AddedToken(t, special=types[i] == 3, normalized=False)])
        assert got == 1 and tok.token_to_id(t) == i, (name, i, t)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]], eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
        add_bos_token=False)))
    lines = (VOCABS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    return tok, nfc, [l for l in lines if l]


def fathom_ids(path, texts, *flags):
    r = subprocess.run([str(TOKENIZE), str(path), "--batch", "--no-bos", *flags], input=json.dumps(texts),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def reference_ids(tok, texts, parse_special=True):
    tok.encode_special_tokens = not parse_special
    try:
        return [tok.encode(t, add_special_tokens=False).ids for t in texts]
    finally:
        tok.encode_special_tokens = False


def compare(path, tok, texts, parse_special=True):
    got = fathom_ids(path, texts, *([] if parse_special else ["--no-special"]))
    want = reference_ids(tok, texts, parse_special)
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{path.name}: {len(bad)} of {len(texts)} lines differ, first: {bad[0]!r}"
    return len(texts)


@pytest.fixture(scope="module", params=list(VOCAB_FAMILIES))
def vocab_dir(request, tmp_path_factory):
    assert TOKENIZE.exists(), f"{TOKENIZE} is not built (set FATHOM_BUILD)"
    if not (VOCABS / f"ggml-vocab-{request.param}.gguf").is_file():
        pytest.fail(f"{VOCABS} lacks ggml-vocab-{request.param}.gguf: run scripts/setup.sh", pytrace=False)
    out = tmp_path_factory.mktemp(request.param)
    tok, nfc, lines = write_vocab_dir(request.param, out)  # nfc: the normalizer is NFC
    return out, tok, nfc, lines


@pytest.mark.parametrize("parse_special", [True, False])
def test_real_vocabulary_matches_tokenizers(vocab_dir, parse_special):
    path, tok, nfc, lines = vocab_dir
    n = compare(path, tok, CORPUS + NFC_LINES + SPECIAL_LINES + lines, parse_special)
    assert n >= 70


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "phi3", "phi3-longrope"])
def test_fixture_directory_matches_tokenizers(name):
    path = ARCH / f"{name}-hf"
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    for parse_special in (True, False):
        compare(path, tok, CORPUS + NFC_LINES + SPECIAL_LINES, parse_special)


# DeepSeek's Split sequences as their published tokenizer.json files write them (CR and LF as the
# characters): V3's (DeepSeek V3/R1) and Coder's.
DEEPSEEK_SPLITS = {
    "deepseek-v3": [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"],
}


@pytest.mark.parametrize("name", list(DEEPSEEK_SPLITS))
def test_deepseek_split_sequences_match_tokenizers(name, tmp_path):
    """A tokenizer.json whose pre-tokenizer is DeepSeek's Split sequence is read as llama.cpp's
    deepseek-v3 / deepseek-coder pre-tokenizer and splits as `tokenizers` does."""
    src = ARCH / "qwen2-hf"
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in DEEPSEEK_SPLITS[name]] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_bytes((src / "tokenizer_config.json").read_bytes())
    compare(tmp_path, tok, CORPUS + NFC_LINES + SPECIAL_LINES + [
        "1234567 12 ab3c 漢字かなカナ 한국어 x'Yz \"q\" a.b-c_d\r\n\r\n  x\ty", "ǅ ﬁ a\u0301b \u3000。"])
    # One regex off (the CJK class of DeepSeek LLM's): refused, quoting the regexes.
    j = json.loads((tmp_path / "tokenizer.json").read_text())
    j["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "[\u4e00-\u9fa5]+"
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    r = subprocess.run([str(TOKENIZE), str(tmp_path), "--info"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Split regexes" in r.stderr and "not a sequence fathom implements" in r.stderr, r.stderr


def test_nfc_matches_tokenizers_on_random_text(tmp_path):
    """Strings of combining marks, composites, Hangul jamo and syllables, singletons: every one that
    NFC changes, through the NFC vocabulary (Qwen 2's), tokenizes as `tokenizers` does."""
    assert TOKENIZE.exists(), f"{TOKENIZE} is not built (set FATHOM_BUILD)"
    tok, nfc, _ = write_vocab_dir("qwen2", tmp_path)
    assert nfc
    path = tmp_path
    rng = random.Random(48)
    pool = ([chr(c) for c in range(0x300, 0x370)] * 4 + [chr(c) for c in range(0x1100, 0x1200)] +
            [chr(c) for c in range(0xAC00, 0xAC80)] + [chr(c) for c in range(0x1E00, 0x1F00)] +
            [chr(c) for c in range(0x41, 0x7B)] + list("\u212b\u2126\u0f73\u0344\u3099\u304b\u0dd9\u0dca\u0dcf \n"))
    texts = [s for s in ("".join(rng.choice(pool) for _ in range(rng.randint(1, 16))) for _ in range(3000))
             if unicodedata.normalize("NFC", s) != s]
    assert len(texts) > 1000
    compare(path, tok, texts)


def info(path):
    r = subprocess.run([str(TOKENIZE), str(path), "--info"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_eos_of_generation_config_ends_generation(tmp_path):
    """generation_config.json's eos_token_id list (Llama 3.1: end_of_text, eom, eot): all of them stop."""
    src = ARCH / "qwen2-hf"
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (tmp_path / f).write_bytes((src / f).read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [127, 5, 9]}))
    got = info(tmp_path)
    assert got["eos_id"] == 127
    assert {127, 5, 9} <= set(got["end_of_generation_ids"])


def refused(tmp_path, edit):
    src = ARCH / "qwen2-hf"
    tok = json.loads((src / "tokenizer.json").read_text())
    edit(tok)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    r = subprocess.run([str(TOKENIZE), str(tmp_path), "--info"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    return r.stderr


def test_an_unknown_split_regex_is_refused_by_name(tmp_path):
    def edit(tok):
        tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}+|[^\p{L}\p{N}]+"
    err = refused(tmp_path, edit)
    assert "Split regex" in err and r"\p{L}+|\p{N}+" in err, err


def test_what_fathom_does_not_implement_is_refused(tmp_path):
    cases = {
        "byte_fallback": lambda t: t["model"].update(byte_fallback=True),
        "lstrip": lambda t: t["added_tokens"][0].update(lstrip=True),
        "normalizer": lambda t: t.update(normalizer={"type": "NFKC"}),
        "add_prefix_space": lambda t: t["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
        "ignore_merges": lambda t: t["model"].update(ignore_merges=True),
        "Unigram": lambda t: t["model"].update(type="Unigram"),
    }
    for word, edit in cases.items():
        assert word in refused(tmp_path, edit), word


# gpt-oss's tokenizer.json as transformers' TikTokenConverter writes it: tiktoken's o200k regex as a
# Split (Isolated), ByteLevel without its regex, ignore_merges, a ByteLevel post-processor.
O200K_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|message|>"]
# Whole words the vocabulary gets as tokens that no merge makes: only ignore_merges reaches them.
O200K_WORDS = [" NASA's", "HTTPServer", " DON'T", "/file", " Ωmega"]


def o200k_pre_tokenizer():
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K_REGEX), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def o200k_corpus():
    rng = random.Random(4)
    texts = ["".join(rng.choice(O200K_POOL) for _ in range(rng.randint(1, 40))) for _ in range(2000)]
    return PRE_TOKENIZER_CORPUS + texts + [
        "".join(O200K_WORDS), "x" + "/".join(O200K_WORDS) + "'S", " NASA's GPT-OSS /path/to/file abc/\nfooBAR 123",
        "<|start|>user<|message|>What's up?<|end|><|start|>assistant<|message|>Fine.<|return|>",
        "<|startoftext|><|endoftext|>x<|return|", "Don'ſt I'M you'LL HE'D they'Re"]


def o200k_tokenizer(ignore_merges):
    """A byte-level BPE trained by `tokenizers` over the o200k split (so its merges follow o200k's
    words), plus O200K_WORDS as tokens without merges, and gpt-oss-like special tokens."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = o200k_pre_tokenizer()
    trained.train_from_iterator(PRE_TOKENIZER_CORPUS * 2, trainer=trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for w in O200K_WORDS:
        vocab.setdefault(spell.pre_tokenize_str(w)[0][0], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]], ignore_merges=ignore_merges))
    tok.pre_tokenizer = o200k_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in O200K_SPECIALS])
    return tok


@pytest.mark.parametrize("ignore_merges", [True, False])
def test_o200k_tokenizer_json_matches_tokenizers(ignore_merges, tmp_path):
    """A tokenizer.json with GPT-4o's / gpt-oss's Split regex is read as tokenizer.ggml.pre "gpt-4o",
    its ignore_merges kept, and tokenizes as `tokenizers` does."""
    assert TOKENIZE.exists(), f"{TOKENIZE} is not built (set FATHOM_BUILD)"
    tok = o200k_tokenizer(ignore_merges)
    j = json.loads(tok.to_str())
    assert j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == O200K_REGEX
    assert j["model"]["ignore_merges"] is ignore_merges
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(
        bos_token="<|startoftext|>", eos_token="<|return|>", add_bos_token=False)))
    texts = o200k_corpus()
    for parse_special in (True, False):
        compare(tmp_path, tok, texts, parse_special)
    # ignore_merges decides these words: the test sees it if fathom drops or invents it.
    other = o200k_tokenizer(not ignore_merges)
    assert reference_ids(tok, O200K_WORDS) != reference_ids(other, O200K_WORDS)


def test_o200k_gguf_matches_tokenizers(tmp_path):
    """The same vocabulary as a GGUF with tokenizer.ggml.pre = "gpt-4o" (gpt-oss's, llama.cpp's
    name: without ignore_merges, as llama.cpp reads it) loads and tokenizes as `tokenizers` does."""
    import gguf

    assert TOKENIZE.exists(), f"{TOKENIZE} is not built (set FATHOM_BUILD)"
    tok = o200k_tokenizer(ignore_merges=False)
    j = json.loads(tok.to_str())
    by_id = {i: t for t, i in j["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in j["added_tokens"]})
    assert sorted(by_id) == list(range(len(by_id)))
    special = {a["id"] for a in j["added_tokens"]}
    path = tmp_path / "o200k.gguf"
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list([by_id[i] for i in range(len(by_id))])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(by_id))])
    w.add_token_merges([" ".join(m) for m in j["model"]["merges"]])
    w.add_bos_token_id(tok.token_to_id("<|startoftext|>"))
    w.add_eos_token_id(tok.token_to_id("<|return|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    texts = o200k_corpus()
    for parse_special in (True, False):
        compare(path, tok, texts, parse_special)
