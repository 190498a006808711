"""What the fixture scripts share (make_fixtures.py: RoPE scaling; arch_fixtures.py: architectures).

Run in .venv-fixtures (scripts/requirements-fixtures.txt); `make test` needs none of this.
"""
import importlib.metadata
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reference"))
import numpy_model  # noqa: E402  (the byte alphabet, shared with the e2e reference tokenizer)
from gguf_util import finish_gguf, rel_error  # noqa: E402,F401  (torch-free; re-exported for the fixture scripts)

# Small enough to commit, wide enough that the architecture matters: initializer_range 0.2 makes
# attention scores O(1) (std ~ (8 * 0.2)^2), so a wrong rotation or a missing term changes which keys
# a query attends to instead of averaging away.
INITIALIZER_RANGE = 0.2
VOCAB = 128


def randomize_norms(model, low=0.8, high=1.2):
    """Norm weights away from 1 (transformers initialises them to 1), so that reading them wrongly shows."""
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.uniform_(low, high)


def gpt2_byte_chars():
    """GPT-2's printable stand-in of each byte (the alphabet byte-level BPE vocabularies use)."""
    return numpy_model._bytes_to_unicode()


def add_bpe_vocab(w, tokens, control, merges, pre, bos=None, eos=None):
    """A byte-level BPE vocabulary (tokenizer.ggml.*): `tokens` in id order, the ids in `control` are
    control tokens; the tests feed token ids, the vocabulary only has to load."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)


def logits_of(model, prompts):
    """Every position's logits of every prompt, one prompt after the other ([rows][vocab])."""
    with torch.no_grad():
        return np.concatenate([model(torch.tensor([p])).logits[0].numpy() for p in prompts])


def f32_vs_f64(model, prompts):
    """f32 logits, and how far they are from the same model's f64 ones (the noise floor of any f32
    implementation)."""
    f32 = logits_of(model, prompts)
    f64 = logits_of(model.to(torch.float64), prompts)
    model.to(torch.float32)
    return f32.astype("<f4"), rel_error(f32, f64)


def made_with():
    return dict(transformers=transformers.__version__, torch=torch.__version__,
                gguf=importlib.metadata.version("gguf"))
