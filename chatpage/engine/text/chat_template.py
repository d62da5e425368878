"""The one place chat messages become prompt token ids (the tokenizer's chat template).

A reply the model wrote is best sent back as the token ids it sampled, not as its text tokenized
again: sampling can pick a split of the text that the tokenizer would not (" \\n\\n" as " \\n" and
"\\n", a character in two byte tokens...), and a prompt that re-tokenizes the reply differs from
what the cache holds from that token on, so the next turn computes the rest of the chat again.
`render_prompt` takes those ids (``reply_ids``) and uses them where the template writes the reply
verbatim; the prompt's text is always exactly the template's rendering.

A message's content is text, never turn markers: where it holds the text of a special token
(``<|im_end|>`` in a tool result or a pasted log), that text is tokenized as plain text, so a
message cannot forge a turn of another role. Contents without such text are tokenized with the
rest of the rendering, as transformers' ``apply_chat_template`` does.

The rendering is tokenized without the special tokens the tokenizer adds around a text (a BOS):
a chat template writes its own (``{{ bos_token }}``), as transformers does. `with_special_tokens`
adds them for a caller that asks (vLLM's ``add_special_tokens`` of a chat request).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ReplyIds = Mapping[int, Sequence[int]]
"""Index of a message (an assistant's reply) in the list given -> the token ids the model
produced for it."""


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """``messages`` through the tokenizer's chat template, as text; ``tools`` (OpenAI's
    function tools) are the template's ``tools`` variable, as transformers passes them;
    ``variables`` more of the template's own (Qwen3's ``enable_thinking``)."""
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        **(variables or {}),
    )
    if not isinstance(text, str):
        raise TypeError("apply_chat_template(tokenize=False) gave token ids, not text")
    return text


_SPECIAL_TEXTS: weakref.WeakKeyDictionary[Any, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def _special_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A pattern of the texts of ``tokenizer``'s special tokens (None: it has none)."""
    if tokenizer not in _SPECIAL_TEXTS:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
        if backend is not None:
            texts |= {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        ordered = sorted((t for t in texts if t), key=len, reverse=True)
        _SPECIAL_TEXTS[tokenizer] = (
            re.compile("|".join(map(re.escape, ordered))) if ordered else None
        )
    return _SPECIAL_TEXTS[tokenizer]


def plain_contents(tokenizer: Any, messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """The contents of ``messages`` that hold the text of a special token (to be tokenized as
    plain text)."""
    pattern = _special_pattern(tokenizer)
    if pattern is None:
        return []
    return [
        c
        for m in messages
        if isinstance(c := m.get("content"), str) and c and pattern.search(c) is not None
    ]


def _encode(tokenizer: Any, text: str, plain: Sequence[str] = ()) -> list[int]:
    """The ids of ``text`` (no special tokens added); where it holds one of the ``plain``
    strings (message contents), that string's special-token text is tokenized as text."""
    if not plain:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
        return ids
    pattern = re.compile("|".join(map(re.escape, sorted(set(plain), key=len, reverse=True))))
    ids = []
    done = 0
    for found in pattern.finditer(text):
        ids += tokenizer.encode(text[done : found.start()], add_special_tokens=False)
        ids += tokenizer.encode(found.group(), add_special_tokens=False, split_special_tokens=True)
        done = found.end()
    ids += tokenizer.encode(text[done:], add_special_tokens=False)
    return ids


def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a text when asked for special tokens
    (``tokenizer(text)``: a BOS for Gemma, Llama, Mistral...; none for ChatML models)."""
    probe = "a"
    bare = tokenizer.encode(probe, add_special_tokens=False)
    full: list[int] = tokenizer.encode(probe, add_special_tokens=True)
    for at in range(len(full) - len(bare) + 1):
        if full[at : at + len(bare)] == bare:
            return full[:at], full[at + len(bare) :]
    return [], []


def with_special_tokens(tokenizer: Any, ids: list[int]) -> list[int]:
    """``ids`` with the special tokens the tokenizer adds around a text, the way
    ``tokenizer.encode(text)`` adds them (a rendered chat then starts with two BOS where its
    template writes one too, as in transformers and vLLM)."""
    before, after = special_affixes(tokenizer)
    return before + ids + after


def _decode(tokenizer: Any, ids: Sequence[int]) -> str | None:
    """The text of ``ids``, special tokens included (None: not ids of this tokenizer)."""
    size = len(tokenizer)
    if not all(isinstance(i, int) and 0 <= i < size for i in ids):
        return None
    try:
        text: str = tokenizer.decode(list(ids), skip_special_tokens=False)
    except (OverflowError, TypeError, ValueError, IndexError):
        return None
    return text


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    reply_ids: ReplyIds | None = None,
    tools: list[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template (with ``tools`` and
    the template's ``variables``, as `render_text`); a reply in
    ``reply_ids`` is its own ids where the template renders the turn before it exactly as its
    prompt was and then the reply's text verbatim (else it is tokenized like the rest)."""
    text = render_text(tokenizer, messages, add_generation_prompt, tools, variables)
    plain = plain_contents(tokenizer, messages)
    if reply_ids:
        ids = _with_reply_ids(tokenizer, messages, text, reply_ids, plain, tools, variables)
        if ids is not None:
            return ids
    return _encode(tokenizer, text, plain)


def _with_reply_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    text: str,
    reply_ids: ReplyIds,
    plain: Sequence[str],
    tools: list[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[int] | None:
    """The ids of ``text``, each usable reply in ``reply_ids`` as its own ids and the text
    between them tokenized piece by piece: the piece before a reply is its prompt (rendered
    with the generation prompt), so a turn's prompt starts with the previous turn's prompt and
    reply, id for id. None when the ids do not decode to ``text``."""
    ids: list[int] = []
    done = 0  # how much of `text` `ids` covers
    for index in sorted(reply_ids):
        if not 0 < index < len(messages) or messages[index]["role"] != "assistant":
            continue
        before = render_text(tokenizer, messages[:index], tools=tools, variables=variables)
        reply = _decode(tokenizer, reply_ids[index])
        if (
            reply is None
            or len(before) < done
            or not text.startswith(before)
            or not text.startswith(reply, len(before))
        ):
            continue
        ids += _encode(tokenizer, text[done : len(before)], plain)
        ids += reply_ids[index]
        done = len(before) + len(reply)
    if not done:
        return None
    ids += _encode(tokenizer, text[done:], plain)
    return ids if _decode(tokenizer, ids) == text else None


def continue_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    reply_ids: ReplyIds | None = None,
    tools: list[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids that let the last message, a reply, go on: the conversation before it with
    the generation prompt (exactly as the reply was first asked for, so the prefix cache
    serves it), then the reply (its own ids when they are its text), left open (no
    end-of-turn)."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("only a reply (the last message, from the assistant) can be continued")
    last = len(messages) - 1
    own = (reply_ids or {}).get(last)
    head = render_prompt(
        tokenizer,
        messages[:-1],
        reply_ids={i: ids for i, ids in (reply_ids or {}).items() if i != last},
        tools=tools,
        variables=variables,
    )
    if own is not None and _decode(tokenizer, own) == messages[-1]["content"]:
        return head + list(own)
    return head + _encode(
        tokenizer, messages[-1]["content"], plain_contents(tokenizer, messages[-1:])
    )


def system_prefix(
    tokenizer: Any, system_prompt: str, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The tokens every conversation with this system prompt (offering ``tools``) starts with
    (a persona prefix)."""
    return render_prompt(
        tokenizer,
        [{"role": "system", "content": system_prompt}],
        add_generation_prompt=False,
        tools=tools,
    )


class TokenCounter:
    """Exact prompt sizes for one tokenizer's chat template, in parts that add up: the system
    prompt with the generation prompt (`system`), each message's content (`text`, or a reply's
    own ids: `reply`) and the tokens the template writes around a message of each role
    (`overhead`, measured once). Exact where the template puts special tokens or line breaks
    around each message (ChatML and most others); `key` names the tokenizer, for counts kept."""

    def __init__(self, tokenizer: Any, key: str) -> None:
        self.tokenizer = tokenizer
        self.key = key
        self._systems: dict[str, int] = {}
        system = [{"role": "system", "content": "S"}]
        user = system + [{"role": "user", "content": "U"}]
        both = user + [{"role": "assistant", "content": "A"}]
        sizes = [len(render_prompt(tokenizer, m)) for m in (system, user, both)]
        self.overhead = {
            "user": sizes[1] - sizes[0] - self.text("U"),
            "assistant": sizes[2] - sizes[1] - self.text("A"),
        }
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos = eos if isinstance(eos, int) else None

    def text(self, text: str) -> int:
        """The tokens of a message's content."""
        return len(
            _encode(self.tokenizer, text, plain_contents(self.tokenizer, [{"content": text}]))
        )

    def reply(self, ids: Sequence[int]) -> int:
        """The tokens of a reply sent as its own ids (an end-of-turn it ended with is the
        template's own, counted in `overhead`)."""
        return len(ids) - (bool(ids) and ids[-1] == self._eos)

    def system(self, system_prompt: str) -> int:
        """The system message and the generation prompt: a prompt with no other message."""
        if system_prompt not in self._systems:
            self._systems[system_prompt] = len(
                render_prompt(self.tokenizer, [{"role": "system", "content": system_prompt}])
            )
        return self._systems[system_prompt]
