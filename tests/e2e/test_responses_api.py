"""POST /v1/responses through the official openai client: plain and streamed (the documented
event sequence ending in response.completed), the same text as the equivalent chat request,
max_output_tokens -> incomplete, and clear 400s for what a stateless server cannot do."""
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
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tools"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
])
def test_what_a_stateless_text_server_refuses(oa, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=MODEL, input="hi", max_output_tokens=4, **extra)
    assert e.value.body["param"] == param
