"""Independent numpy reference forward pass for fathom's two architectures (llama, gemma3).

Reads a GGUF file with gguf_file.py (struct and a memmap, from the GGUF specification; it gives
what PyPI `gguf`'s GGUFReader gives, ~70x faster on a 262k-token vocabulary); every weight is
dequantized once with gguf.quants.dequantize into a float array. Shares no code with the C++ side.
See tests/reference/README.md for the formulas and where each fact was checked.

    python tests/reference/numpy_model.py MODEL.gguf --chat "What is the capital of France?"
    python tests/reference/numpy_model.py MODEL.gguf --noise      # float32 vs float64 logits
"""
from __future__ import annotations

import functools
import heapq
import math
import os
import re
import sys
import time

# One BLAS thread unless told otherwise: the matrices here are small, and on a shared 2-core
# machine OpenBLAS's threads spin against each other (measured 7x slower for 13x640x2048).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from gguf_file import GgufFile  # noqa: E402  (this directory)

# Bump when the reference math changes: it is part of the e2e test's cache key.
VERSION = "numpy-ref-1"


@functools.lru_cache(maxsize=None)
def gguf_reader(path) -> GgufFile:
    """One reader per file per process (the e2e tests read the same two files from several
    modules); only read from. GGUFReader itself took ~16 s for Gemma 3's 262k-token vocabulary on
    2 cores, gguf_file 0.2 s, with the same fields and tensors (tests/reference/README.md)."""
    return GgufFile(path)


# ----------------------------------------------------------------------------- config

class Config:
    """Hyperparameters from GGUF metadata (<arch>.* keys) plus the per-architecture
    constants llama.cpp hard-codes (gemma3: SWA pattern, local RoPE base, embedding scale)."""

    def __init__(self, reader: GgufFile | GGUFReader):
        def get(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        arch = get("general.architecture")
        if arch not in ("llama", "gemma3"):
            raise ValueError(f"unsupported architecture {arch!r}")
        self.arch = arch
        self.n_layers = int(get(f"{arch}.block_count"))
        self.dim = int(get(f"{arch}.embedding_length"))
        self.ffn_dim = int(get(f"{arch}.feed_forward_length"))
        self.n_heads = int(get(f"{arch}.attention.head_count"))
        self.n_kv_heads = int(get(f"{arch}.attention.head_count_kv", self.n_heads))
        self.head_dim = int(get(f"{arch}.attention.key_length", self.dim // self.n_heads))
        assert int(get(f"{arch}.attention.value_length", self.head_dim)) == self.head_dim
        self.rope_dim = int(get(f"{arch}.rope.dimension_count", self.head_dim))
        self.rms_eps = float(get(f"{arch}.attention.layer_norm_rms_epsilon"))
        rope_base = float(get(f"{arch}.rope.freq_base", 10000.0))
        scaling = get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ValueError(f"unsupported rope scaling {scaling!r}")
        factor = float(get(f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        self.rope_scale = 1.0 / factor if factor else 1.0  # positions are multiplied by this
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        self.vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
        self.eos_id = get("tokenizer.ggml.eos_token_id")
        self.bos_id = get("tokenizer.ggml.bos_token_id")
        # per layer: (rope base, rope position scale, window: keys a query sees incl. itself, 0 = all)
        self.layers = [(rope_base, self.rope_scale, 0)] * self.n_layers
        if arch == "llama":
            self.rope_neox = False          # LLAMA_ROPE_TYPE_NORM: pairs (2i, 2i+1)
            self.embed_scale = 1.0
            self.gemma = False
        else:
            self.rope_neox = True           # LLAMA_ROPE_TYPE_NEOX: pairs (i, i + rope_dim/2)
            self.embed_scale = math.sqrt(self.dim)
            self.gemma = True
            window = int(get(f"{arch}.attention.sliding_window"))
            # llama.cpp: set_swa_pattern(6) -> layer il is sliding iff il % 6 < 5;
            # sliding layers use rope base 10000 and no rope scaling.
            self.layers = [(10000.0, 1.0, window) if il % 6 < 5 else (rope_base, self.rope_scale, 0)
                           for il in range(self.n_layers)]


# ----------------------------------------------------------------------------- math

def rms_norm(x, w, eps):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + eps)) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi).astype(x.dtype) * (x + 0.044715 * x * x * x)))


def silu(x):
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))  # sigmoid(x) = (1 + tanh(x/2)) / 2, no overflow


