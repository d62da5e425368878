"""One table of sampling rules: SamplingParams, persona files, the chat's settings and `ask`'s
flags agree with it and with each other."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from helpers import PERSONA

from chatpage.chat.sampling import SETTINGS, SamplingSettings
from chatpage.cli.ask import FLAGS, _params
from chatpage.cli.main import build_parser
from chatpage.config.personas import SAMPLING_KEYS, Persona, parse_persona
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import RULE_BY_FIELD, SAMPLING_RULES

# typed values, the kind a persona file or a program gives; None = "off"
CANDIDATES = [
    None,
    -3,
    -1,
    -0.5,
    0,
    0.0,
    0.5,
    1,
    1.0,
    1.5,
    2,
    7,
    2**40,
    float("inf"),
    float("nan"),
    True,
    [1],
]


def accepted_by_params(name: str, value: object) -> bool:
    try:
        SamplingParams(**{name: value})
    except (ValueError, TypeError):
        return False
    return True


def accepted_by_persona(name: str, value: object) -> bool:
    data = {"name": "x", "description": "d", "system_prompt": "p", name: value}
    try:
        persona = parse_persona(data, Path("x.yaml"))
    except ValueError:
        return False
    return value is None or getattr(persona, name) is not None


def accepted_by_settings(name: str, value: object) -> bool:
    try:
        SamplingSettings().with_value(name, value).params()
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("rule", SAMPLING_RULES, ids=lambda r: r.field)
def test_params_check_every_field_by_its_rule(rule) -> None:
    for value in [*CANDIDATES, (), ("x",), ("",), (3,), (-1,), ["a", "b"], "x"]:
        if rule.field == "stop" and value == "x":
            continue  # one stop string is a list of one
        accepted = accepted_by_params(rule.field, value)
        if rule.field == "logprobs" and isinstance(value, bool):
            assert accepted  # vLLM's flags: True = 0, False = None
        else:
            assert accepted == rule.ok(value), (rule.field, value)


def test_the_table_is_every_field_and_default_of_params_settings_personas_and_flags() -> None:
    # (a grammar and a logit bias are structures, checked by SamplingParams itself; the
    # speculation switch and its draft sources are a request's own: /spec, a persona's
    # speculate, a regenerate's earlier replies)
    outside = ("structured", "logit_bias", "speculate", "draft_source")
    assert [f.name for f in fields(SamplingParams) if f.name not in outside] == [
        r.field for r in SAMPLING_RULES
    ]
    params = SamplingParams()
    for rule in SAMPLING_RULES:
        default = getattr(params, rule.field)
        assert default == (list(rule.default) if rule.kind is tuple else rule.default)
    assert [f.name for f in fields(SamplingSettings)] == [r.field for r in SETTINGS]
    assert SamplingSettings() == SamplingSettings(**{r.field: r.for_chat for r in SETTINGS})
    assert SAMPLING_KEYS == tuple(r.field for r in SETTINGS)
    assert set(SAMPLING_KEYS) < {f.name for f in fields(Persona)}
    assert [r.cli for r in FLAGS] == [
        "--n",
        "--beam",
        "--temperature",
        "--top-p",
        "--max-tokens",
        "--seed",
    ]


def test_ask_takes_its_flags_then_the_persona_then_the_chat_defaults() -> None:
    args = build_parser().parse_args(["ask", "q", "--top-p", "0.5", "--seed", "3"])
    one = _params(args, {"top_p": 0.9, "temperature": 0.4, "top_k": 7})
    assert (one.top_p, one.seed, one.top_k, one.n) == (0.5, 3, 7, 1)
    assert one.temperature == 0 and one.max_tokens == RULE_BY_FIELD["max_tokens"].for_chat == 512
    samples = _params(build_parser().parse_args(["ask", "q", "--n", "2"]), {})
    assert samples.temperature == RULE_BY_FIELD["temperature"].for_chat and samples.n == 2


@pytest.mark.parametrize("rule", SETTINGS, ids=lambda r: r.field)
def test_params_personas_and_settings_agree(rule) -> None:
    for value in CANDIDATES:
        verdicts = {
            "SamplingParams": accepted_by_params(rule.field, value),
            "settings": accepted_by_settings(rule.field, value),
        }
        if value is not None:  # in a persona file, a missing value means "not set"
            verdicts["persona"] = accepted_by_persona(rule.field, value)
        assert len(set(verdicts.values())) == 1, (rule.field, value, verdicts)
        assert verdicts["SamplingParams"] == rule.ok(value)


def test_seeds_are_whole_numbers_from_zero_or_off() -> None:
    for accepted in (0, 7, 2**40):
        assert accepted_by_params("seed", accepted) and accepted_by_settings("seed", accepted)
        assert accepted_by_persona("seed", accepted)
    for refused in (-1, 1.5, True):
        assert not accepted_by_params("seed", refused)
        assert not accepted_by_settings("seed", refused)
        assert not accepted_by_persona("seed", refused)
    for off in ("off", "random", "", None):
        assert SamplingSettings().with_value("seed", off).seed is None
    assert SETTINGS == tuple(r for r in SAMPLING_RULES if r.slash)  # the settings screen's rows


def test_typed_settings_read_as_their_rule_says() -> None:
    s = SamplingSettings.for_persona(PERSONA)
    assert (s.temperature, s.max_tokens) == (0.5, 8)
    assert s.with_value("temperature", "0.9").temperature == 0.9
    assert s.with_value("seed", "off").seed is None
    assert s.with_value("seed", "42").seed == 42
    assert s.with_value("top_p", 1).top_p == 1.0 and isinstance(
        s.with_value("top_p", 1).top_p, float
    )
    with pytest.raises(
        ValueError,
        match=r"^temperature must be a number >= 0 \(0 = greedy\), "
        r"got '-1'$",
    ):
        s.with_value("temperature", "-1")
    with pytest.raises(ValueError, match="top-p must be a number > 0 and <= 1, got '2'"):
        s.with_value("top_p", "2")
    with pytest.raises(ValueError, match="max tokens must be a whole number >= 1, got 'lots'"):
        s.with_value("max_tokens", "lots")
    with pytest.raises(
        ValueError,
        match=r"seed must be a whole number >= 0, or 'off' for a "
        r"random one, got '-2'",
    ):
        s.with_value("seed", "-2")
    with pytest.raises(ValueError, match=r"SamplingParams.seed must be a whole number >= 0"):
        SamplingParams(seed=-2)
