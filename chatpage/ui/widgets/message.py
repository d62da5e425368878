"""MessageView: one transcript entry (the user's text verbatim, a reply as Markdown) and its stats.

Click the "copy" label to copy the message; click a code block to copy that block (a drag that
selects text inside the block copies nothing: the selection is the user's, ctrl+c copies it).
A message takes the focus (alt+up/down, j/k in the transcript, a click); then c copies it, b one
of its code blocks, e edits it (sending forks the chat there), r asks again for a reply (another
version of it), d deletes it and what follows. Where the chat forks, ``◀ 2/3 ▶`` shows which version of the turn
this is: click its arrows, or press [ and ] on the focused message, to show another. A message
left out of what the model sees (the chat outgrew the context) is greyed.

Typing never acts by accident: escape goes back to the message box, and so does any printable
key the message has no use for (``/``, a letter that is not one of its keys), with the keys
that follow it in the same burst (``/edit`` typed fast: `TypingGoesToTheBox`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.dom import DOMNode
from textual.message import Message
from textual.widgets import Static
from textual.widgets.markdown import MarkdownFence

from chatpage.chat.entry import Entry, ReplyStats
from chatpage.engine.client import OutputDelta
from chatpage.ui.text import clean, code_blocks
from chatpage.ui.widgets.streaming_markdown import StreamingMarkdown
from chatpage.ui.widgets.thought import ThoughtFold
from chatpage.ui.widgets.throttle import Throttled
from chatpage.ui.widgets.tool_block import ToolBlock
from chatpage.ui.widgets.typing import TypingGoesToTheBox

STATUS_NOTES = {
    "stopped": "stopped",
    "interrupted": "interrupted",
    "error": "failed",
    "streaming": "…",
}


def stats_line(stats: ReplyStats | None) -> str:
    """The reply's stats line (`ReplyStats.line`); none before it has stats."""
    return "" if stats is None else stats.line()


def _update(line: Static, content: str | Text) -> None:
    """Give ``line`` new content only when it differs (every update costs a layout pass)."""
    if line.content != content:
        line.update(content)


