"""Grammars for constrained decoding, over llguidance: a `Structured` spec compiles once per
distinct spec (per tokenizer) into a template matcher; every sequence that follows it gets its
own copy (`GrammarMatcher`), which forks with the sequence (n samples, beams).

Why llguidance and not xgrammar: both have CPU paths, but xgrammar pulls triton and
apache-tvm-ffi into the environment (`pip install --dry-run xgrammar`); llguidance is one
3 MB wheel with no dependencies, reads a `tokenizers` JSON directly, compiles a JSON schema in
about a millisecond and computes 32 rows' masks in about a millisecond on this CPU (`chatpage
bench structured`). Its Lark dialect embeds JSON schemas (``%json {...}``), which tool calls use.

A compile takes time that grows faster than the spec (10,000 properties: ~9 s), so it never runs
on a thread that others wait on: `Grammars.compile` runs it on a grammar thread of its own
(llguidance drops the GIL while it builds), once per distinct spec, and those who need it wait
at most `COMPILE_TIMEOUT_S` (`chatpage serve` before it answers, `LocalEngineClient` before it
hands the request to the engine thread). Specs are bounded (`MAX_SPEC_CHARS`, checked before
anything is parsed) so that a compile nobody waits for any more ends soon too.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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
MAX_SPEC_CHARS = 64 << 10
"""The longest spec a request may give (a schema as JSON text, a regex, a grammar, a choice
list; a request's tool schemas together): ~2,000 properties, compiled in about 0.4 s."""
MAX_GRAMMAR_CHARS = 2 * MAX_SPEC_CHARS
"""The longest grammar compiled (a tool call's grammar wraps its tools' schemas)."""
COMPILE_TIMEOUT_S = 10.0
"""How long a request waits for its grammar to compile before it is refused."""
COMPILE_THREADS = 2


def too_slow(spec: Structured) -> ValueError:
    """The error of a grammar that did not compile within `COMPILE_TIMEOUT_S`."""
    return ValueError(
        f"the {spec.kind} did not compile within {COMPILE_TIMEOUT_S:g} s; make it smaller or "
        "simpler"
    )


def grammar_text(spec: Structured) -> str:
    """``spec`` as an llguidance grammar; ValueError names what is wrong with it (found
    without a tokenizer: the schema's, the regex's or the grammar's own errors)."""
    import llguidance

    if len(spec.spec) > MAX_GRAMMAR_CHARS:
        raise ValueError(
            f"the {spec.kind} is {len(spec.spec)} characters; at most {MAX_GRAMMAR_CHARS} are "
            "compiled"
        )
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

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order from here, the grammar allows (it stays here)."""
        return self._m.validate_tokens(tokens)

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here on (none where it leaves a choice)."""
        return self._m.compute_ff_tokens()

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
    """The grammars of one tokenizer: compiled once per distinct spec, on the grammar threads
    (`compile`, from any thread), a matcher per use."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._ll: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[Structured, Future[llguidance.LLMatcher]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self.compiles = 0  # grammars compiled so far (cache misses)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary (built on first use: ~0.7 s for 49k tokens)."""
        with self._lock:
            if self._ll is None:
                import llguidance

                backend = self._tokenizer.backend_tokenizer
                self._ll = llguidance.LLTokenizer(
                    backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos
                )
            return self._ll

    def compile(self, spec: Structured) -> Future[llguidance.LLMatcher]:
        """``spec`` compiled, or being compiled on a grammar thread: its future fails with
        ValueError when it does not compile."""
        with self._lock:
            future = self._compiled.get(spec)
            if future is not None and not future.cancelled():
                self._compiled.move_to_end(spec)
                return future
            if self._pool is None:
                self._pool = ThreadPoolExecutor(COMPILE_THREADS, "chatpage-grammar")
            future = self._pool.submit(self._build, spec)
            self.compiles += 1
            self._compiled[spec] = future
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
            return future

    def _build(self, spec: Structured) -> llguidance.LLMatcher:
        import llguidance

        template = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        if template.is_error():
            raise ValueError(f"the {spec.kind} does not compile: {template.get_error()}")
        return template

    def wait(self, spec: Structured, timeout: float = COMPILE_TIMEOUT_S) -> llguidance.LLMatcher:
        """``spec`` compiled, waiting at most ``timeout`` s for it; ValueError when it does
        not compile, or not in time (`too_slow`)."""
        future = self.compile(spec)
        try:
            return future.result(timeout)
        except (FutureTimeout, CancelledError):
            future.cancel()  # (still queued: nobody waits for it any more)
            raise too_slow(spec) from None

    def matcher(self, spec: Structured) -> GrammarMatcher:
        """A fresh matcher at the start of ``spec`` (`wait` says when it fails)."""
        return GrammarMatcher(self.wait(spec).deep_copy())
