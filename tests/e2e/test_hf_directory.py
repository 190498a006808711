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