class MessageView(Throttled, TypingGoesToTheBox, Vertical, can_focus=True):
    """Shows an `Entry`; `refresh_entry` redraws it after the entry changed."""

    BINDINGS = [
        Binding("c", "copy_message", "Copy", id="message_copy"),
        Binding("b", "copy_code", "Copy code", id="message_copy_code"),
        Binding("e", "edit", "Edit", id="message_edit"),
        Binding("r", "regenerate", "Regenerate", id="message_regenerate"),
        Binding("d", "delete", "Delete", id="message_delete"),
        Binding("left_square_bracket", "switch(-1)", "Previous version", id="message_prev"),
        Binding("right_square_bracket", "switch(1)", "Next version", id="message_next"),
        Binding("escape", "leave", "Message box", id="message_leave"),
        Binding("t", "toggle_tools", "Tool calls", id="message_tools"),
    ]

    @dataclass
    class Copy(Message):
        """Put ``text`` on the clipboard; ``what`` names it in the notice ("message", ...)."""

        text: str
        what: str

    @dataclass
    class CopyCode(Message):
        """Copy one of ``blocks`` (the message's code blocks: none, one, or a choice)."""

        blocks: list[str]

    @dataclass
    class Edit(Message):
        """Edit ``entry`` (the user's message)."""

        entry: Entry

    @dataclass
    class Regenerate(Message):
        """Ask again for ``entry`` (a reply): a new version of it."""

        entry: Entry

    @dataclass
    class Delete(Message):
        """Delete ``entry`` and what follows it."""

        entry: Entry

    class Left(Message):
        """Escape took the focus back to the message box."""

    @dataclass
    class Switch(Message):
        """Show the version ``step`` away from ``entry`` (-1 previous, 1 next)."""

        entry: Entry
        step: int

    def __init__(self, entry: Entry, speaker: str) -> None:
        super().__init__(classes=f"message -{entry.role}")
        self.entry = entry
        self.speaker = speaker
        self._speaker = Static(classes="message-speaker")
        self._versions = Static(classes="message-versions")
        self._foot_line = Static(classes="message-foot")
        self.thought = ThoughtFold(entry) if entry.role == "assistant" else None
        self._tools = Vertical(classes="message-tools")
        self._shown_steps: list[tuple[str, int]] = []  # what _tools holds: (text, calls) per step
        self._pending_tools: list[Static | ToolBlock] = []
        self._body: Static | StreamingMarkdown = (
            Static(classes="message-body")
            if entry.role == "user"
            else StreamingMarkdown(entry.content, classes="message-body")
        )
        self.redraw()

    def compose(self) -> ComposeResult:
        with Horizontal(classes="message-head"):
            yield self._speaker
            yield self._versions
            yield Static("copy", classes="message-copy")
        if self.thought is not None:
            yield self.thought
        yield self._tools
        yield self._body
        if self.entry.role == "user":
            yield Static(self._attachments(), classes="message-attachments")
        yield self._foot_line

    # -- drawing ---------------------------------------------------------------------------------
    def _head(self) -> Text:
        head = Text(self.speaker, style="bold")
        if self.entry.label:
            head.append(f"  {clean(self.entry.label)}", style="italic")
        note = STATUS_NOTES.get(self.entry.status)
        if note:
            head.append(f"  {note}")
        return head

    def _attachments(self) -> Text:
        return Text(
            "  ".join(f"📎 {clean(a.name)} ({len(a.text):,} chars)" for a in self.entry.attachments)
        )

    def _foot(self) -> Text:
        if self.entry.role == "user":
            return Text()
        foot = Text(stats_line(self.entry.stats))
        if self.entry.error:
            foot = Text(f"error: {clean(self.entry.error)}")
        return foot

    def refresh_entry(self, delta: OutputDelta | None = None) -> None:
        """Redraw from the entry (throttled while it streams); ``delta``: the text the engine
        added to it (appended to the Markdown as it is)."""
        if delta is not None and isinstance(self._body, StreamingMarkdown):
            self._body.add(delta.text, delta.rewrite)
        self.request_redraw(final=self.entry.status != "streaming")

    def redraw(self) -> None:
        entry = self.entry
        self.set_class(entry.status == "streaming", "-streaming")
        self.set_class(entry.status in ("stopped", "interrupted"), "-stopped")
        self.set_class(entry.status == "error", "-error")
        self.set_class(bool(entry.attachments), "-attached")
        self.set_class(entry.dropped, "-dropped")
        place = entry.place()
        self.set_class(place.forked, "-forked")
        _update(self._versions, place.label() if place.forked else "")
        _update(self._speaker, self._head())
        _update(self._foot_line, self._foot())
        if self.thought is not None:
            self.thought.draw()
        self._draw_tools()
        if isinstance(self._body, StreamingMarkdown):
            self._body.draw()
        else:
            self._body.update(Text(clean(entry.content)))

    def _draw_tools(self) -> None:
        """The reply's tool steps: the text before each round's calls, and a block per call
        (rebuilt when a step is added; the blocks redraw in place otherwise)."""
        steps = [(step.text, len(step.runs)) for step in self.entry.steps]
        self._tools.display = bool(steps)
        if steps == self._shown_steps:
            for block in self._tools.query(ToolBlock):
                block.redraw()
            return
        if len(steps) > len(self._shown_steps) and isinstance(self._body, StreamingMarkdown):
            self._body.add(self.entry.content, rewrite=True)  # its text moved into the step
        self._shown_steps = steps
        widgets: list[Static | ToolBlock] = []
        for step in self.entry.steps:
            if step.text.strip():
                widgets.append(Static(Text(clean(step.text.strip())), classes="tool-step-text"))
            widgets += [ToolBlock(run) for run in step.runs]
        if self._tools.is_attached:
            self._tools.remove_children()
            self._tools.mount_all(widgets)
        else:  # (a restored reply, drawn before it is mounted: on_mount adds them)
            self._pending_tools = widgets

    def on_mount(self) -> None:
        if self._pending_tools:
            self._tools.mount_all(self._pending_tools)
            self._pending_tools = []

    def action_toggle_tools(self) -> None:
        blocks = list(self._tools.query(ToolBlock))
        if not blocks:
            self.notify("this message made no tool calls", markup=False)
        for block in blocks:
            block.toggle()

    # -- keys ------------------------------------------------------------------------------------
    def action_leave(self) -> None:
        self.hand_over(None)
        self.post_message(self.Left())

    # -- copying ---------------------------------------------------------------------------------
    def action_copy_message(self) -> None:
        self.post_message(self.Copy(self.entry.content, "message"))

    def action_copy_code(self) -> None:
        self.post_message(self.CopyCode(code_blocks(self.entry.content)))

    def action_edit(self) -> None:
        self.post_message(self.Edit(self.entry))

    def action_regenerate(self) -> None:
        self.post_message(self.Regenerate(self.entry))

    def action_delete(self) -> None:
        self.post_message(self.Delete(self.entry))

    def action_switch(self, step: int) -> None:
        if self.entry.place().forked:
            self.post_message(self.Switch(self.entry, step))

    @on(events.Click, ".message-versions")
    def _switch(self, event: events.Click) -> None:
        """◀ (the left half) shows the previous version, ▶ the next."""
        event.stop()
        self.action_switch(-1 if event.x < self._versions.size.width // 2 else 1)

    @on(events.Click, ".message-copy")
    def _copy_message(self, event: events.Click) -> None:
        event.stop()
        self.action_copy_message()

    @on(events.Click)
    def _copy_code(self, event: events.Click) -> None:
        if self.screen.get_selected_text():  # the end of a drag that selected text
            return
        node: DOMNode | None = event.widget
        while node is not None and node is not self:
            if isinstance(node, MarkdownFence):
                event.stop()
                self.post_message(self.Copy(node.code, "code block"))
                return
            node = node.parent
