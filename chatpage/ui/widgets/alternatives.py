"""AlternativesView: k panes side by side (samples, beams, or a /compare), one kept by 1..k or a click."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Static

from chatpage.chat.session import MAX_ALTERNATIVES, Candidate, Generation
from chatpage.engine.client import FinishReason, OutputDelta
from chatpage.ui.text import clean
from chatpage.ui.widgets.message import stats_line
from chatpage.ui.widgets.streaming_markdown import StreamingMarkdown
from chatpage.ui.widgets.thought import ThoughtFold
from chatpage.ui.widgets.throttle import Throttled
from chatpage.ui.widgets.typing import TypingGoesToTheBox


def score_text(kind: str, cand: Candidate) -> str:
    """The number that ranks a pane: the beam score, or the cumulative log-probability."""
    if cand.error:
        return "failed"
    if kind == "beam" and cand.score is not None:
        return f"score {cand.score:.3f}"
    return f"logprob {cand.cumulative_logprob:.2f}"


class AltPane(Throttled, Vertical):
    """One alternative."""

    def __init__(self, number: int, kind: str, candidate: Candidate) -> None:
        super().__init__(classes="alt-pane")
        self.number = number
        self.kind = kind
        self.candidate = candidate
        self._title_line = Static(classes="alt-title")
        self.thought = ThoughtFold(candidate)
        self._body = StreamingMarkdown(candidate.text, classes="alt-body")
        self._foot_line = Static(classes="alt-foot")
        self.redraw()

    def compose(self) -> ComposeResult:
        yield self._title_line
        yield self.thought
        yield self._body
        yield self._foot_line

    def _title(self) -> Text:
        title = Text(f"{self.number} ", style="bold reverse")
        title.append(f" {clean(self.candidate.label)}", style="bold")
        title.append(f"  {score_text(self.kind, self.candidate)}")
        return title

    def _foot(self) -> Text:
        if self.candidate.error:
            return Text(f"error: {clean(self.candidate.error)}")
        state = {FinishReason.ABORT: "stopped", None: "…"}.get(self.candidate.finish_reason, "done")
        return Text(f"{state} · {stats_line(self.candidate.stats)}")

    def refresh_candidate(self, delta: OutputDelta | None = None) -> None:
        """Redraw from the candidate (throttled while it streams); ``delta``: the text the
        engine added to it, or (a beam's rewrite) replaced it with."""
        if delta is not None:
            self._body.add(delta.text, delta.rewrite)
        self.request_redraw(final=self.candidate.finished)

    def redraw(self) -> None:
        self.set_class(self.candidate.finished, "-finished")
        self._title_line.update(self._title())
        self._foot_line.update(self._foot())
        self.thought.draw()
        self._body.draw()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        view = self.query_ancestor(AlternativesView)
        view.post_message(AlternativesView.Keep(view.session_id, self.number))


class AlternativesView(TypingGoesToTheBox, Horizontal, can_focus=True):
    """The panes of a session's alternatives; focused while they are on show."""

    @dataclass
    class Keep(Message):
        """The user chose alternative ``number`` (1-based) of session ``session_id``."""

        session_id: int
        number: int

    BINDINGS = [
        Binding(str(n), f"keep({n})", f"Keep {n}", show=n <= 3, id=f"keep_{n}")
        for n in range(1, MAX_ALTERNATIVES + 1)
    ]

    def __init__(self, session_id: int, generation: Generation) -> None:
        super().__init__(classes=f"alternatives -{generation.kind}")
        self.session_id = session_id
        self.generation = generation
        self.panes = [
            AltPane(i + 1, generation.kind, cand)  # made now: no update is missed
            for i, cand in enumerate(generation.candidates)
        ]

    def compose(self) -> ComposeResult:
        yield from self.panes

    def refresh_candidate(self, index: int, delta: OutputDelta | None = None) -> None:
        if 0 <= index < len(self.panes):
            self.panes[index].refresh_candidate(delta)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "keep" and parameters:
            return int(parameters[0]) <= len(self.generation.candidates)  # type: ignore[call-overload]
        return True

    def action_keep(self, number: int) -> None:
        self.post_message(self.Keep(self.session_id, number))
