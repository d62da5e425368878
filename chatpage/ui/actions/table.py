"""The table of user actions: the one list that the key bindings (`chatpage.ui.bindings`), the
slash commands (`chatpage.ui.slash_commands`), the help screen and the command palette
(`chatpage.ui.palette`) are built from. To add an action, add its row here (and its handler
next to those of its kind).
"""

from __future__ import annotations

from chatpage.chat.sampling import SETTING_BY_FIELD
from chatpage.chat.session import MAX_ALTERNATIVES, MIN_ALTERNATIVES
from chatpage.ui.actions import sessions, settings, turns
from chatpage.ui.actions.action import Action, Controls, PaletteEntry
from chatpage.ui.history import EXPORT_NAMES

_RANGE = f"({MIN_ALTERNATIVES}-{MAX_ALTERNATIVES})"


def _setting(
    name: str, field: str, usage: str, help_text: str = "", aliases: tuple[str, ...] = ()
) -> Action:
    rule = SETTING_BY_FIELD[field]
    return Action(
        f"set_{field}",
        rule.label,
        settings.setting(name, field),
        slash=name,
        aliases=aliases,
        usage=usage,
        help=help_text or f"{rule.label}, {rule.allowed}",
    )


def _streaming(c: Controls) -> bool:
    return c.current is not None and c.current.streaming


def _editing(c: Controls) -> bool:
    return c.current is not None and c.current.editing is not None and not c.current.streaming


ACTIONS: tuple[Action, ...] = (
    Action(
        "help",
        "Help",
        sessions.show_help,
        key="f1",
        app=True,
        slash="help",
        usage="/help",
        help="show keys and commands",
    ),
    # -- the chats
    Action(
        "new_session",
        "New chat",
        sessions.new_session,
        key="ctrl+n",
        slash="new",
        usage="/new [PERSONA]",
        argument="persona",
        help="open a new chat (picks a persona when none is named)",
    ),
    Action(
        "close_session", "Close", sessions.close_session, key="ctrl+w", priority=True, yields=True
    ),
    Action(
        "next_session",
        "Next chat",
        sessions.step(+1),
        key="ctrl+tab,ctrl+pagedown",
        show=False,
        priority=True,
    ),
    Action(
        "prev_session",
        "Previous chat",
        sessions.step(-1),
        key="ctrl+shift+tab,ctrl+pageup",
        show=False,
        priority=True,
    ),
    *(
        Action(
            f"goto_session_{n}",
            f"Chat {n}",
            sessions.goto(n),
            key=f"alt+{n}",
            show=False,
            palette=(),
        )
        for n in range(1, 10)
    ),
    Action(
        "clear",
        "Clear",
        sessions.clear,
        slash="clear",
        usage="/clear",
        help="empty this chat's transcript",
    ),
    Action(
        "rename",
        "Rename",
        sessions.rename,
        slash="title",
        usage="/title TEXT",
        help="rename this chat",
    ),
    Action(
        "search_history",
        "Search chats",
        sessions.search,
        key="ctrl+f",
        slash="search",
        usage="/search [WORDS]",
        help="search your saved chats (ctrl+f)",
    ),
    Action(
        "export",
        "Export",
        sessions.export,
        slash="export",
        usage="/export md|json",
        help="write this chat to a file as Markdown or JSON",
        palette=tuple(
            PaletteEntry(
                f"Export chat as {name}", "write this chat to a file in the current folder", fmt
            )
            for fmt, name in EXPORT_NAMES.items()
        ),
    ),
    Action(
        "delete_session",
        "Delete chat",
        sessions.delete_session,
        palette=(
            PaletteEntry("Delete chat", "delete this chat from the saved chats (asks first)"),
        ),
    ),
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
    # -- sampling, system prompt, persona, model
    Action(
        "sampling_settings",
        "Sampling",
        settings.sampling_settings,
        key="f2",
        slash="settings",
        usage="/settings",
        help="open this chat's sampling settings",
    ),
    _setting("temp", "temperature", "/temp VALUE", aliases=("temperature",)),
    _setting("top_p", "top_p", "/top_p VALUE", aliases=("topp",)),
    _setting("top_k", "top_k", "/top_k VALUE", aliases=("topk",)),
    _setting(
        "max",
        "max_tokens",
        "/max N",
        aliases=("max_tokens",),
        help_text=f"the most tokens a reply may have, {SETTING_BY_FIELD['max_tokens'].allowed}",
    ),
    _setting("seed", "seed", "/seed N|off"),
    Action(
        "system_prompt",
        "System prompt",
        settings.system_prompt,
        slash="system",
        usage="/system [TEXT]",
        help="set this chat's system prompt (an editor when no text is given)",
        palette=(
            PaletteEntry(
                "Edit this chat's system prompt", "the chat's own system prompt (/system)"
            ),
        ),
    ),
    Action(
        "switch_persona",
        "Persona",
        settings.switch_persona,
        slash="persona",
        usage="/persona [NAME]",
        argument="persona",
        help="continue this chat as another persona (a picker when none is named)",
        palette=(
            PaletteEntry("Switch this chat's persona", "continue as another persona (/persona)"),
        ),
    ),
    Action(
        "save_as_persona",
        "Save as persona",
        settings.save_as_persona,
        slash="saveas",
        usage="/saveas [NAME]",
        help="save this chat's persona, system prompt and settings "
        "as a persona of your own (opens the editor)",
        palette=(
            PaletteEntry(
                "Save this chat as a persona",
                "a persona file of your own, from this chat's system prompt and settings (/saveas)",
            ),
        ),
    ),
    Action(
        "switch_model",
        "Switch model",
        sessions.switch_model,
        slash="model",
        usage="/model [PATH]",
        help="switch the model: a model folder or .gguf file, or "
        "default (a picker when no path is given); chats stay",
        palette=(
            PaletteEntry(
                "Switch model",
                "a model folder, a .gguf file or the default model; the chats stay (/model)",
            ),
        ),
    ),
    Action(
        "tools",
        "Tools",
        sessions.show_tools,
        slash="tools",
        usage="/tools",
        help="the MCP servers of config.yaml, their state (running, failed and why, not "
        "started) and their tools",
        palette=(PaletteEntry("MCP tools", "the MCP servers, their state and tools (/tools)"),),
    ),
    Action(
        "interrupt", "Stop or quit", sessions.interrupt, key="ctrl+c", show=False, priority=True
    ),
    Action(
        "quit",
        "Quit",
        sessions.quit_app,
        slash="quit",
        aliases=("exit",),
        usage="/quit",
        help="quit chatpage",
    ),
)
BY_ID = {action.id: action for action in ACTIONS}
BY_SLASH = {
    name: action for action in ACTIONS if action.slash for name in (action.slash, *action.aliases)
}
"""Every slash command's name and alias -> its action."""
