"""The UI's plain-Python parts: text cleaning, slash commands, gauge maths (Chats: test_chat.py)."""

from __future__ import annotations

import pytest

from chatpage.chat.commands import parse_compare, parse_k, read_attachment
from chatpage.engine.outputs import EngineStats
from chatpage.ui.slash_commands import message_text, parse_command
from chatpage.ui.text import clean, markup_literal, one_line
from chatpage.ui.widgets.block_gauge import cells, segments


# -- text ------------------------------------------------------------------------------------------
def test_clean_makes_controls_visible_and_keeps_newlines_and_tabs():
    assert clean("a\x1b[31mb\x07c\rd\te\nf\x00\x7f") == "a␛[31mb␇c␍d\te\nf␀␡"
    assert clean("x\r\ny") == "x\ny"
    assert clean("c1\x9b") == "c1\\x9b"
    assert one_line("  first line\nsecond", 5) == "firs…"


def test_markup_literal_survives_textual_markup_parsing():
    from textual.content import Content

    for text in ["[bold]x[/bold] [/", "lone [", "[@click=app.quit]q[/]", "back\\[x]"]:
        assert Content.from_markup(markup_literal(text)).plain == text


# -- commands --------------------------------------------------------------------------------------
def test_parse_commands_and_escapes():
    assert parse_command("hello") is None
    assert parse_command("//not a command") is None
    assert message_text("//not a command") == "/not a command"
    cmd = parse_command("/temp 0.7")
    assert (cmd.action.slash, cmd.arg) == ("temp", "0.7")
    assert parse_command("/temperature 1").action.slash == "temp"
    with pytest.raises(ValueError, match="unknown command /frobnicate"):
        parse_command("/frobnicate")


def test_parse_k_and_compare():
    assert parse_k("4", "beam") == 4
    with pytest.raises(ValueError, match="beam must be a whole number from 2 to 6, got 7"):
        parse_k("7", "beam")
    with pytest.raises(ValueError, match="samples must be"):
        parse_k("x", "samples")
    assert parse_compare("temp=0.2, 0.8,1.2") == ("temperature", ["0.2", "0.8", "1.2"])
    assert parse_compare("seed=1,2")[0] == "seed"
    with pytest.raises(ValueError, match="SETTING one of"):
        parse_compare("colour=1,2")
    with pytest.raises(ValueError, match="2 to 6 values"):
        parse_compare("temp=1")


def test_read_attachment_errors(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("some notes")
    assert read_attachment(str(text), 1024).text == "some notes"
    with pytest.raises(ValueError, match="no such file"):
        read_attachment(str(tmp_path / "missing.txt"), 1024)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="binary"):
        read_attachment(str(binary), 1024)
    big = tmp_path / "big.txt"
    big.write_text("word " * 2000)
    with pytest.raises(
        ValueError,
        match=r"about 2500 tokens but the context window is 1024.*"
        r"about 1477 tokens too many",
    ):
        read_attachment(str(big), 1024)
    with pytest.raises(ValueError, match="is a folder"):
        read_attachment(str(tmp_path), 1024)


# -- gauge maths -----------------------------------------------------------------------------------
def stats(**kw) -> EngineStats:
    base = dict(
        num_blocks=100,
        block_size=16,
        bytes_per_block=1024,
        blocks_used=30,
        blocks_shared=12,
        blocks_private=10,
        blocks_cached=10,
        blocks_pinned=8,
        blocks_free=60,
        num_cpu_blocks=50,
        blocks_swapped=0,
        num_running=1,
        num_waiting=0,
        num_swapped=0,
        prefix_hit_tokens=0,
        preemptions_recompute=0,
        preemptions_swap=0,
        evictions=0,
        logical_blocks=40,
        tokens_per_s=0.0,
    )
    base.update(kw)
    base["blocks_free"] = base["num_blocks"] - base["blocks_used"] - base["blocks_cached"]
    return EngineStats(**base)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"blocks_private": 22},
        {"blocks_private": 0, "blocks_used": 8},
        {"blocks_used": 100, "blocks_cached": 0, "blocks_private": 0},
    ],
)
def test_gauge_segments_add_up_to_the_pool(kw):
    s = stats(**kw)
    seg = segments(s)
    assert sum(seg.values()) == s.num_blocks
    assert all(v >= 0 for v in seg.values())
    assert seg["pinned"] == s.blocks_pinned and seg["cached"] == s.blocks_cached
    assert seg["pinned"] + seg["shared"] + seg["private"] == s.blocks_used
    assert seg["private"] == s.blocks_private
    assert sum(cells(seg, 37).values()) == 37
