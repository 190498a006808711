"""/v1/completions with a list of prompts (choices prompt-major, then n; each prompt's text equals
its solo run) and echo (the prompt text leads each choice), through the official openai client,
whole and streamed."""
import openai
import pytest

PROMPTS = ["The sky is", "One plus one is", "My favourite fruit"]


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


def solo(oa, prompt, **kw):
    r = oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=prompt, max_tokens=8, temperature=0, **kw)
    return r.choices[0].text, r.usage


def test_prompt_list_equals_solo_runs(oa):
    alone = [solo(oa, p) for p in PROMPTS]
    r = oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=PROMPTS, n=2, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == list(range(6))
    for c in r.choices:
        assert c.text == alone[c.index // 2][0], (c.index, c.text)
    # n choices of one prompt share its prefill: each prompt counts once.
    assert r.usage.prompt_tokens == sum(u.prompt_tokens for _, u in alone)
    assert r.usage.completion_tokens == 2 * sum(u.completion_tokens for _, u in alone)


def test_prompt_list_streamed(oa):
    alone = [solo(oa, p)[0] for p in PROMPTS]
    texts = {}
    stream = oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=PROMPTS, max_tokens=8, temperature=0,
                                   stream=True)
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(3)] == alone


def test_token_id_prompts_in_a_list(oa, server):
    import requests
    ids = requests.post(f"{server.base_url}/tokenize", json={"prompt": PROMPTS[0]}, timeout=30).json()["tokens"]
    r = oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=[ids, PROMPTS[1]], max_tokens=8, temperature=0)
    assert [c.text for c in r.choices] == [solo(oa, ids)[0], solo(oa, PROMPTS[1])[0]]


def test_echo_prefixes_the_prompt(oa):
    completion = solo(oa, PROMPTS[0])[0]
    assert solo(oa, PROMPTS[0], echo=True)[0] == PROMPTS[0] + completion
    texts = ""
    for chunk in oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=PROMPTS[0], max_tokens=8,
                                       temperature=0, echo=True, stream=True):
        texts += chunk.choices[0].text if chunk.choices else ""
    assert texts == PROMPTS[0] + completion


def test_too_many_prompts_are_a_400(oa):
    # (echo with logprobs is served: tests/e2e/test_completion_echo.py)
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model="smollm2-135m-instruct-q4_1", prompt=["x"] * 33, max_tokens=2)
    assert e.value.body["param"] == "prompt"


def test_ignore_eos_at_the_top_level_ignores_every_end_of_generation(oa):
    # vLLM's spelling of the extension. Without it this chat prompt ends early for most samples
    # (checked first, so the test cannot pass by accident); with it every sample runs to max_tokens.
    messages = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    kw = dict(model="smollm2-135m-instruct-q4_1", messages=messages, n=8, max_tokens=24, temperature=0.8, seed=1)
    free = oa.chat.completions.create(**kw)
    assert any(c.finish_reason == "stop" for c in free.choices)
    fixed = oa.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert [c.finish_reason for c in fixed.choices] == ["length"] * 8
    assert fixed.usage.completion_tokens == 8 * 24
