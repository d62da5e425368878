"""Fitting a turn into the model's context window.

Before a turn is sent, `fit` counts what it would take, plus room for the reply (max tokens):
exactly with the model's tokenizer and chat template where the client offers a `TokenCounter`
(each message's count kept on its entry, a reply sent as its own ids counted by them), else by
a cautious estimate from the text's length (a server's model). When that exceeds the window,
the oldest turns after the system prompt are left out of what is sent (marked `Entry.dropped`,
shown greyed, kept in the store) until it fits; the message being answered is never dropped.
The engine still counts exactly and refuses what cannot fit at all.

A tool's result is third-party text of any size: `bound_result` cuts it to what the context has
left for it (`result_room`), before it is shown, saved or sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import ceil
from typing import Any

from chatpage.chat.entry import Entry
from chatpage.engine.text.chat_template import TokenCounter

CHARS_PER_TOKEN_CAUTIOUS = 3
"""Fewer characters per token than most text has, so an estimate errs on the large side."""
MESSAGE_OVERHEAD = 8
"""Tokens a chat template adds around one message (role markers, separators), at most."""
TOOLS_PREAMBLE = 256
"""Tokens a chat template (or chatpage's own listing) writes around the tools it offers, at
most (chatpage's listing: ~80)."""
UNKNOWN_CONTEXT = 32768
"""The window a tool's result is bounded by where the model's is not known."""
CHARS_TRIED_PER_TOKEN = 4
"""Characters of a long result tokenized per token of room, at first (most text has fewer
per token, so that the cut is found in one or two counts of a bounded text)."""
TRUNCATED = "[truncated {} characters]"


def estimate_tokens(text: str) -> int:
    """A cautious token count of `text` (at least what most tokenizers make of it)."""
    return ceil(len(text) / CHARS_PER_TOKEN_CAUTIOUS)


def _tool_tokens(entry: Entry, counter: TokenCounter | None) -> int:
    """What a reply's tool rounds take: their text, calls and results (a cautious count:
    each as text, with a message's overhead)."""
    texts = [
        text
        for step in entry.steps
        for text in (step.text, *(r.name + r.arguments + r.for_model() for r in step.runs))
    ]
    count = counter.text if counter is not None else estimate_tokens
    return sum(count(t) + MESSAGE_OVERHEAD for t in texts)


def message_tokens(entry: Entry, counter: TokenCounter | None = None) -> int:
    """What `entry` takes in a prompt: exactly with `counter` (the count kept on the entry
    while its text stays), else a reply's count from the engine or an estimate; a reply's
    tool rounds on top."""
    return _text_tokens(entry, counter) + (_tool_tokens(entry, counter) if entry.steps else 0)


def _text_tokens(entry: Entry, counter: TokenCounter | None) -> int:
    if counter is None:
        if entry.role == "assistant" and entry.stats is not None and entry.stats.tokens:
            return entry.stats.tokens + MESSAGE_OVERHEAD
        return estimate_tokens(entry.model_content()) + MESSAGE_OVERHEAD
    overhead = counter.overhead[entry.role]
    if entry.token_ids is not None and entry.token_source == counter.key:
        return counter.reply(entry.token_ids) + overhead
    text = entry.model_content()
    kept = entry.token_count
    if kept is None or kept[:2] != (counter.key, hash(text)):
        kept = entry.token_count = (counter.key, hash(text), counter.text(text))
    return kept[2] + overhead


@dataclass(frozen=True)
class Fit:
    """The outcome of `fit`: how many messages were left out and the tokens then needed."""

    dropped: int
    needed: int

    def notice(self) -> str | None:
        """One line for the user when messages were left out."""
        if not self.dropped:
            return None
        noun = "message" if self.dropped == 1 else "messages"
        return (
            f"the chat is longer than the model's context: the oldest {self.dropped} "
            f"{noun} (greyed) are left out of what the model sees; they stay saved"
        )


def fit(
    system_prompt: str,
    path: list[Entry],
    reply_tokens: int,
    context_tokens: int,
    counter: TokenCounter | None = None,
) -> Fit:
    """Mark (`Entry.dropped`) the oldest whole turns of `path` that must be left out for it,
    the system prompt and `reply_tokens` to fit in `context_tokens` (0: unknown, drop
    nothing); unmark the rest. The last message is always kept. `counter`: count exactly."""
    sent = [e for e in path if e.in_context]
    for entry in path:
        entry.dropped = False
    system = (
        counter.system(system_prompt)
        if counter is not None
        else estimate_tokens(system_prompt) + MESSAGE_OVERHEAD
    )
    needed = system + reply_tokens + sum(message_tokens(e, counter) for e in sent)
    dropped = 0
    while context_tokens and needed > context_tokens and len(sent) > 1:
        # a whole turn: the oldest message and what answers it, never the last message
        turn = 1
        while turn < len(sent) - 1 and sent[turn].role != "user":
            turn += 1
        for entry in sent[:turn]:
            entry.dropped = True
            needed -= message_tokens(entry, counter)
        dropped += turn
        del sent[:turn]
    return Fit(dropped, needed)


def result_room(needed: int, context_tokens: int, tools: list[dict[str, Any]], waiting: int) -> int:
    """The tokens one tool result may take: what the window (``context_tokens``; 0: not
    known) has left after the prompt so far and the reply (``needed``, `Fit.needed`) and the
    ``tools`` offered (counted cautiously), shared among the ``waiting`` results of its step
    still to come."""
    tools_tokens = estimate_tokens(json.dumps(tools, ensure_ascii=False)) + TOOLS_PREAMBLE
    left = (context_tokens or UNKNOWN_CONTEXT) - needed - tools_tokens
    return max(0, left // max(1, waiting) - MESSAGE_OVERHEAD)


def bound_result(text: str, room: int, counter: TokenCounter | None = None) -> str:
    """``text`` (a tool's result) as it is if it takes at most ``room`` tokens, else cut to
    fit, ending with "[truncated N characters]"; counted exactly with ``counter``, else
    cautiously. No more than ``room`` x `CHARS_TRIED_PER_TOKEN` characters are ever counted."""
    count = counter.text if counter is not None else estimate_tokens
    keep = min(len(text), room * CHARS_TRIED_PER_TOKEN)
    while True:
        cut = text[:keep]
        if keep < len(text):
            marker = TRUNCATED.format(len(text) - keep)
            cut = f"{cut}\n{marker}" if cut else marker
        used = count(cut)
        if used <= room or not keep:
            return cut
        keep = min(keep - 1, keep * room * 9 // (used * 10))
