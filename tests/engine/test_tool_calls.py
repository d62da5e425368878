"""Tool-call formats per model family: picked from the chat template, parsed whole and streamed
alike, the history and the tools rendered the template's way, and the forcing grammar valid."""

from __future__ import annotations

import json

import pytest

from chatpage.engine.accumulator import add_tool_calls
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.grammar import grammar_text
from chatpage.engine.text.tokenizer import compile_template
from chatpage.engine.text.tool_calls import HERMES, LLAMA3, MISTRAL, ToolFormat, tool_format

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
    },
}
REPLIES = {
    HERMES: 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>',
    LLAMA3: '<|python_tag|>{"name": "add", "parameters": {"a": 1}}',
    MISTRAL: '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, '
    '{"name": "add", "arguments": {"a": 2}}]',
}


@pytest.mark.parametrize(
    ("template", "family", "renders"),
    [
        ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>", HERMES, True),
        ("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", MISTRAL, True),
        ("<|start_header_id|>{% if tools %}{{ tools }}{% endif %}<|eom_id|>", LLAMA3, True),
        ("<|im_start|>{{ messages }}", HERMES, False),
        (None, HERMES, False),
    ],
)
def test_the_family_comes_from_the_template(template, family, renders):
    fmt = tool_format(template)
    assert (fmt.family, fmt.renders_tools) == (family, renders)
    assert fmt.family in fmt.describe()


@pytest.mark.parametrize("family", [HERMES, LLAMA3, MISTRAL])
def test_whole_and_streamed_parses_agree(family):
    fmt = ToolFormat(family)
    text = REPLIES[family]
    content, calls = fmt.parse(text)
    assert [c.name for c in calls] == ["add"] * len(calls) and calls
    assert json.loads(calls[0].arguments) == {"a": 1}
    assert content == ("Let me add." if family == HERMES else "")
    for step in (1, 5, 17):
        stream = fmt.stream()
        pieces = [stream.feed(text[i : i + step]) for i in range(0, len(text), step)]
        pieces.append(stream.feed("", final=True))
        streamed = add_tool_calls([], [d for _, ds in pieces for d in ds])
        assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in calls]
        assert "".join(p for p, _ in pieces) == content
        if step == 1:  # the arguments grow piece by piece, each call's id and name come first
            first = [ds[0] for _, ds in pieces if ds and ds[0].id]
            assert [d.name for d in first] == ["add"] * len(calls)
            assert sum(len(ds) for _, ds in pieces) > 2 * len(calls)


def test_text_that_is_no_call_stays_content():
    for family in (HERMES, LLAMA3, MISTRAL):
        fmt = ToolFormat(family)
        for text in ("Paris is sunny.", "<tool_call>not json</tool_call>", "{broken"):
            stream = fmt.stream()
            content, calls = stream.feed(text)
            rest, more = stream.feed("", final=True)
            assert calls == more == () and content + rest == text
            assert fmt.parse(text) == (text, [])


def test_history_goes_to_a_template_that_renders_tools_with_arguments_as_objects():
    template = (
        "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %} CALL {{ c.function.arguments.a }}"
        "{% endfor %}\n{% endfor %}<tool_call>"
    )
    fmt = tool_format(template)
    history = [
        {"role": "user", "content": "add 1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 7}'},
                }
            ],
        },
        {"role": "tool", "content": "8", "tool_call_id": "c"},
    ]
    text = compile_template(template).render(
        messages=fmt.prompt_messages(history, [ADD]), tools=[ADD]
    )
    assert "TOOL add" in text and "CALL 7" in text and "tool: 8" in text


def test_a_template_without_tools_gets_them_in_the_system_prompt():
    fmt = tool_format("{{ messages }}")
    history = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 7}'},
                }
            ],
        },
        {"role": "tool", "content": "8", "tool_call_id": "c"},
    ]
    out = fmt.prompt_messages(history, [ADD])
    assert out[0]["content"].startswith("Be brief.") and '"name": "add"' in out[0]["content"]
    assert out[1]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 7}}\n</tool_call>'
    assert out[2] == {"role": "user", "content": "<tool_response>\n8\n</tool_response>"}


@pytest.mark.parametrize("family", [HERMES, LLAMA3, MISTRAL])
@pytest.mark.parametrize("parallel", [True, False])
def test_forcing_grammars_compile(family, parallel):
    grammar = ToolFormat(family).grammar(
        [ADD, {**ADD, "function": {**ADD["function"], "name": "sub"}}], parallel, lambda _text: 7
    )
    assert grammar_text(Structured(GrammarKind.GRAMMAR, grammar))
