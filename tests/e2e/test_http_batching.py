"""Batching is invisible: requests served concurrently (continuously batched with each other,
streamed or not, chat or completion) return exactly the text each returns alone at temperature 0."""
import concurrent.futures as cf

import pytest


MAX_TOKENS = 12
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, astronauts",
    "The quick brown fox",
    "My favourite food is",
    "Water boils at",
    "A haiku about autumn:",
    "The largest planet in the solar system is",
    "To make a cup of tea,",
    "import numpy as np\n",
    "The meaning of life is",
    "Dear Sir or Madam,",
    "1, 2, 3, 4,",
    "Paris is known for",
]
CHATS = {3: "What is 2 + 2?", 8: "Tell me a joke.", 13: "Say hello in French."}


# `server` and `client` come from conftest.py.


def run(client, i, stream):
    """Text and finish reason of request i (chat for the indices in CHATS, else completion)."""
    kw = dict(model="smollm2-135m-instruct-q4_1", max_tokens=MAX_TOKENS, temperature=0)
    if i in CHATS:
        msgs = [{"role": "user", "content": CHATS[i]}]
        if not stream:
            c = client.chat.completions.create(messages=msgs, **kw).choices[0]
            return c.message.content, c.finish_reason
        text, finish = "", None
        for chunk in client.chat.completions.create(messages=msgs, stream=True, **kw):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        return text, finish
    if not stream:
        c = client.completions.create(prompt=PROMPTS[i], **kw).choices[0]
        return c.text, c.finish_reason
    text, finish = "", None
    for chunk in client.completions.create(prompt=PROMPTS[i], stream=True, **kw):
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def test_concurrent_equals_sequential(client):
    alone = [run(client, i, stream=False) for i in range(len(PROMPTS))]
    assert all(text for text, _ in alone)
    # All at once; every other request streams.
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda i: run(client, i, stream=i % 2 == 1), range(len(PROMPTS))))
    for i, (a, t) in enumerate(zip(alone, together)):
        assert t == a, f"request {i} ({PROMPTS[i] if i not in CHATS else CHATS[i]!r}): alone {a!r}, batched {t!r}"
