"""The UI's plain-Python parts: text cleaning, slash commands, session model, Chats, gauge maths."""

from __future__ import annotations

import pytest

from chatpage.chat.chats import ChatError, Chats
from chatpage.chat.commands import (
    message_text,
    parse_command,
    parse_compare,
    parse_k,
    read_attachment,
)
from chatpage.chat.session import AltMode, SamplingSettings
from chatpage.config.personas import Persona
from chatpage.engine.client import StreamEvent
from chatpage.engine.outputs import EngineStats
from chatpage.ui.text import clean, markup_literal, one_line
from chatpage.ui.widgets.block_gauge import cells, segments

PERSONA = Persona("p", "a persona", "You are p.", temperature=0.5, max_tokens=8)


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
    assert (cmd.name, cmd.arg) == ("temp", "0.7")
    assert parse_command("/temperature 1").name == "temp"
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
    with pytest.raises(ValueError, match=r"about 2500 tokens but the context window is 1024.*"
                                         r"about 1477 tokens too many"):
        read_attachment(str(big), 1024)
    with pytest.raises(ValueError, match="is a folder"):
        read_attachment(str(tmp_path), 1024)


# -- sampling settings -----------------------------------------------------------------------------
def test_sampling_settings_validate_through_sampling_params():
    s = SamplingSettings.for_persona(PERSONA)
    assert (s.temperature, s.max_tokens) == (0.5, 8)
    assert s.with_value("temperature", "0.9").temperature == 0.9
    assert s.with_value("seed", "off").seed is None
    assert s.with_value("seed", "42").seed == 42
    with pytest.raises(ValueError, match=r"^temperature must be a number >= 0 \(0 = greedy\), "
                                         r"got '-1'$"):
        s.with_value("temperature", "-1")
    with pytest.raises(ValueError, match="top-p must be a number > 0 and <= 1, got '2'"):
        s.with_value("top_p", "2")
    with pytest.raises(ValueError, match="max tokens must be a whole number >= 1, got 'lots'"):
        s.with_value("max_tokens", "lots")


# -- Chats against a fake client -------------------------------------------------------------------
class FakeClient:
    error = None
    ready = True

    def __init__(self):
        self.submitted: list[tuple[list, object, object]] = []
        self.cancelled: list[str] = []

    def submit(self, messages, params, on_event):
        self.submitted.append((messages, params, on_event))
        return f"r{len(self.submitted)}"

    def cancel(self, rid):
        self.cancelled.append(rid)


def event(rid, text, index=0, finished=False, reason=None, request_finished=None, **kw):
    return StreamEvent(
        request_id=rid, index=index, text=text, delta="", replaced=False, num_tokens=len(text),
        finished=finished, finish_reason=reason, cumulative_logprob=kw.get("logprob", -1.0),
        score=kw.get("score"),
        request_finished=finished if request_finished is None else request_finished,
        prompt_tokens=20, prefix_hit_tokens=16, ttft_s=0.1, elapsed_s=0.5, error=kw.get("error"))


