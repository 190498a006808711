"""fathom's Jinja interpreter (base/jinja, through tools/jinja_render) against Python's jinja2
configured as Hugging Face's apply_chat_template configures it: every fixture template in
tests/fixtures/chat_templates/ x every conversation in conversations.json x generation prompt
on/off (and enable_thinking on/off where the template reads it) renders byte-identical text, or
both raise. One jinja_render process renders every case.
"""
import copy
import datetime
import json
import subprocess
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "chat_templates"
TEMPLATES = sorted(FIXTURES.glob("*.jinja"))
NOW = datetime.datetime(2024, 7, 26, 10, 11, 12)


# ---- the environment of transformers' _compile_jinja_template (transformers 5.x) ----
class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} renders its body (HF's AssistantTracker, untracked)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")


class TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def hf_environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def contexts(template_text):
    """(case name, context) for every conversation and variant, as apply_chat_template passes them."""
    conversations = json.loads((FIXTURES / "conversations.json").read_text())
    variants = [{"add_generation_prompt": True}, {"add_generation_prompt": False}]
    if "enable_thinking" in template_text:
        variants += [{"add_generation_prompt": True, "enable_thinking": False},
                     {"add_generation_prompt": True, "enable_thinking": True}]
    for name, conv in conversations.items():
        for v in variants:
            ctx = {"messages": conv["messages"], "tools": conv.get("tools"), "documents": None,
                   "bos_token": "<|bos|>", "eos_token": "<|eos|>", **v}
            yield f"{name}/{'+'.join(f'{k}={x}' for k, x in v.items())}", ctx


@pytest.fixture(scope="session")
def results(build_dir):
    """Every case rendered by both: {template name: [(case, python result, fathom result)]}."""
    tool = build_dir / "jinja_render"
    if not tool.is_file():
        pytest.fail(f"{tool} not found: build it (cmake --build {build_dir} --target jinja_render)", pytrace=False)
    env = hf_environment()
    cases, expected = [], []
    for path in TEMPLATES:
        text = path.read_text()
        try:
            compiled = env.from_string(text)
        except jinja2.TemplateError as e:
            compiled = e
        for case, ctx in contexts(text):
            if isinstance(compiled, Exception):
                py = ("error", f"{type(compiled).__name__}: {compiled}")
            else:
                try:
                    py = ("text", compiled.render(**ctx))
                except Exception as e:  # noqa: BLE001 - any failure of the template is a result
                    py = ("error", f"{type(e).__name__}: {e}")
            cases.append(json.dumps({"template": str(path), "context": ctx, "now": NOW.isoformat()}))
            expected.append((path.name, case, py))
    out = subprocess.run([str(tool)], input="\n".join(cases) + "\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases)
    by_template = {}
    for (name, case, py), line in zip(expected, lines):
        got = json.loads(line)
        ours = ("text", got["text"]) if "text" in got else ("error", got["error"])
        by_template.setdefault(name, []).append((case, py, ours))
    return by_template


@pytest.mark.parametrize("template", [p.name for p in TEMPLATES])
def test_template_matches_jinja2(results, template):
    rows = results[template]
    bad = [(case, py, ours) for case, py, ours in rows
           if not (py[0] == ours[0] == "error" or py == ours)]
    msg = "\n".join(f"{case}:\n  jinja2: {py!r:.600}\n  fathom: {ours!r:.600}" for case, py, ours in bad[:3])
    assert not bad, f"{len(bad)}/{len(rows)} cases differ:\n{msg}"


def test_pass_count(results):
    """The whole matrix, for the record (docs/jinja.md quotes it)."""
    total = sum(len(rows) for rows in results.values())
    same = sum(1 for rows in results.values() for _, py, ours in rows if py[0] == ours[0] == "error" or py == ours)
    texts = sum(1 for rows in results.values() for _, py, _ in rows if py[0] == "text")
    print(f"\njinja conformance: {same}/{total} cases identical ({texts} rendered text, {total - texts} raised in jinja2), "
          f"{len(results)} templates")
    assert same == total


# ---- random differential: whitespace control and expressions, fixed seeds ----
_TEXTS = ["", " ", "  ", "\n", "\n\n", " \n ", "a", "b ", "\t", " x\n", "\n  ", "\r\n", "y\n\t "]
_ATOMS = ["1", "0", "-3", "2.5", "0.1", "'ab'", "''", "' a b '", "'Ab,c'", "true", "false", "none", "x", "s", "n", "l",
          "d", "u", "[1, 'a']", "[]", "{'k': 1}", "(1, 2)", "undefined_v", "msgs[0]", "d.a", "l[1:]", "s[::-1]", "'é😀x'"]
_BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in", "**"]
_FILTERS = ["length", "upper", "lower", "trim", "string", "int", "float", "list", "first", "last", "join(',')", "tojson",
            "default('D')", "reverse|list", "sort|list", "unique|list", "abs", "round", "capitalize", "title", "items|list",
            "dictsort", "sum", "min", "max", "wordcount", "indent(2)", "replace('a','b')", "map('string')|list",
            "select|list", "batch(2)|list", "center(6)", "truncate(5)", "count", "tojson(indent=1)", "list|length",
            "selectattr('role')|list", "map(attribute='role')|list"]
_TESTS = ["defined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "boolean", "odd",
          "even", "divisibleby 2", "in l", "eq 1", "lower", "upper", "callable", "true", "false"]
_METHODS = [".upper()", ".strip()", ".split()", ".split(',')", ".startswith('a')", ".endswith('b')", ".replace('a', 'x')",
            ".title()", ".find('b')", ".count('a')", ".lstrip('a')", ".rstrip()", ".get('k')", ".keys()|list",
            ".values()|list", ".items()|list", "[0]", "[-1]", ".index(1)", ".isdigit()"]
_RANDOM_CONTEXT = {"x": 5, "s": " Hello, World ", "n": None, "l": [3, 1, 2], "d": {"a": 1, "b": "two"}, "u": "ünï",
                   "msgs": [{"role": "user", "content": "hi"}]}


def _random_expression(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice(_ATOMS)
    sub = lambda: _random_expression(rng, depth + 1)  # noqa: E731
    if r < 0.5:
        return f"({sub()} {rng.choice(_BINOPS)} {sub()})"
    if r < 0.65:
        return f"({sub()})|{rng.choice(_FILTERS)}"
    if r < 0.75:
        return f"({sub()} is {rng.choice(['', 'not '])}{rng.choice(_TESTS)})"
    if r < 0.85:
        return f"({sub()}){rng.choice(_METHODS)}"
    if r < 0.92:
        return f"({sub()} if {sub()} else {sub()})"
    return f"[{sub()}, {sub()}]"


def _random_layout(rng, depth=0):
    def tag(body, kind="%"):
        signs = ["", "-"] if kind == "{" else ["", "-", "+"]
        left, right = rng.choice(signs), rng.choice(signs)
        sp1, sp2 = rng.choice([" ", "", "  ", "\n"]), rng.choice([" ", "", "\n"])
        open_, close = {"{": ("{{", "}}"), "#": ("{#", "#}"), "%": ("{%", "%}")}[kind]
        return open_ + left + sp1 + body + sp2 + right + close
    out = []
    for _ in range(rng.randint(1, 5)):
        k = rng.random()
        out.append(rng.choice(_TEXTS))
        if k < 0.25:
            out.append(tag(rng.choice(["1", "x", "'s'", "l|length", "x ~ 'q'"]), "{"))
        elif k < 0.35:
            out.append(tag("comment", "#"))
        elif k < 0.55 and depth < 3:
            out.append(tag("if " + rng.choice(["true", "false", "x"])) + _random_layout(rng, depth + 1) +
                       (tag("else") + _random_layout(rng, depth + 1) if rng.random() < 0.5 else "") + tag("endif"))
        elif k < 0.7 and depth < 3:
            out.append(tag("for i in l") + _random_layout(rng, depth + 1) + tag("endfor"))
        elif k < 0.75:
            out.append(tag("raw") + rng.choice(_TEXTS) + "{{ y }}" + rng.choice(_TEXTS) + tag("endraw"))
        elif k < 0.85:
            out.append(tag("set z = " + rng.choice(["1", "'a'"])))
        out.append(rng.choice(_TEXTS))
    return "".join(out)


@pytest.mark.parametrize("kind", ["layout", "expression"])
def test_random_templates_match_jinja2(build_dir, kind):
    """600 random templates (seeded): whitespace control around tags, or expressions over the
    operators, filters, tests and methods chat templates use. Expressions built only of literals are
    skipped where jinja2's compile-time folding differs from its own run-time semantics (a failed
    constant subscript folds to Undefined), and printed generators/methods (Python prints addresses)."""
    import random
    rng = random.Random(47)
    env = hf_environment()
    make = (lambda: _random_layout(rng)) if kind == "layout" else (lambda: "{{ " + _random_expression(rng) + " }}")
    sources = [make() for _ in range(600)]
    ctx = {"x": "X", "l": [1, 2]} if kind == "layout" else _RANDOM_CONTEXT
    expected = []
    for src in sources:
        try:  # a fresh copy each time: jinja2's indent mutates a list it is given (list += str)
            expected.append(("text", env.from_string(src).render(**copy.deepcopy(ctx))))
        except Exception as e:  # noqa: BLE001
            expected.append(("error", f"{type(e).__name__}: {e}"))
    cases = "\n".join(json.dumps({"source": s, "context": ctx}) for s in sources) + "\n"
    out = subprocess.run([str(build_dir / "jinja_render")], input=cases, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    bad = []
    for src, py, line in zip(sources, expected, out.stdout.splitlines()):
        got = json.loads(line)
        ours = ("text", got["text"]) if "text" in got else ("error", got["error"])
        if py == ours or py[0] == ours[0] == "error":
            continue
        if py[0] == "text" and any(t in py[1] for t in ("<generator", " at 0x", "dict_items", "dict_keys", "dict_values")):
            continue
        bad.append(f"{src!r}\n  jinja2: {py!r:.300}\n  fathom: {ours!r:.300}")
    assert not bad, f"{len(bad)} of {len(sources)} differ:\n" + "\n".join(bad[:5])