def rope(x, pos, base, pos_scale, rope_dim, neox):
    """x: [T, H, head_dim]; pos: [T] absolute positions. theta_i = p * base^(-2i/rope_dim)."""
    half = rope_dim // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    ang = (pos.astype(np.float64) * pos_scale)[:, None] * inv[None, :]       # [T, half]
    cos = np.cos(ang).astype(x.dtype)[:, None, :]
    sin = np.sin(ang).astype(x.dtype)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


# ----------------------------------------------------------------------------- model

class KVCache:
    def __init__(self, n_layers):
        self.k = [None] * n_layers   # [n_kv_heads, S, head_dim], roped
        self.v = [None] * n_layers
        self.n = 0


class ReferenceModel:
    def __init__(self, path, dtype=np.float32, reader: GgufFile | GGUFReader | None = None):
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.reader = reader if reader is not None else gguf_reader(self.path)
        self.cfg = Config(self.reader)
        self.w = {}
        for t in self.reader.tensors:
            a = dequantize(t.data, t.tensor_type)
            a = np.ascontiguousarray(a.reshape(tuple(int(d) for d in reversed(t.shape))), dtype=self.dtype)
            self.w[t.name] = a            # 2-D weights are [out][in], as stored
        # tied output: llama.cpp falls back to token_embd when output.weight is absent
        self.w_out = self.w.get("output.weight", self.w["token_embd.weight"])
        assert self.w_out.shape == (self.cfg.vocab, self.cfg.dim)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.reader)
        return self._tokenizer

    def _lin(self, x, name):
        return x @ self.w[name].T

    def _attention(self, il, x, pos, cache):
        c, L = self.cfg, f"blk.{il}."
        T, H, KV, hd = x.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        base, pscale, window = c.layers[il]
        q = self._lin(x, L + "attn_q.weight").reshape(T, H, hd)
        k = self._lin(x, L + "attn_k.weight").reshape(T, KV, hd)
        v = self._lin(x, L + "attn_v.weight").reshape(T, KV, hd)
        if c.gemma:
            q = rms_norm(q, self.w[L + "attn_q_norm.weight"], c.rms_eps)
            k = rms_norm(k, self.w[L + "attn_k_norm.weight"], c.rms_eps)
        q = rope(q, pos, base, pscale, c.rope_dim, c.rope_neox)
        k = rope(k, pos, base, pscale, c.rope_dim, c.rope_neox)
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)          # [KV, T, hd]
        if cache is not None:
            if cache.k[il] is not None:
                k = np.concatenate([cache.k[il], k], axis=1)
                v = np.concatenate([cache.v[il], v], axis=1)
            cache.k[il], cache.v[il] = k, v
        S = k.shape[1]
        kpos = np.arange(S)
        qpos = pos
        masked = kpos[None, :] > qpos[:, None]                       # causal
        if window:
            masked |= (qpos[:, None] - kpos[None, :]) >= window     # llama.cpp is_masked_swa
        g = H // KV                                                  # q head h uses kv head h // g
        qg = q.transpose(1, 0, 2).reshape(KV, g * T, hd)
        s = (qg @ k.transpose(0, 2, 1)) * self.dtype.type(c.attn_scale)   # [KV, g*T, S]
        s = s.reshape(KV, g, T, S)
        s = np.where(masked[None, None], -np.inf, s)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = p.reshape(KV, g * T, S) @ v                              # [KV, g*T, hd]
        o = o.reshape(KV, g, T, hd).reshape(H, T, hd).transpose(1, 0, 2).reshape(T, H * hd)
        return self._lin(o, L + "attn_output.weight")

    def _ffn(self, il, x):
        L = f"blk.{il}."
        gate = self._lin(x, L + "ffn_gate.weight")
        up = self._lin(x, L + "ffn_up.weight")
        act = gelu_tanh(gate) if self.cfg.gemma else silu(gate)
        return self._lin(act * up, L + "ffn_down.weight")

    def hidden(self, ids, cache: KVCache | None = None):
        """Final normed hidden states [T, dim] for `ids` appended after the cache contents."""
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        start = cache.n if cache is not None else 0
        pos = np.arange(start, start + len(ids))
        x = self.w["token_embd.weight"][ids]
        if c.embed_scale != 1.0:
            x = x * self.dtype.type(c.embed_scale)
        for il in range(c.n_layers):
            L = f"blk.{il}."
            a = self._attention(il, rms_norm(x, self.w[L + "attn_norm.weight"], c.rms_eps), pos, cache)
            if c.gemma:
                a = rms_norm(a, self.w[L + "post_attention_norm.weight"], c.rms_eps)
            x = x + a
            f = self._ffn(il, rms_norm(x, self.w[L + "ffn_norm.weight"], c.rms_eps))
            if c.gemma:
                f = rms_norm(f, self.w[L + "post_ffw_norm.weight"], c.rms_eps)
            x = x + f
        if cache is not None:
            cache.n += len(ids)
        return rms_norm(x, self.w["output_norm.weight"], c.rms_eps)

    def logits_from_hidden(self, h):
        return h @ self.w_out.T

    def forward(self, ids):
        """Logits [n_tokens, vocab] for every position (full recompute, causal mask)."""
        return self.logits_from_hidden(self.hidden(ids))

    def greedy(self, ids, max_new, stop_ids=(), topk=8):
        """Greedy decoding with a KV cache (argmax of the logits, appended). Returns a dict:
        tokens; top_ids/top_vals [n, topk] and scales [n] = top-k and max|logit| of the logits
        row each token was chosen from; prompt_hidden [len(ids), dim] = hidden(ids).
        Stops after emitting a stop id."""
        cache = KVCache(self.cfg.n_layers)
        prompt_hidden = self.hidden(ids, cache)
        h = prompt_hidden[-1:]
        toks, tids, tvals, scales = [], [], [], []
        for _ in range(max_new):
            lg = self.logits_from_hidden(h)[0]
            order = np.argpartition(-lg, topk)[:topk]
            order = order[np.argsort(-lg[order], kind="stable")]
            tok = int(np.argmax(lg))
            assert tok == int(order[0]) or lg[tok] == lg[order[0]]
            toks.append(tok)
            tids.append(order)
            tvals.append(lg[order].astype(np.float32))
            scales.append(float(np.abs(lg).max()))
            if tok in stop_ids:
                break
            h = self.hidden([tok], cache)
        return dict(tokens=toks, top_ids=np.array(tids, dtype=np.int64),
                    top_vals=np.array(tvals, dtype=np.float32),
                    scales=np.array(scales, dtype=np.float32), prompt_hidden=prompt_hidden)

    def stop_ids(self):
        """End-of-generation ids: the GGUF eos id plus the chat end-of-turn tokens."""
        names = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>")
        s = {int(self.cfg.eos_id)} if self.cfg.eos_id is not None else set()
        s |= {self.tokenizer.id_of[n] for n in names if n in self.tokenizer.id_of}
        return s


