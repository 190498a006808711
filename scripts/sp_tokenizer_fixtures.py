"""SentencePiece-style tokenizer.json fixtures (tests/fixtures/sp_tokenizers/<name>/), as Llama 2,
Mistral and Gemma publish them: a small BPE with byte fallback trained by `sentencepiece` on the text
below, converted by transformers' LlamaTokenizer / GemmaTokenizer from its tokenizer.model, then
given the normalizer / pre-tokenizer / post-processor the published files carry.

  llama2-legacy  Llama 2, TinyLlama, Mistral v0.1: Prepend("▁") + Replace(" ", "▁") normalizer,
                 no pre-tokenizer, BOS by the post-processor (transformers 4.x's legacy form).
  mistral        Mistral v0.3: Metaspace(prepend_scheme "first", split false), control tokens
                 [INST] [/INST] among the first ids (as transformers >= 5 converts Llama too).
  gemma          Gemma 2/3: Replace(" ", "▁"), Split(" ") after it, no dummy prefix, user-defined
                 pieces (runs of "▁", "\\n\\n", "<table>") and <start_of_turn>/<end_of_turn>.

Run once in an environment with sentencepiece, transformers (>= 5) and tokenizers:
    python scripts/sp_tokenizer_fixtures.py
Only tokenizer.json and tokenizer_config.json are written (tens of KB each); `make test` reads them
with the `tokenizers` package (tests/e2e/test_hf_sp_tokenizer.py).
"""
import json
import shutil
import tempfile
from pathlib import Path

import sentencepiece as spm
from tokenizers import Tokenizer, normalizers, processors
from transformers import GemmaTokenizer, LlamaTokenizer

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sp_tokenizers"

# English prose, code and a few other scripts: merges of letters, digits, spaces, "▁" runs.
TEXT = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light.
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse,
and nothing particular to interest me on shore, I thought I would sail about a little and see the
watery part of the world. In the beginning was the Word, and the Word was with God.
def tokenize(text, vocab):
    for word in text.split():
        if word in vocab:
            yield vocab[word]
        else:
            yield from (vocab.get(c, 0) for c in word)
int main(void) { printf("%d\\n", 42); return 0; }
The year 2024 had 366 days; 3.14159 is pi and 2.71828 is e. Call 555-0100 before 10:30.
Café, naïve, résumé, façade, jalapeño, Straße, Ærøskøbing, Zürich, München, São Paulo.
Привет, мир! Как дела? Съешь же ещё этих мягких французских булок, да выпей чаю.
日本語のテキストと漢字、ひらがな、カタカナ。中文测试：你好，世界！这是一个句子。
한국어 문장입니다. 안녕하세요! Ελληνικά γράμματα. مرحبا بالعالم.
"""


def train(prefix, **kw):
    lines = [l for l in TEXT.split("\n") if l.strip()] * 8
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(lines), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(prefix), model_type="bpe", vocab_size=kw.pop("vocab_size", 1000),
            byte_fallback=True, character_coverage=0.9995, split_digits=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, minloglevel=2, **kw)


def convert(cls, model_file, work):
    src, out = work / f"src-{model_file.stem}", work / f"out-{model_file.stem}"
    src.mkdir()
    shutil.copy(model_file, src / "tokenizer.model")
    cls.from_pretrained(str(src)).save_pretrained(str(out))
    return Tokenizer.from_file(str(out / "tokenizer.json"))


def write(name, tok, config):
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(name, (out / "tokenizer.json").stat().st_size, "bytes,", tok.get_vocab_size(), "tokens")


def main():
    work = Path(tempfile.mkdtemp())
    # Llama 2's trainer settings: <unk> <s> </s> at 0-2, a dummy prefix.
    train(work / "llama", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True)
    tok = convert(LlamaTokenizer, work / "llama.model", work)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.model.unk_token = "<unk>"  # as the published files name it
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    write("llama2-legacy", tok, dict(add_bos_token=True, add_eos_token=False, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", legacy=True, tokenizer_class="LlamaTokenizer"))

    # Mistral v0.3: control tokens right after </s>.
    train(work / "mistral", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
          control_symbols=["[INST]", "[/INST]", "[TOOL_CALLS]"])
    tok = convert(LlamaTokenizer, work / "mistral.model", work)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    write("mistral", tok, dict(add_bos_token=True, add_eos_token=False, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>", legacy=False, tokenizer_class="LlamaTokenizer"))

    # Gemma: <pad> <eos> <bos> <unk> first, no dummy prefix, user-defined pieces.
    train(work / "gemma", pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
          bos_piece="<bos>", add_dummy_prefix=False,
          control_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"],
          user_defined_symbols=["\n\n", "▁▁", "▁▁▁", "▁▁▁▁", "<table>", "<td>"])
    tok = convert(GemmaTokenizer, work / "gemma.model", work)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    write("gemma", tok, dict(add_bos_token=True, add_eos_token=False, bos_token="<bos>", eos_token="<eos>",
                             pad_token="<pad>", unk_token="<unk>", tokenizer_class="GemmaTokenizer"))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
