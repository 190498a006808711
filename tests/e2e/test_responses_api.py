"""POST /v1/responses through the official openai client: plain and streamed (the documented
event sequence ending in response.completed), the same text as the equivalent chat request,
max_output_tokens -> incomplete, function tools (calls as function_call items whose arguments
validate, streamed, and a round trip with function_call_output), and clear 400s for what a
stateless server cannot do."""
import json

import jsonschema
import openai
import pytest

MODEL = "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


def chat_text(oa, messages, max_tokens):
    r = oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def test_plain_response_equals_the_chat_answer(oa):
    r = oa.responses.create(model=MODEL, input="What is the capital of France?", instructions="Answer briefly.",
                            max_output_tokens=24, temperature=0)
    expected = chat_text(oa, [{"role": "system", "content": "Answer briefly."},
                              {"role": "user", "content": "What is the capital of France?"}], 24)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == expected
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Answer briefly." and r.store is False
    assert r.parallel_tool_calls is False, "the server's default, echoed as it is (off unless asked)"
    asked = oa.responses.create(model=MODEL, input="Hi", max_output_tokens=1, parallel_tool_calls=True)
    assert asked.parallel_tool_calls is True


def test_message_list_input_and_max_output_tokens(oa):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Count from one to twenty."}]},]
    r = oa.responses.create(model=MODEL, input=items, max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5
    assert r.output_text == chat_text(oa, [{"role": "user", "content": "Count from one to twenty."}], 5)


def test_streamed_events_follow_the_documented_sequence(oa):
    events = list(oa.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0,
                                      stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"] or types[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == done.text == events[-1].response.output_text
    plain = oa.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0)
    assert plain.output_text == deltas


@pytest.mark.parametrize("extra,param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": 3}}}, "text.format.type"),  # wrong JSON types are 400s, not 500s
    ({"tools": [{"type": ["function"]}]}, "tools[0].type"),
    ({"tool_choice": {"type": 5, "name": "w"}}, "tool_choice"),
])
def test_what_a_stateless_text_server_refuses(oa, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=MODEL, input="hi", max_output_tokens=4, **extra)
    assert e.value.body["param"] == param


WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER,
          "strict": True},
         {"type": "function", "name": "get_time", "description": "Time in a timezone",
          "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 24}},
                         "required": ["tz"], "additionalProperties": False}}]


def test_function_tools_give_function_call_items_that_validate(oa):
    for seed in range(3):
        r = oa.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS, temperature=1.0,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64)
        calls = [item for item in r.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert [t.name for t in r.tools] == ["get_weather", "get_time"]


def test_streamed_function_call_equals_whole(oa):
    kwargs = dict(model=MODEL, input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                  temperature=0, max_output_tokens=64)
    whole = oa.responses.create(**kwargs)
    events = list(oa.responses.create(stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in types
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    call = next(i for i in whole.output if i.type == "function_call")
    assert done[0].arguments == call.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output[-1].arguments == call.arguments


def test_a_function_call_output_without_its_call_is_a_400(oa):
    """As OpenAI: an output must answer a function_call in the same input (none is stored)."""
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_b", "output": "21"}]
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=MODEL, input=items, tools=TOOLS, max_output_tokens=4)
    assert e.value.body["param"] == "input[2].call_id"


def test_function_call_round_trip(oa):
    first = oa.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS, temperature=0,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64)
    call = next(i for i in first.output if i.type == "function_call")
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature": 21})}]
    second = oa.responses.create(model=MODEL, input=items, tools=TOOLS, tool_choice="none", temperature=0,
                                 max_output_tokens=24)
    assert second.output_text and all(i.type == "message" for i in second.output)


def test_the_fathom_extension_object_as_on_chat(oa):
    """The attention policy, speculation and the rest of chat's "fathom" object (docs/api.md)."""
    kwargs = dict(model=MODEL, input="What is the capital of France?", max_output_tokens=12, temperature=0)
    dense = oa.responses.create(**kwargs)
    spec = oa.responses.create(**kwargs, extra_body={"fathom": {"speculative": "ngram", "attention": "dense"}})
    assert spec.output_text == dense.output_text, "speculation verified densely keeps the text"
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(**kwargs, extra_body={"fathom": {"attention": "no-such-policy"}})
    assert e.value.body["param"] == "fathom.attention"


def test_logprobs_when_included_are_chats(oa, server):
    """include ["message.output_text.logprobs"] and top_logprobs: the text's tokens as chat gives them
    for the same request (the openai client's Responses types carry them on the output_text part)."""
    kwargs = dict(model=MODEL, input="What is the capital of France?", max_output_tokens=8, temperature=0)
    r = oa.responses.create(**kwargs, include=["message.output_text.logprobs"], top_logprobs=2)
    part = r.output[0].content[0]
    chat = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": kwargs["input"]}],
                                      max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    want = chat.choices[0].logprobs.content
    assert [t.token for t in part.logprobs] == [t.token for t in want]
    assert [t.logprob for t in part.logprobs] == pytest.approx([t.logprob for t in want])
    assert all(len(t.top_logprobs) == 2 for t in part.logprobs)
    events = list(oa.responses.create(**kwargs, include=["message.output_text.logprobs"], stream=True))
    streamed = [t for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert [t.token for t in streamed] == [t.token for t in part.logprobs]
    assert [t.token for t in events[-1].response.output[0].content[0].logprobs] == [t.token for t in part.logprobs]
    assert getattr(oa.responses.create(**kwargs).output[0].content[0], "logprobs", None) in (None, []), "only when asked"
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(**kwargs, include=["reasoning.encrypted_content"])
    assert e.value.body["param"] == "include[0]"
