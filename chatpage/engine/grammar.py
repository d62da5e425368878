"""Grammars for constrained decoding, over llguidance: a `Structured` spec compiles once per
distinct spec (per tokenizer) into a template matcher; every sequence that follows it gets its
own copy (`GrammarMatcher`), which forks with the sequence (n samples, beams).

Why llguidance and not xgrammar: both have CPU paths, but xgrammar pulls triton and
apache-tvm-ffi into the environment (`pip install --dry-run xgrammar`); llguidance is one
3 MB wheel with no dependencies, reads a `tokenizers` JSON directly, compiles a JSON schema in
about a millisecond and computes 32 rows' masks in about a millisecond on this CPU (`chatpage
bench structured`). Its Lark dialect embeds JSON schemas (``%json {...}``), which tool calls use.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from chatpage.engine.sampling_params import GrammarKind, Structured

if TYPE_CHECKING:  # imported on first use: ~0.3 s that a start without grammars does not pay
    import llguidance
    from llguidance._lib import JsonCompileOptions

COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
"""JSON written as `json.dumps` writes it: a small model cannot wander off in whitespace."""
CACHE_SIZE = 64
"""Distinct grammars kept compiled."""


def grammar_text(spec: Structured) -> str:
    """``spec`` as an llguidance grammar; ValueError names what is wrong with it (found
    without a tokenizer: the schema's, the regex's or the grammar's own errors)."""
    import llguidance

    match spec.kind:
        case GrammarKind.JSON_SCHEMA | GrammarKind.JSON_OBJECT:
            schema: Any = (
                {"type": "object"}
                if spec.kind is GrammarKind.JSON_OBJECT
                else json.loads(spec.spec)
            )
            text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)
        case GrammarKind.REGEX:
            text = llguidance.LLMatcher.grammar_from_regex(spec.spec)
        case GrammarKind.CHOICE:
            choices = json.loads(spec.spec)
            if (
                not isinstance(choices, list)
                or not choices
                or not all(isinstance(c, str) for c in choices)
            ):
                raise ValueError("a choice grammar needs a non-empty list of strings")
            text = llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in choices)
            )
        case GrammarKind.GRAMMAR:
            text = llguidance.grammar_from("grammar", spec.spec)
    error = llguidance.LLMatcher.validate_grammar(text)
    if error:
        raise ValueError(f"the {spec.kind} does not compile: {error.strip()}")
    return text


class GrammarMatcher:
    """One sequence's place in its grammar."""

    __slots__ = ("_m",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    @property
    def raw(self) -> llguidance.LLMatcher:
        return self._m

    def fork(self) -> GrammarMatcher:
        """An independent copy at the same place (a forked sequence's)."""
        return GrammarMatcher(self._m.deep_copy())

    def advance(self, token: int) -> None:
        """The sequence took ``token`` (one the mask allowed; any other puts it in `error`)."""
        self._m.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more."""
        return self._m.is_stopped()

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None


class Grammars:
    """The grammars of one tokenizer: compiled once per distinct spec, a matcher per use."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._ll: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[Structured, llguidance.LLMatcher] = OrderedDict()
        self.compiles = 0  # grammars compiled so far (cache misses)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary (built on first use: ~0.7 s for 49k tokens)."""
        if self._ll is None:
            import llguidance

            backend = self._tokenizer.backend_tokenizer
            self._ll = llguidance.LLTokenizer(
                backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos
            )
        return self._ll

    def matcher(self, spec: Structured) -> GrammarMatcher:
        """A fresh matcher at the start of ``spec``; ValueError when it does not compile."""
        template = self._compiled.get(spec)
        if template is None:
            import llguidance

            template = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
            if template.is_error():
                raise ValueError(f"the {spec.kind} does not compile: {template.get_error()}")
            self.compiles += 1
            self._compiled[spec] = template
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(spec)
        return GrammarMatcher(template.deep_copy())
