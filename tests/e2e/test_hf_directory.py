"""`fathom serve` on a Hugging Face model directory (--model DIR, and `model` in the config file):
the tiny Qwen2 checkpoint of tests/fixtures/arch/qwen2-hf, given a chat template file
(chat_template.jinja, as transformers >= 4.43 saves it), an EOS list and a sampling default in
generation_config.json, answers the official OpenAI client. Its logits are checked against transformers' in
tests/kernel/test_cuda_arch_fixtures.cpp; here what matters is that the server serves it."""
import json
import shutil
import subprocess
from pathlib import Path

import openai
import pytest

from server_fixture import ServerProcess

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "arch" / "qwen2-hf"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "Tiny-Qwen2.5-0.1B"  # served under the directory's name, dots and all
    shutil.copytree(FIXTURE, d)
    (d / "chat_template.jinja").write_text(CHATML)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [127, 5], "temperature": 0.0}))
    return d


def chat(server, model):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=60)
    assert [m.id for m in client.models.list().data] == [model]
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello ab"}],
                                       max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    # <|im_start|>user\nHello ab<|im_end|>\n<|im_start|>assistant\n: one token per byte but "ab" (one
    # merge), the template's text bytes as written.
    prompt = "<|im_start|>user\nHello ab<|im_end|>\n<|im_start|>assistant\n"
    assert r.usage.prompt_tokens == len(prompt.encode()) - 1
    assert 1 <= r.usage.completion_tokens <= 12
    return r


def test_serves_a_directory_given_as_model(fathom_bin, model_dir):
    with ServerProcess(fathom_bin, f"{model_dir}/") as server:  # a trailing slash changes nothing
        first = chat(server, model_dir.name)
        assert chat(server, model_dir.name).choices[0].message.content == first.choices[0].message.content
        # generation_config.json's temperature 0 is the default of a request that names none: greedy,
        # the same text every time (at the engine's default of 1 on this random model, three 12-token
        # samples would differ).
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=60)
        texts = {client.chat.completions.create(model=model_dir.name, max_tokens=12,
                                                messages=[{"role": "user", "content": "Hello ab"}]).choices[0].message.content
                 for _ in range(3)}
        assert texts == {first.choices[0].message.content}


def test_a_sampling_default_out_of_range_stops_start_up(fathom_bin, model_dir):
    (model_dir / "generation_config.json").write_text(json.dumps({"temperature": 5.0}))
    proc = subprocess.run([str(fathom_bin), "serve", "--model", str(model_dir), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "general.sampling.temp" in proc.stderr, proc.stderr


def test_serves_a_directory_named_in_the_config_file(fathom_bin, model_dir, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": str(model_dir)}))
    with ServerProcess(fathom_bin, model_dir, extra_args=["--config", str(cfg)]) as server:
        chat(server, model_dir.name)
    # and with no --model at all
    proc = subprocess.Popen([str(fathom_bin), "serve", "--config", str(cfg), "--port", "0", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening" in line, proc.stderr.read() if proc.poll() is not None else line
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_an_unsupported_directory_stops_start_up_naming_the_key(fathom_bin, model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}
    (model_dir / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([str(fathom_bin), "serve", "--model", str(model_dir), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unsupported rope scaling type 'dynamic'" in proc.stderr, proc.stderr
    assert "config.json" in proc.stderr


def write_safetensors(path, tensors):
    """tensors: name -> float32 numpy array, written as safetensors (F32)."""
    import numpy as np
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_serves_a_directory_with_a_sentencepiece_tokenizer(fathom_bin, tmp_path):
    """A Llama 2-style directory: a random 1-layer llama over the SentencePiece-style tokenizer.json
    of tests/fixtures/sp_tokenizers/llama2-legacy (its ids checked against `tokenizers` in
    test_hf_sp_tokenizer.py). The server counts the prompt as `tokenizers` does, BOS included, and
    answers text."""
    import numpy as np
    from tokenizers import Tokenizer
    sp = FIXTURE.parents[1] / "sp_tokenizers" / "llama2-legacy"
    d = tmp_path / "tiny-llama2-sp"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(sp / f, d / f)
    vocab, hidden, inter, heads, kv, head_dim = 1000, 64, 80, 4, 2, 16
    (d / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2)))
    rng = np.random.default_rng(48)
    w = lambda *shape: rng.normal(0, 0.2, shape).astype(np.float32)  # noqa: E731
    l = "model.layers.0."
    write_safetensors(d / "model.safetensors", {
        "model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": w(vocab, hidden), l + "input_layernorm.weight": np.ones(hidden, np.float32),
        l + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
        l + "self_attn.q_proj.weight": w(heads * head_dim, hidden), l + "self_attn.k_proj.weight": w(kv * head_dim, hidden),
        l + "self_attn.v_proj.weight": w(kv * head_dim, hidden), l + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        l + "mlp.gate_proj.weight": w(inter, hidden), l + "mlp.up_proj.weight": w(inter, hidden),
        l + "mlp.down_proj.weight": w(hidden, inter)})
    prompt = " Hello  world,\nGrüße 🙂 [INST]"
    want = Tokenizer.from_file(str(d / "tokenizer.json")).encode(prompt).ids
    assert want[0] == 1  # BOS, from the post-processor
    with ServerProcess(fathom_bin, d) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=60)
        r = client.completions.create(model=d.name, prompt=prompt, max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens == len(want)
        assert isinstance(r.choices[0].text, str) and r.usage.completion_tokens >= 1