# ----------------------------------------------------------------------------- tokenizer
# Only used to turn the e2e test's prompt text into ids and to print generations. A plain
# implementation of the two GGUF tokenizer kinds, good for ordinary English text.

def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# GPT-2 pre-tokenizer with digits split one by one (llama.cpp's "smollm" pre-type);
# [^\W\d_] approximates \p{L}.
_GPT2_SPLIT = re.compile(r"""\d|'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?[^\s\w]+| ?_+|\s+(?!\S)|\s+""")


class Tokenizer:
    def __init__(self, reader: GgufFile | GGUFReader):
        f = reader.fields
        self.kind = f["tokenizer.ggml.model"].contents()       # "gpt2" (BPE) or "llama" (SPM)
        self.tokens = f["tokenizer.ggml.tokens"].contents()
        self.types = f["tokenizer.ggml.token_type"].contents()
        self.id_of = {t: i for i, t in enumerate(self.tokens)}
        # control (3) and user-defined (4) tokens are matched verbatim before tokenizing
        self.special = [t for t, ty in zip(self.tokens, self.types) if ty in (3, 4) and t]
        if self.kind == "gpt2":
            self.b2u = _bytes_to_unicode()
            self.u2b = {u: b for b, u in self.b2u.items()}
            merges = f["tokenizer.ggml.merges"].contents()
            self.rank = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
            self._cache = {}
        elif self.kind == "llama":
            self.scores = f["tokenizer.ggml.scores"].contents()
        else:
            raise ValueError(f"unsupported tokenizer {self.kind!r}")

    def encode(self, text):
        present = sorted({s for s in self.special if s in text}, key=len, reverse=True)
        parts = re.split("(" + "|".join(map(re.escape, present)) + ")", text) if present else [text]
        ids = []
        for i, part in enumerate(parts):
            if i % 2 == 1:
                ids.append(self.id_of[part])
            elif part:
                ids += self._bpe_text(part) if self.kind == "gpt2" else self._spm_text(part)
        return ids

    def _bpe_text(self, text):
        out = []
        for word in _GPT2_SPLIT.findall(text):
            if word not in self._cache:
                self._cache[word] = self._bpe_word("".join(self.b2u[b] for b in word.encode("utf-8")))
            out += self._cache[word]
        return out

    def _bpe_word(self, word):
        sym = list(word)
        while len(sym) > 1:
            pairs = [(self.rank.get((sym[i], sym[i + 1]), 1 << 62), i) for i in range(len(sym) - 1)]
            r, i = min(pairs)
            if r == 1 << 62:
                break
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
        return [self.id_of[s] for s in sym]

    def _spm_text(self, text):
        # SentencePiece BPE as llama.cpp's llm_tokenizer_spm: start from characters, repeatedly
        # merge the adjacent pair whose concatenation is a token with the highest score
        # (leftmost on ties); leftovers fall back to <0xXX> byte tokens.
        sym = list(text.replace(" ", "\u2581"))
        prev = list(range(-1, len(sym) - 1))
        nxt = list(range(1, len(sym) + 1))
        nxt[-1] = -1
        heap = []

        def push(i):
            j = nxt[i]
            if i < 0 or j < 0:
                return
            tid = self.id_of.get(sym[i] + sym[j])
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], i, sym[i] + sym[j]))

        for i in range(len(sym) - 1):
            push(i)
        while heap:
            _, i, s = heapq.heappop(heap)
            j = nxt[i]
            if j < 0 or sym[i] is None or sym[j] is None or sym[i] + sym[j] != s:
                continue                                   # stale entry
            sym[i], sym[j] = s, None
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prev[nxt[j]] = i
            if prev[i] >= 0:
                push(prev[i])
            push(i)
        ids = []
        for s in sym:
            if s is None:
                continue
            if s in self.id_of:
                ids.append(self.id_of[s])
            else:
                ids += [self.id_of[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
        return ids

    def decode(self, ids):
        if self.kind == "gpt2":
            data = bytearray()
            for i in ids:
                t = self.tokens[i]
                data += t.encode() if self.types[i] == 3 else bytes(self.u2b.get(ch, ord("?")) for ch in t)
            return data.decode("utf-8", errors="replace")
        data = bytearray()
        for i in ids:
            t = self.tokens[i]
            if self.types[i] == 6 and re.fullmatch(r"<0x[0-9A-F]{2}>", t):
                data.append(int(t[3:5], 16))
            else:
                data += t.replace("\u2581", " ").encode("utf-8")
        return data.decode("utf-8", errors="replace")


def chat_prompt(arch, user, system=None):
    """The model's own chat format (from its GGUF chat template) around one user turn."""
    if arch == "llama":   # SmolLM2 (ChatML)
        s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    # gemma3: no system role; a system text is prepended to the first user turn
    u = f"{system}\n\n{user}" if system else user
    return f"<bos><start_of_turn>user\n{u}<end_of_turn>\n<start_of_turn>model\n"


# ----------------------------------------------------------------------------- CLI

def _noise(path, text):
    r = GGUFReader(path)
    m32 = ReferenceModel(path, np.float32, reader=r)
    ids = m32.tokenizer.encode(text)
    l32 = m32.forward(ids)
    del m32
    m64 = ReferenceModel(path, np.float64, reader=r)
    l64 = m64.forward(ids)
    d = np.abs(l32 - l64).max(axis=1)
    scale = np.abs(l64).max(axis=1)
    corr = [np.corrcoef(a, b)[0, 1] for a, b in zip(l32, l64)]
    print(f"{len(ids)} tokens: max|d| per row worst {d.max():.3e} (rel {np.max(d / scale):.3e}), "
          f"median {np.median(d):.3e}; max|ref| {scale.min():.1f}..{scale.max():.1f}; "
          f"min corr {min(corr):.9f}; argmax equal {np.mean(l32.argmax(1) == l64.argmax(1)):.3f}")


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--chat", default="What is the capital of France?")
    ap.add_argument("--system", default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--noise", action="store_true", help="compare float32 against float64 logits")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.noise:
        _noise(a.model, chat_prompt(GGUFReader(a.model).fields["general.architecture"].contents(),
                                    a.chat, a.system))
        return
    m = ReferenceModel(a.model)
    t1 = time.time()
    ids = m.tokenizer.encode(chat_prompt(m.cfg.arch, a.chat, a.system))
    toks = m.greedy(ids, a.max_tokens, m.stop_ids())["tokens"]
    t2 = time.time()
    print(f"load {t1 - t0:.1f}s, {len(ids)} prompt tokens + {len(toks)} generated in {t2 - t1:.1f}s")
    print("prompt ids:", ids)
    print("generated ids:", toks)
    print("text:", repr(m.tokenizer.decode(toks)))


if __name__ == "__main__":
    main(sys.argv[1:])
