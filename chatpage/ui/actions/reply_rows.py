"""The table's rows of the actions on the replies of the chat on show (stop, ask again, edit,
the alternatives, copy, think), then on the message box and the messages."""

from __future__ import annotations

from chatpage.chat.session import MAX_ALTERNATIVES, MIN_ALTERNATIVES
from chatpage.ui.actions import settings, turns
from chatpage.ui.actions.action import Action, Controls, PaletteEntry

_RANGE = f"({MIN_ALTERNATIVES}-{MAX_ALTERNATIVES})"


def _streaming(c: Controls) -> bool:
    return c.current is not None and c.current.streaming


def _editing(c: Controls) -> bool:
    return c.current is not None and c.current.editing is not None and not c.current.streaming


ROWS: tuple[Action, ...] = (
    # -- replies
    Action(
        "stop",
        "Stop",
        turns.stop,
        key="escape",
        active=_streaming,
        slash="stop",
        usage="/stop",
        help="stop the reply in progress",
    ),
    Action(
        "regenerate",
        "Regenerate",
        turns.regenerate,
        key="ctrl+r",
        slash="regen",
        aliases=("regenerate",),
        usage="/regen",
        help="answer your last message again (the old reply stays: ◀ ▶ moves between them)",
    ),
    Action(
        "edit_last",
        "Edit last",
        turns.edit_last,
        key="alt+e",
        show=False,
        slash="edit",
        usage="/edit",
        help="put your last message back in the input: sending it forks the "
        "chat there, and the old version stays",
    ),
    Action(
        "undo_delete",
        "Undo delete",
        turns.undo_delete,
        key="ctrl+z",
        show=False,
        priority=True,
        yields=True,
        slash="undo",
        usage="/undo",
        help="bring back the message deleted last, with what followed it (box with text: "
        "ctrl+z undoes typing)",
    ),
    Action(
        "cancel_edit",
        "Cancel edit",
        turns.cancel_edit,
        key="escape",
        active=_editing,
        show=False,
        palette=(),
    ),
    Action(
        "continue_reply",
        "Continue",
        turns.continue_reply,
        slash="continue",
        usage="/continue",
        help="let the last reply go on from where it ended",
    ),
    Action(
        "cycle_alternatives",
        "Alternatives",
        settings.cycle_alternatives,
        key="ctrl+a",
        priority=True,
        yields=True,
    ),
    Action(
        "samples",
        "Samples",
        settings.alternatives("samples"),
        slash="samples",
        usage="/samples K",
        help=f"the next reply as K samples side by side {_RANGE}; ctrl+r then asks your "
        "last message again that way",
        palette=(
            PaletteEntry("Next reply: samples", "ask for the next reply as samples side by side"),
        ),
    ),
    Action(
        "beam",
        "Beam search",
        settings.alternatives("beam"),
        slash="beam",
        usage="/beam K",
        help=f"the next reply by beam search of width K {_RANGE}; ctrl+r then asks your last "
        "message again that way",
        palette=(
            PaletteEntry(
                "Next reply: beam search",
                "ask for the next reply by beam search, beams side by side",
            ),
        ),
    ),
    Action(
        "single",
        "Single reply",
        settings.alternatives("off"),
        slash="single",
        aliases=("off",),
        usage="/single",
        help="next reply as one reply again (alternatives off)",
        palette=(PaletteEntry("Next reply: single", "one reply again (alternatives off)"),),
    ),
    Action(
        "compare",
        "Compare",
        settings.compare,
        slash="compare",
        usage="/compare temp=0.2,0.8,1.2",
        help="the next reply once per value (temp, "
        "top_p, top_k, max or seed), side by side, as /samples; ctrl+r then asks your last "
        "message again that way",
    ),
    Action(
        "keep",
        "Keep",
        settings.keep,
        slash="keep",
        usage="/keep N",
        help="keep alternative N as the reply",
    ),
    Action(
        "copy_reply",
        "Copy reply",
        turns.copy_reply,
        key="alt+c",
        show=False,
        slash="copy",
        usage="/copy [code]",
        help="copy the last reply (or its last code block)",
    ),
    Action("copy_code", "Copy code", turns.copy_code, key="alt+k", show=False),
    Action("toggle_thinking", "Show thinking", turns.toggle_thinking, key="alt+t", show=False),
    Action(
        "think",
        "Think",
        settings.think,
        slash="think",
        usage="/think on|off",
        help="let the model think before it answers, or not, in this chat (where its chat "
        "template has a switch, such as Qwen3's enable_thinking)",
    ),
    Action(
        "spec",
        "Speculate",
        settings.spec,
        slash="spec",
        usage="/spec on|off",
        help="draft this chat's replies from the text already there and verify the drafts in "
        "one step (the same reply, sooner where it repeats what is there)",
    ),
    # -- the message box and the messages
    Action(
        "attach",
        "Attach",
        turns.attach,
        slash="file",
        aliases=("attach",),
        usage="/file PATH",
        argument="path",
        help="attach a text file to your next message",
    ),
    Action(
        "detach",
        "Detach",
        turns.detach,
        slash="detach",
        usage="/detach",
        help="drop the files attached to your next message",
    ),
    Action(
        "external_editor", "Editor", turns.external_editor, key="ctrl+e", show=False, priority=True
    ),
    Action(
        "focus_prev_message", "Previous message", turns.focus_step(-1), key="alt+up", show=False
    ),
    Action("focus_next_message", "Next message", turns.focus_step(1), key="alt+down", show=False),
    Action("toggle_sidebar", "Sidebar", turns.toggle_sidebar, key="ctrl+b", show=False),
)