def test_chats_turns_stop_keep_and_observer_hook():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    seen = []
    session.observers.append(lambda s, change: seen.append(change.kind))
    chats.send(session, "hi there")
    assert session.title == "hi there" and session.streaming
    messages, params, _ = client.submitted[0]
    assert messages == [{"role": "system", "content": "You are p."},
                        {"role": "user", "content": "hi there"}]
    assert params.max_tokens == 8 and params.temperature == 0.5
    with pytest.raises(ChatError, match="still streaming"):
        chats.send(session, "again")
    chats.apply(event("r1", "Hel"))
    assert chats.stop(session) and client.cancelled == ["r1"]
    chats.apply(StreamEvent(
        request_id="r1", index=0, text="Hel", delta="", replaced=False, num_tokens=0,
        finished=True, finish_reason="abort", cumulative_logprob=0.0, score=None,
        request_finished=True, prompt_tokens=0, prefix_hit_tokens=0, ttft_s=None, elapsed_s=0.6))
    reply = session.entries[-1]
    assert (reply.content, reply.status, reply.stats.tokens) == ("Hel", "stopped", 3)
    assert not session.streaming
    assert {"entry_added", "entry_updated", "busy", "title"} <= set(seen)

    chats.set_alt_mode(session, AltMode("samples", 3))
    chats.regenerate(session)
    assert client.submitted[-1][1].n == 3 and session.alt_mode.kind == "off"
    for i in range(3):
        chats.apply(event("r2", f"alt {i}", index=i, finished=True, reason="length",
                          request_finished=i == 2))
    assert session.choosing and not session.streaming
    with pytest.raises(ChatError, match="keep one of the alternatives first"):
        chats.send(session, "next")
    kept = chats.keep(session, 2)
    assert (kept.content, kept.label, kept.status) == ("alt 1", "sample 2", "done")
    assert session.generation is None and session.entries[-1] is kept

    text = chats.edit_last(session)
    assert text == "hi there" and session.entries == []


def test_chats_compare_submits_one_request_per_value_and_reports_errors():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    with pytest.raises(ChatError, match="send a message first"):
        chats.compare(session, "temperature", ["0.2", "0.8"])
    chats.send(session, "q")
    chats.apply(event("r1", "a", finished=True, reason="stop"))
    chats.compare(session, "temperature", ["0.2", "0.8", "1.2"])
    temps = [p.temperature for _, p, _ in client.submitted[1:]]
    assert temps == [0.2, 0.8, 1.2]
    assert [c.label for c in session.generation.candidates] == ["temp=0.2", "temp=0.8",
                                                                "temp=1.2"]
    assert session.entries[-1].role == "user"  # the old reply gives way to the comparison
    for rid in ("r2", "r3", "r4"):
        chats.apply(StreamEvent(
            request_id=rid, index=0, text="", delta="", replaced=False, num_tokens=0,
            finished=True, finish_reason="error", cumulative_logprob=0.0, score=None,
            request_finished=True, prompt_tokens=0, prefix_hit_tokens=0, ttft_s=None,
            elapsed_s=0.0, error="the prompt is 2000 tokens but ..."))
    assert session.generation is None
    assert session.entries[-1].status == "error"
    assert "2000 tokens" in session.entries[-1].error
    with pytest.raises(ValueError, match="temperature must be"):
        chats.compare(session, "temperature", ["0.2", "-3"])


# -- gauge maths -----------------------------------------------------------------------------------
def stats(**kw) -> EngineStats:
    base = dict(num_blocks=100, block_size=16, bytes_per_block=1024, blocks_used=30,
                blocks_shared=12, blocks_private=10, blocks_cached=10, blocks_pinned=8,
                blocks_free=60,
                num_cpu_blocks=50, blocks_swapped=0, num_running=1, num_waiting=0,
                num_swapped=0, prefix_hit_tokens=0, preemptions_recompute=0,
                preemptions_swap=0, evictions=0, logical_blocks=40, tokens_per_s=0.0)
    base.update(kw)
    base["blocks_free"] = base["num_blocks"] - base["blocks_used"] - base["blocks_cached"]
    return EngineStats(**base)


@pytest.mark.parametrize("kw", [{}, {"blocks_private": 22}, {"blocks_private": 0, "blocks_used": 8},
                                {"blocks_used": 100, "blocks_cached": 0, "blocks_private": 0}])
def test_gauge_segments_add_up_to_the_pool(kw):
    s = stats(**kw)
    seg = segments(s)
    assert sum(seg.values()) == s.num_blocks
    assert all(v >= 0 for v in seg.values())
    assert seg["pinned"] == s.blocks_pinned and seg["cached"] == s.blocks_cached
    assert seg["pinned"] + seg["shared"] + seg["private"] == s.blocks_used
    assert seg["private"] == s.blocks_private
    assert sum(cells(seg, 37).values()) == 37
