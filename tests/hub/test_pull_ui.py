"""/model in the TUI: the models pulled are listed, a model is pulled from Hugging Face off the UI
thread with its progress in the status line (the model in use answering meanwhile), then switched
to; a pull can be cancelled. The real huggingface_hub client against a Hub on localhost."""

from __future__ import annotations

import re

import pytest
from gguf_files import Q, write_gguf
from helpers import alpha_and_beta, idle, make_app, opened, ready, send, wait_for
from hub_server import Repo, serve_hub
from textual.widgets import Input, OptionList

from chatpage.config.settings import format_size
from chatpage.hub.cache import partial_downloads
from chatpage.hub.pull import plan_pull, run_pull
from chatpage.ui.screens.model_picker import (
    CANCEL_PULL_ID,
    PULL_ID,
    PULL_REF,
    ModelPicker,
    model_problem,
)

SIZE = (140, 44)


def option_ids(app) -> list[str]:
    options = app.screen.query_one(OptionList)
    return [options.get_option_at_index(i).id for i in range(options.option_count)]


async def pick(pilot, option_id: str) -> None:
    options = pilot.app.screen.query_one(OptionList)
    options.highlighted = option_ids(pilot.app).index(option_id)
    await pilot.press("enter")


@pytest.mark.slow  # pulls through a real Hub server
async def test_pull_from_the_picker_then_switch(tmp_path, monkeypatch, tiny_llama_dir):
    hub = serve_hub(monkeypatch, tmp_path / "hf-cache")
    files = {
        f"tiny-{name}.gguf": write_gguf(tmp_path / f"{name}.gguf", qtype).read_bytes()
        for name, qtype in (("Q4_K_M", Q.Q4_K), ("Q8_0", Q.Q8_0), ("F16", Q.F16))
    }
    hub.repos["test/tiny-GGUF"] = Repo(files)
    run_pull(plan_pull("test/tiny-GGUF"))  # pulled before: Q4_K_M
    hub.pace["tiny-Q8_0.gguf"] = 0.02  # ~4 s for its ~190 chunks
    hub.pace["tiny-F16.gguf"] = 0.5
    app = make_app(tiny_llama_dir, alpha_and_beta(tmp_path))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            old = app.client
            await send(pilot, "/model")
            await opened(pilot, ModelPicker)
            ids = option_ids(app)
            assert "test/tiny-GGUF:Q4_K_M" in ids and ids[-1] == PULL_ID
            await pick(pilot, PULL_ID)
            assert app.screen.query_one(Input).value == "hf.co/"
            await pilot.press(*"test/tiny-GGUF:q8_0")
            assert option_ids(app) == [PULL_REF + "test/tiny-GGUF:q8_0"]
            await pilot.press("enter")

            statuses: list[str] = []

            def pulling() -> bool:
                statuses.append(app.chat.gauge.status)
                return "pulling test/tiny-GGUF:Q8_0 " in statuses[-1]

            await wait_for(pilot, pulling, "the pull's progress in the status line")
            await send(pilot, "/max 3")
            await send(pilot, "still answering while the pull runs?")
            await wait_for(pilot, lambda: idle(app), "the reply during the pull")
            reply = app.chat.current.entries[-1]
            assert reply.status == "done" and app.client is old
            await wait_for(
                pilot,
                lambda: (
                    "information: switched to test/tiny-GGUF:Q8_0; the chats stay" in app.notices
                ),
                "the switch to the model pulled",
                timeout=120,
            )
            assert app.client.model_name == "test/tiny-GGUF:Q8_0"
            assert "information: pulled test/tiny-GGUF:Q8_0" in app.notices
            size = format_size(len(files["tiny-Q8_0.gguf"]))
            assert re.search(rf" · pulling test/tiny-GGUF:Q8_0 \d+% of {size}$", statuses[-1])
            assert "pulling" not in app.chat.gauge.status

            await send(pilot, "/model")
            await opened(pilot, ModelPicker)
            await pilot.press(*"test/nope", "enter")
            await wait_for(
                pilot,
                lambda: (
                    f"error: test/nope: no such model on {hub.url} (a private one needs "
                    "HF_TOKEN)" in app.notices
                ),
                "the one line of a repo that is not there",
            )
            assert app.pulls.ref is None

            await send(pilot, "/model")
            await opened(pilot, ModelPicker)
            await pilot.press(*"test/tiny-GGUF:F16", "enter")
            await wait_for(pilot, lambda: app.pulls.ref == "test/tiny-GGUF:F16", "the F16 pull")
            await wait_for(pilot, lambda: partial_downloads() != {}, "the first chunks")
            await send(pilot, "/model")
            await opened(pilot, ModelPicker)
            assert option_ids(app)[0] == CANCEL_PULL_ID
            await pick(pilot, CANCEL_PULL_ID)
            await wait_for(
                pilot,
                lambda: any(n.startswith("warning: pull cancelled") for n in app.notices),
                "the cancel",
            )
            assert app.pulls.ref is None and partial_downloads() != {}  # kept to resume
            assert app.client.model_name == "test/tiny-GGUF:Q8_0"
    finally:
        hub.stop()


def test_slash_model_takes_a_model_pulled_by_name(tmp_path, monkeypatch):
    hub = serve_hub(monkeypatch, tmp_path / "hf-cache")
    hub.repos["test/tiny-GGUF"] = Repo(
        {"tiny-Q8_0.gguf": write_gguf(tmp_path / "q8.gguf").read_bytes()}
    )
    assert model_problem("test/tiny-GGUF:Q8_0") == (
        "test/tiny-GGUF:Q8_0: not pulled yet; type it in /model to pull it from Hugging Face"
    )
    run_pull(plan_pull("test/tiny-GGUF"))
    hub.stop()  # what is pulled is found offline
    assert model_problem("test/tiny-GGUF:Q8_0") is None and model_problem("test/tiny-gguf") is None
    assert model_problem("test/tiny-GGUF:Q4_K_M").endswith(
        "not pulled yet; type it in /model to pull it from Hugging Face"
    )


def test_a_relative_path_still_completes_beside_the_pull(tmp_path, monkeypatch):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    ids = [o.id for o in ModelPicker(None, None).options("models/ti")]
    assert ids == ["models/tiny/", PULL_REF + "models/ti"]
