"""Grammar-constrained decoding (xgrammar): response_format json_object / json_schema on chat,
text.format on /v1/responses, and a raw EBNF grammar, through the official openai client. A
135M-parameter model cannot follow such instructions by itself; every sample must still parse
and validate, at temperature 1 over many seeds, because the mask allows nothing else."""
import json

import jsonschema
import openai
import pytest

MODEL = "smollm2-135m-instruct-q4_1"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "colour", "tags", "address"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


def ask(oa, response_format, seed, n=1, max_tokens=160):
    return oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=response_format, temperature=1.0, seed=seed, n=n, max_tokens=max_tokens)


def test_json_schema_outputs_validate_over_seeds(oa):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    outputs = []
    for seed in range(6):
        r = ask(oa, fmt, seed, n=2)
        for c in r.choices:
            assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
            value = json.loads(c.message.content)
            jsonschema.validate(value, SCHEMA)
            outputs.append(value)
    assert len({json.dumps(v, sort_keys=True) for v in outputs}) > 1, "temperature 1 should vary the samples"


def test_json_object_outputs_parse(oa):
    for seed in range(4):
        c = ask(oa, {"type": "json_object"}, seed, max_tokens=64).choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
        else:  # cut by max_tokens: still a prefix of JSON that the grammar accepted
            assert c.message.content.lstrip().startswith("{")


def test_streamed_json_schema_equals_whole(oa):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    whole = ask(oa, fmt, 42).choices[0].message.content
    text = ""
    for chunk in oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
                                            response_format=fmt, temperature=1.0, seed=42, max_tokens=160, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == whole
    jsonschema.validate(json.loads(text), SCHEMA)


def test_responses_api_text_format(oa):
    r = oa.responses.create(model=MODEL, input="Describe a person.", temperature=1.0, max_output_tokens=160,
                            text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)


def test_raw_ebnf_grammar(oa):
    grammar = 'root ::= "answer: " ("yes" | "no") "."'
    for seed in range(4):
        c = oa.completions.create(model=MODEL, prompt="Is the sky blue?", max_tokens=16, temperature=1.0, seed=seed,
                                  extra_body={"fathom": {"grammar": grammar}}).choices[0]
        assert c.text in ("answer: yes.", "answer: no."), c.text
        assert c.finish_reason == "stop"


def test_a_bad_schema_is_a_400(oa):
    with pytest.raises(openai.BadRequestError):
        ask(oa, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}, 0)
    with pytest.raises(openai.BadRequestError) as e:
        ask(oa, {"type": "xml"}, 0)
    assert e.value.body["param"] == "response_format"


@pytest.mark.parametrize("schema, keyword, where", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "/uniqueItems"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "not", "/properties/a/not"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if", "/if"),
    ({"anyOf": [{"type": "object", "dependentRequired": {"a": ["b"]}}]}, "dependentRequired", "/anyOf/0/dependentRequired"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf", "/multipleOf"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 4}, "maxLength", "the schema's root"),
])
def test_a_keyword_the_constraint_cannot_enforce_is_a_400_naming_it(oa, schema, keyword, where):
    """xgrammar only warns about these and drops them; the output would not be guaranteed to
    validate, so fathom refuses the schema and says which keyword, where."""
    with pytest.raises(openai.BadRequestError) as e:
        ask(oa, {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, 0)
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert keyword in e.value.body["message"] and where in e.value.body["message"], e.value.body["message"]


def test_annotations_and_enforced_keywords_are_accepted(oa):
    schema = {"title": "T", "description": "d", "$comment": "c", "type": "object",
              "properties": {"n": {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 30,
                                   "default": 3, "examples": [3]}},
              "required": ["n"], "additionalProperties": False}
    r = ask(oa, {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}, 1, max_tokens=24)
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, schema)
    assert value["n"] % 3 == 0


def test_a_ref_chain_thousands_deep_is_a_400_and_the_server_lives(oa, server):
    """The second hardening probe's crash: $defs chained by $ref 6,000 deep (~450 KiB, under the
    body limit) overflowed the stack of the thread compiling it. Now a 400 naming the bound, and
    the same server answers the next request."""
    hops = 6000
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(hops)}
    defs[f"d{hops}"] = {"type": "integer"}
    schema = {"$ref": "#/$defs/d0", "$defs": defs}
    with pytest.raises(openai.BadRequestError) as e:
        ask(oa, {"type": "json_schema", "json_schema": {"name": "chain", "schema": schema}}, 0)
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "$ref" in e.value.body["message"] and "256 levels" in e.value.body["message"], e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # the same bound on a raw grammar
        oa.completions.create(model=MODEL, prompt="x", max_tokens=2,
                              extra_body={"fathom": {"grammar": "root ::= " + "(" * 5000 + '"a"' + ")" * 5000}})
    assert "parentheses" in e.value.body["message"]
    r = ask(oa, {"type": "json_object"}, 0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("extra", [
    {"guided_json": SCHEMA},                       # vLLM
    {"structured_outputs": {"json": json.dumps(SCHEMA)}},  # vLLM >= 0.10, the schema as text
    {"json_schema": SCHEMA},                       # llama.cpp's server
])
def test_peers_spellings_of_a_json_schema_constrain_the_output(oa, extra):
    r = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
                                   temperature=1.0, seed=3, max_tokens=160, extra_body=extra)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_a_peers_grammar_and_a_second_constraint(oa):
    r = oa.completions.create(model=MODEL, prompt="Answer:", max_tokens=8, extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                   response_format={"type": "json_object"}, extra_body={"guided_grammar": 'root ::= "a"'})
    assert e.value.body["param"] == "guided_grammar"
