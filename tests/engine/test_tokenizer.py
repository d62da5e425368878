"""The tokenizer read without transformers gives transformers' results, and everything it does not
read exactly goes through transformers."""

from __future__ import annotations

import json
import shutil

import jinja2
import pytest
from transformers import AutoTokenizer

from chatpage.engine.load.loader import _read_tokenizer
from chatpage.engine.text.chat_template import render_prompt
from chatpage.engine.text.tokenizer import Tokenizer, read_plain

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Ünïcode, <b>tags</b> and  spaces\n\tok? 🙂"},
        {"role": "assistant", "content": " A reply\n\n  with <|im_end|> typed in it."},
        {"role": "user", "content": ""},
    ],
]
TEXTS = [
    "hello there",
    "  leading spaces and trailing  ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "日本語のテキスト and émojis 🙂🙃",
    "tabs\tand\r\nnewlines\n\n\n",
    "x" * 300,
]

# every extra a chat template may use, and Jinja's whitespace options
FEATURES = """{{ bos_token }}{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m.role == 'skip' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    {{ m.role }}={{ m | tojson }}|{{ m | tojson(indent=2, sort_keys=true) }}
    {% if loop.index > 3 %}{% break %}{% endif %}
{% endfor %}
{{ ns.n }} {{ strftime_now('%Y') }}{% if add_generation_prompt %} go{% endif %}{{ eos_token }}"""


@pytest.fixture(scope="module")
def pair(default_model_dir):
    return _read_tokenizer(default_model_dir), AutoTokenizer.from_pretrained(default_model_dir)


def test_the_default_model_is_read_without_transformers(pair):
    assert isinstance(pair[0], Tokenizer)


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_templates_render_as_transformers_renders_them(pair, messages, generation_prompt):
    ours, theirs = pair
    kw = {"add_generation_prompt": generation_prompt}
    assert ours.apply_chat_template(messages, tokenize=False, **kw) == theirs.apply_chat_template(
        messages, tokenize=False, **kw
    )
    assert render_prompt(ours, messages, generation_prompt) == render_prompt(
        theirs, messages, generation_prompt
    )


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_and_decoding_match_transformers(pair, text):
    ours, theirs = pair
    for special in (True, False):
        ids = theirs.encode(text, add_special_tokens=special)
        assert ours.encode(text, add_special_tokens=special) == ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            )


def test_special_token_ids_match_transformers(pair):
    ours, theirs = pair
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.eos_token_id is not None


def test_every_template_extra_renders_as_in_transformers(pair):
    ours, theirs = pair
    messages = [
        {"role": "user", "content": 'ö <tag> & "q"'},
        {"role": "skip", "content": "-"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "user", "content": "never"},
    ]
    saved = ours.chat_template, theirs.chat_template  # the module's pair is shared
    ours.chat_template = theirs.chat_template = FEATURES
    try:
        for generation_prompt in (True, False):
            text = ours.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
            assert text == theirs.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
            assert "never" not in text and "<tag>" in text  # break worked; no HTML escaping
        assert ours.apply_chat_template(messages) == ours.encode(
            ours.apply_chat_template(messages, tokenize=False), add_special_tokens=False
        )
        ours.chat_template = "{{ raise_exception('only user turns, please') }}"
        with pytest.raises(jinja2.TemplateError, match="only user turns, please"):
            ours.apply_chat_template(messages, tokenize=False)
    finally:
        ours.chat_template, theirs.chat_template = saved


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{% set _ = messages.append({'role': 'user', 'content': 'injected'}) %}",
    ],
)
def test_templates_run_sandboxed(pair, template):
    ours = Tokenizer(pair[0]._backend, pair[0].special_tokens, template)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(jinja2.exceptions.SecurityError):
        ours.apply_chat_template(messages, tokenize=False)
    assert messages == [{"role": "user", "content": "hi"}]


def _copy(default_model_dir, tmp_path, config_changes=None):
    d = tmp_path / "m"
    shutil.copytree(default_model_dir, d, ignore=shutil.ignore_patterns("*.safetensors", "packed"))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.update(config_changes or {})
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    ("config_changes", "files"),
    [
        ({"tokenizer_class": "GPT2Tokenizer"}, None),
        ({"clean_up_tokenization_spaces": True}, None),
        (None, {"special_tokens_map.json": json.dumps({"eos_token": "<|im_end|>"})}),
        (
            None,
            {"chat_template.jinja": "{% generation %}{{ messages[0].content }}{% endgeneration %}"},
        ),
        (
            {"chat_template": [{"name": "default", "template": "{{ messages[0].content }}"}]},
            {"chat_template.jinja": None},
        ),
    ],
    ids=["named-class", "clean-up", "special-tokens-map", "generation-tag", "named-templates"],
)
def test_what_is_not_read_exactly_goes_through_transformers(
    default_model_dir, tmp_path, config_changes, files
):
    d = _copy(default_model_dir, tmp_path, config_changes)
    for name, text in (files or {}).items():
        if text is None:
            (d / name).unlink()
        else:
            (d / name).write_text(text)
    assert read_plain(d) is None
    tok = _read_tokenizer(d)
    assert not isinstance(tok, Tokenizer)
    assert tok.encode("hello there", add_special_tokens=False) == _read_tokenizer(
        default_model_dir
    ).encode("hello there", add_special_tokens=False)


def test_a_template_in_tokenizer_config_is_read(default_model_dir, tmp_path):
    template = (default_model_dir / "chat_template.jinja").read_text()
    d = _copy(default_model_dir, tmp_path, {"chat_template": template})
    (d / "chat_template.jinja").unlink()
    tok = read_plain(d)
    assert isinstance(tok, Tokenizer) and tok.chat_template == template
    messages = CONVERSATIONS[1]
    assert tok.apply_chat_template(messages, tokenize=False) == AutoTokenizer.from_pretrained(
        d
    ).apply_chat_template(messages, tokenize=False)


def test_a_plain_tokenizer_saves_what_it_reads_back(default_model_dir, tmp_path):
    from chatpage.engine.text.tokenizer import read_plain

    tok = read_plain(default_model_dir)
    tok.save_pretrained(tmp_path)
    again = read_plain(tmp_path)
    text = "Hello <|im_start|>world"
    assert again.encode(text) == tok.encode(text)
    assert again.special_tokens == tok.special_tokens
    assert again.chat_template == tok.chat_template
