"""/v1/completions logprobs where tokens are parts of characters (emoji, CJK): alternatives are
never merged (a token that is not valid UTF-8 on its own is named "bytes:\\xNN..." as OpenAI
does), and text_offset counts characters, stream or not."""
import json
import re

import pytest
import requests

PROMPTS = ["Emoji list: \U0001F642 \U0001F600 \U0001F389", "\u4e2d\u6587\uff1a\u4f60\u597d\uff0c\u4e16\u754c\u3002\u4e2d\u56fd\u7684\u9996\u90fd\u662f"]


def token_bytes(name: str) -> bytes:
    if name.startswith("bytes:"):
        return bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", name))
    return name.encode()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_alternatives_survive_and_offsets_count_characters(server, prompt):
    body = {"prompt": prompt, "max_tokens": 12, "logprobs": 5, "temperature": 0}
    whole = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    lp = whole["logprobs"]
    assert any(t.startswith("bytes:") for t in lp["tokens"]), "the prompt should make the model emit partial characters"
    for top in lp["top_logprobs"]:
        assert len(top) == 5, top  # five distinct alternatives, none merged
        assert not any("\ufffd" in k for k in top), top
    raw = b""
    for name, offset in zip(lp["tokens"], lp["text_offset"]):
        assert offset == len(raw.decode("utf-8", errors="ignore")), (name, offset, raw)
        raw += token_bytes(name)
    assert whole["text"].startswith(raw.decode("utf-8", errors="ignore"))

    streamed = {"tokens": [], "text_offset": []}
    with requests.post(f"{server.base_url}/v1/completions", json=dict(body, stream=True), stream=True, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])["choices"][0]
                if chunk.get("logprobs"):
                    streamed["tokens"] += chunk["logprobs"]["tokens"]
                    streamed["text_offset"] += chunk["logprobs"]["text_offset"]
    assert streamed["tokens"] == lp["tokens"] and streamed["text_offset"] == lp["text_offset"]
