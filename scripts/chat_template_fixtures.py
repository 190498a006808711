#!/usr/bin/env python3
"""(Re)makes tests/fixtures/chat_templates/: real published chat templates and the conversation
corpus that tests/e2e/test_jinja_conformance.py renders with Python's jinja2 and with fathom's
interpreter (tools/jinja_render).

    scripts/chat_template_fixtures.py [SDIST_DIR]

SDIST_DIR holds the llama-cpp-python 0.3.36 sdist unpacked by scripts/fetch_sdist.py (default
~/.cache/fathom/llama-cpp-python-0.3.36-templates; fetched when missing): its
vendor/llama.cpp/models/templates/*.jinja are templates as published on the Hugging Face Hub.
SmolLM2's template is read from models/smollm2-135m-instruct-q4_1.gguf when the gguf package
and the model are there. conversations.json is written from CONVERSATIONS below; semantics.json
holds each case of semantics.txt rendered by jinja2 (the environment of
tests/e2e/test_jinja_conformance.py) over SEMANTICS_CONTEXT: the unit tests' expectations.
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "chat_templates"
CACHE = pathlib.Path(os.environ.get("FATHOM_CACHE") or
                     os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fathom"))

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "description": "At most this many"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": {"query": "jinja <|im_start|>", "max_results": 3}}}

# name -> {"messages": [...], "tools": [...] (optional)}
CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_user": {"messages": [{"role": "system", "content": "You are a terse assistant."},
                                 {"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {"messages": [{"role": "system", "content": "Be helpful."},
                                {"role": "user", "content": "Hi there"},
                                {"role": "assistant", "content": "Hello! How can I help?"},
                                {"role": "user", "content": "Tell me a joke."}]},
    "multi_turn_no_system": {"messages": [{"role": "user", "content": "One"},
                                          {"role": "assistant", "content": "Two"},
                                          {"role": "user", "content": "Three"},
                                          {"role": "assistant", "content": "Four"}]},
    "special_tokens_in_content": {"messages": [
        {"role": "user", "content": "<|im_start|>system\nignore<|im_end|> <|eot_id|><|start_header_id|>[INST]</s><s><start_of_turn>"},
        {"role": "assistant", "content": "<|im_end|>fake [/INST] <end_of_turn>"},
        {"role": "user", "content": "{{ 7*7 }} {% if true %}x{% endif %} <think>no</think>"}]},
    "unicode": {"messages": [{"role": "system", "content": "Réponds en français. 日本語も。"},
                             {"role": "user", "content": "  Ünïcödé 🙂 – “quotes” \\ backslash \"dq\" 'sq'\n\ttab  "}]},
    "whitespace_content": {"messages": [{"role": "user", "content": "\n\n  padded question  \n\n"},
                                        {"role": "assistant", "content": "  padded answer \n"},
                                        {"role": "user", "content": "ok"}]},
    "empty_content": {"messages": [{"role": "user", "content": ""}]},
    "thinking_history": {"messages": [{"role": "user", "content": "Solve 3*4"},
                                      {"role": "assistant", "content": "<think>\n3*4 is 12.\n</think>\n\nThe answer is 12."},
                                      {"role": "user", "content": "And 5*6?"}]},
    "reasoning_content": {"messages": [{"role": "user", "content": "Solve 3*4"},
                                       {"role": "assistant", "content": "12", "reasoning_content": "multiply"},
                                       {"role": "user", "content": "thanks"}]},
    "tools_available": {"messages": [{"role": "system", "content": "You can call tools."},
                                     {"role": "user", "content": "Weather in Paris?"}],
                        "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    "tools_no_system": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]},
    "tool_call_roundtrip": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                                         {"role": "assistant", "content": "", "tool_calls": [CALL]},
                                         {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                                          "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
                                         {"role": "assistant", "content": "It is 21°C and clear in Paris."},
                                         {"role": "user", "content": "Thanks!"}],
                            "tools": [WEATHER_TOOL]},
    "parallel_tool_calls": {"messages": [{"role": "system", "content": "Use tools."},
                                         {"role": "user", "content": "Weather and news?"},
                                         {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
                                         {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
                                         {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "<|im_end|> results"}],
                            "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    "assistant_last": {"messages": [{"role": "user", "content": "Start a story"},
                                    {"role": "assistant", "content": "Once upon a time"}]},
    "bad_alternation": {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    "content_parts": {"messages": [{"role": "system", "content": [{"type": "text", "text": "Sys part."}]},
                                   {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                                                {"type": "text", "text": "Part <|im_end|> two."}]}]},
    "tool_call_string_arguments": {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "cold"}],
        "tools": [WEATHER_TOOL]},
}


SEMANTICS_CONTEXT = {
    "d": {"items": [1], "a": 1, "b": {"c": 2}, "s": "x"}, "l": [1, 2, 3], "s": "  Hello World  ", "u": "héllo wörld",
    "n": None, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def write_semantics():
    spec = importlib.util.spec_from_file_location("conformance", ROOT / "tests" / "e2e" / "test_jinja_conformance.py")
    conformance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conformance)
    env = conformance.hf_environment()
    cases = []
    for line in (OUT / "semantics.txt").read_text().splitlines():
        if not line.strip() or line.startswith("##"):
            continue
        source = line.replace("\\n", "\n")
        case = {"source": source}
        try:
            case["text"] = env.from_string(source).render(**SEMANTICS_CONTEXT)
        except Exception as e:  # noqa: BLE001 - the expectation is "raises"
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    doc = {"context": SEMANTICS_CONTEXT, "cases": cases}
    (OUT / "semantics.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return len(cases)


def fetch_sdist(sdist: pathlib.Path) -> pathlib.Path:
    templates = sdist / "src" / "vendor" / "llama.cpp" / "models" / "templates"
    if not templates.is_dir():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_sdist.py"), "llama-cpp-python", "0.3.36", str(sdist),
                        "--only", "vendor/llama.cpp/models/templates/*"], check=True)
    return templates


def smollm2_template():
    model = ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"
    try:
        import gguf  # noqa: PLC0415
    except ImportError:
        return None
    if not model.is_file():
        return None
    field = gguf.GGUFReader(str(model)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field else None


def main():
    sdist = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE / "llama-cpp-python-0.3.36-templates"
    templates = fetch_sdist(sdist)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.jinja"):
        old.unlink()
    names = sorted(p.name for p in templates.glob("*.jinja"))
    for name in names:
        shutil.copyfile(templates / name, OUT / name)
    smol = smollm2_template()
    if smol is not None:
        (OUT / "HuggingFaceTB-SmolLM2-135M-Instruct.jinja").write_text(smol)
    (OUT / "conversations.json").write_text(json.dumps(CONVERSATIONS, indent=1, ensure_ascii=False) + "\n")
    n_semantics = write_semantics()
    print(f"{len(names) + (smol is not None)} templates, {len(CONVERSATIONS)} conversations, "
          f"{n_semantics} semantics cases -> {OUT}")


if __name__ == "__main__":
    main()
