"""Function tools on /v1/chat/completions through the official openai client: a named or required
tool_choice yields calls whose arguments parse and validate against the function's schema (the
output is constrained to it), whole and streamed; a tool round trip (assistant tool_calls + tool
result) continues the conversation; bad tool fields are 400s."""
import json

import jsonschema
import openai
import pytest

MODEL = "smollm2-135m-instruct-q4_1"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone",
                                           "parameters": TIME, "strict": True}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


def check_call(call, name=None):
    assert call.type == "function" and call.id.startswith("call_")
    assert name is None or call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_tool_choice_validates_over_seeds(oa):
    for seed in range(4):
        r = oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=1.0, seed=seed,
                                       max_tokens=64,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        check_call(c.message.tool_calls[0], "get_weather")


def test_required_tool_choice_picks_a_known_function(oa):
    for seed in range(4):
        c = oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=64).choices[0]
        assert c.finish_reason == "tool_calls"
        check_call(c.message.tool_calls[0])


def test_streamed_tool_call_equals_whole(oa):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=1.0, seed=3, max_tokens=64,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = oa.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    calls, finish = {}, None
    for chunk in oa.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == whole.function.name and calls[0]["arguments"] == whole.function.arguments
    assert calls[0]["id"].startswith("call_")  # ids are per response


def test_tool_round_trip(oa):
    first = oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=64,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [{"role": "assistant", "content": None,
                       "tool_calls": [{"id": call.id, "type": "function",
                                       "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                      {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    second = oa.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                        temperature=0, max_tokens=24)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    # Fields of the wrong JSON type (fuzz_request found the first escaping as a type_error):
    ({"tools": [{"type": {"name": "w"}}], "tool_choice": {"type": "function", "function": {"name": "w"}}}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": 7}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "w", "strict": "yes"}}]}, "tools[0].function.strict"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": ["x"]}}}, "tool_choice"),
    # A call's arguments are an object: a string schema, named, returned a bare JSON string.
    ({"tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "string"}}}],
      "tool_choice": {"type": "function", "function": {"name": "w"}}}, "tools[0].function.parameters"),
])
def test_bad_tool_fields_are_400s(oa, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **extra)
    assert e.value.body["param"] == param


def test_a_streamed_tool_request_is_cancelled_when_its_client_leaves(server):
    # With tools offered a stream holds its text back until the choice ends, so nothing is
    # written while it generates: the client must still be noticed leaving.
    import re
    import time

    import requests

    def running():
        text = requests.get(f"{server.base_url}/metrics", timeout=5).text
        return float(re.search(r"^fathom_requests_running (\S+)$", text, re.M).group(1))

    r = requests.post(f"{server.base_url}/v1/chat/completions", stream=True, timeout=60,
                      json={"model": MODEL, "messages": ASK, "tools": TOOLS, "stream": True,
                            "max_tokens": 3000, "ignore_eos": True})
    assert r.status_code == 200, r.text
    end = time.monotonic() + 30
    while running() < 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert running() >= 1
    time.sleep(1.0)  # decoding, not prefilling
    r.close()
    end = time.monotonic() + 5
    while running() > 0 and time.monotonic() < end:
        time.sleep(0.05)
    assert running() == 0, "the held stream kept generating after its client left"


def test_a_constrained_tool_schema_with_an_unenforceable_keyword_is_a_400(oa):
    bad = [{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}]
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=ASK, tools=bad, tool_choice="required", max_tokens=8)
    assert e.value.body["param"] == "tools[0].function.parameters"
    assert "uniqueItems" in e.value.body["message"]
    # With tool_choice auto the schema is only shown to the model: accepted.
    oa.chat.completions.create(model=MODEL, messages=ASK, tools=bad, max_tokens=4)


def stream_chunks(oa, **kw):
    return [ch for chunk in oa.chat.completions.create(stream=True, **kw) for ch in chunk.choices]


def test_a_named_call_streams_its_arguments_as_they_are_generated(oa):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=64,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    pieces = [tc for ch in stream_chunks(oa, **kw) for tc in ch.delta.tool_calls or []]
    assert len(pieces) > 3, "the arguments arrived in one piece"
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == "get_weather"
    assert all(p.id is None and p.function.name is None for p in pieces[1:])
    whole = oa.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert "".join(p.function.arguments for p in pieces) == whole.function.arguments


def test_auto_streams_plain_content_as_it_is_generated(oa):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Write two sentences about the sea."}],
              tools=TOOLS, temperature=0, max_tokens=40)
    whole = oa.chat.completions.create(**kw).choices[0]
    chunks = stream_chunks(oa, **kw)
    if whole.message.tool_calls:  # the model chose a call: streamed = whole
        calls = [tc for ch in chunks for tc in ch.delta.tool_calls or []]
        assert [c.function.arguments for c in calls] == [c.function.arguments for c in whole.message.tool_calls]
        return
    content = [ch.delta.content for ch in chunks if ch.delta.content]
    assert len(content) > 3, "the text was held to the end"
    assert "".join(content) == whole.message.content
    assert chunks[-1].finish_reason == whole.finish_reason


def test_required_with_parallel_tool_calls_makes_one_or_more_valid_calls(oa):
    counts = set()
    for seed in range(4):
        c = oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=True, temperature=1.0, seed=seed, max_tokens=128).choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        assert len({call.id for call in c.message.tool_calls}) == len(c.message.tool_calls)
        for call in c.message.tool_calls:
            check_call(call)
        counts.add(len(c.message.tool_calls))
    assert counts, "every sample hit the length limit"
    one = oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                     temperature=1.0, seed=0, max_tokens=96).choices[0]  # default: one call
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1
    check_call(one.message.tool_calls[0])
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, parallel_tool_calls="yes", max_tokens=4)
    assert e.value.body["param"] == "parallel_tool_calls"


@pytest.mark.parametrize("kwargs,param", [
    ({"functions": [{"name": "get_weather", "parameters": {"type": "object"}}]}, "functions"),
    ({"function_call": {"name": "get_weather"}}, "function_call"),  # was accepted and ignored: no forced call
    ({"function_call": "auto"}, "function_call"),
])
def test_the_deprecated_function_fields_are_400s_naming_them(oa, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4, **kwargs)
    assert e.value.body["param"] == param
