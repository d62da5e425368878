"""SessionHeader: the persona, the prefix-cache share of the last prompt, the context meter
(``used / context`` tokens), the sampling settings."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from chatpage.chat.session import ChatSession
from chatpage.ui.text import clean, one_line
from chatpage.ui.widgets.throttle import Throttled


def cache_line(session: ChatSession) -> str:
    stats = session.last_stats()
    if stats is None:
        return "prefix cache: no reply yet"
    share = stats.prefix_hit_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    return (
        f"prefix cache: {stats.prefix_hit_tokens} of {stats.prompt_tokens} prompt tokens "
        f"({share:.0%}) came from the shared cache"
    )


def context_line(session: ChatSession) -> str:
    """``context 412 / 2048 tokens``, and how many messages are left out to fit it."""
    if not session.context_tokens:
        return "context: known once the model is loaded"
    line = f"context {session.used_tokens} / {session.context_tokens} tokens"
    dropped = sum(e.dropped for e in session.entries)
    if dropped:
        line += f" · {dropped} older message{'s' if dropped != 1 else ''} left out (greyed)"
    return line


class SessionHeader(Throttled, Static):
    """One session's header; `refresh_session` redraws it (`request_redraw` while a reply
    streams: the context meter follows it)."""

    def __init__(self, session: ChatSession, **kwargs) -> None:
        super().__init__(**kwargs)
        self.session = session

    def on_mount(self) -> None:
        self.refresh_session()

    def redraw(self) -> None:
        self.refresh_session()

    def refresh_session(self) -> None:
        s = self.session
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(one_line(s.persona.name, 40), "bold")
        text.append(f"  {one_line(s.persona.description, 80)}", "italic")
        text.append(f"\n{context_line(s)} · {cache_line(s)}")
        text.append(f"\n{s.sampling.describe()} · next reply: {s.alt_mode.describe()}")
        if s.streaming:
            text.append("\ngenerating… (esc stops)", "bold")
        elif s.choosing and s.generation is not None:
            text.append(
                f"\nchoose an alternative: 1-{len(s.generation.candidates)}, a click, or /keep N",
                "bold",
            )
        self.update(text)
        self.set_class(s.streaming, "-streaming")
        self.tooltip = clean(s.persona.system_prompt)
