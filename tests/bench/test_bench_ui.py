"""`chatpage bench ui` on the tiny model: the real app streams one chat, then the same request
runs on an engine alone, sampled the same way."""

from __future__ import annotations

import json

import pytest

from chatpage.bench import ui
from chatpage.engine import LLMEngine


@pytest.mark.slow  # runs a benchmark end to end
def test_one_chat_against_the_engine_alone_with_the_same_sampling(
    tiny_llama_dir, capsys, monkeypatch
):
    alone = []
    real = LLMEngine.add_request

    def spy(self, prompt, params, *args, **kwargs):
        alone.append(params)
        return real(self, prompt, params, *args, **kwargs)

    monkeypatch.setattr(ui, "STREAM_WINDOW_S", 0.3)  # the tiny model's context lasts ~1 s
    assert (
        ui.main(
            [
                "--json",
                "--model",
                str(tiny_llama_dir),
                "--sessions",
                "1",
                "--keys",
                "2",
                "--max-tokens",
                "600",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["sessions"] == 1 and r["keystrokes"] >= 1 and r["tui_tok_s"] > 0
    assert r["engine_alone_tok_s"] > 0 and r["tui_vs_engine_alone"] > 0
    # the engine-alone run, spied on: the persona's sampling, EOS ignored
    monkeypatch.setattr(LLMEngine, "add_request", spy)
    assert (
        ui.main(
            [
                "--json",
                "--model",
                str(tiny_llama_dir),
                "--sessions",
                "1",
                "--keys",
                "1",
                "--max-tokens",
                "600",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    last = alone[-1]
    assert (last.temperature, last.top_p, last.ignore_eos, last.max_tokens) == (0.7, 0.9, True, 600)


@pytest.mark.slow  # runs a benchmark end to end
def test_replies_that_end_before_the_window_are_an_error_not_a_hang(tiny_llama_dir):
    with pytest.raises(SystemExit, match="replies ended before the measurement began"):
        ui.main(
            [
                "--json",
                "--model",
                str(tiny_llama_dir),
                "--sessions",
                "1",
                "--keys",
                "1",
                "--max-tokens",
                "2",
                "--threads",
                "1",
            ]
        )
