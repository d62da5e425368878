"""A model switch that fails leaves the model in use serving; the picker lists the models found."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import alpha_and_beta, idle, opened, send, tiny_run, wait_for
from textual.widgets import OptionList

from chatpage.config.models import find_models, recent_models, remember_model
from chatpage.config.settings import load_settings
from chatpage.ui.screens.model_picker import ModelPicker

SIZE = (140, 44)


def write_gguf(path: Path, architecture: str) -> Path:
    """A small GGUF file of an architecture chatpage does not run."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


async def test_a_failed_switch_leaves_the_old_model_serving(tmp_path, tiny_llama_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    alien = write_gguf(tmp_path / "alien.gguf", "mamba")
    async with tiny_run(tiny_llama_dir, alpha_and_beta(tmp_path), SIZE) as (app, pilot):
        old = app.client
        session = app.chat.current
        for target, why in ((broken, "unsupported architecture"), (alien, "")):
            await send(pilot, f"/model {target}")
            await wait_for(
                pilot,
                lambda t=target: any(
                    n.startswith(f"error: could not switch to {t}") for n in app.notices
                ),
                f"the failed switch to {target}",
                timeout=120,
            )
            notice = next(
                n for n in app.notices if n.startswith(f"error: could not switch to {target}")
            )
            assert why in notice and notice.endswith(f"{old.model_name} is still serving")
            assert app.client is old and app.chats.requests.client is old and old.ready
            assert "restart" not in notice
            await send(pilot, "/max 3")
            await send(pilot, f"still there after {target.name}?")
            await wait_for(pilot, lambda: idle(app), "the reply")
            reply = session.entries[-1]
            assert reply.role == "assistant" and reply.status == "done", reply.error
            assert reply.stats.tokens > 0


async def test_the_picker_lists_the_models_it_finds(tmp_path, tiny_llama_dir):
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny").symlink_to(tiny_llama_dir, target_is_directory=True)
    gguf_file = write_gguf(models / "other.gguf", "llama")
    (models / "notes.txt").write_text("not a model")
    (models / "empty").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"models_dirs: [{models}]\n")
    settings, warnings = load_settings(config)
    assert warnings == [] and settings.models_dirs == (str(models),)
    async with tiny_run(
        tiny_llama_dir, alpha_and_beta(tmp_path), SIZE, models_dirs=settings.models_dirs
    ) as (app, pilot):
        await wait_for(
            pilot,
            lambda: recent_models() == [str(tiny_llama_dir.resolve())],
            "the model in use remembered",
        )
        await send(pilot, "/model")
        await opened(pilot, ModelPicker)
        options = app.screen.query_one(OptionList)
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert str(tiny_llama_dir.resolve()) in ids  # loaded before
        assert str(gguf_file) in ids  # from models_dirs (the tiny folder there is the same model)
        assert str(models / "tiny") not in ids
        assert not any("notes" in i or i.endswith("empty") for i in ids if i)
        labels = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("loaded before" in label and "(in use)" in label for label in labels)
        assert any(str(models) in label and "other.gguf" in label for label in labels)
        await pilot.press("escape")


def test_found_models_in_order_each_once(tmp_path, tiny_llama_dir):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    write_gguf(one / "a.gguf", "llama")
    (two / "m").symlink_to(tiny_llama_dir, target_is_directory=True)
    remember_model(str(two / "m"))
    remember_model(str(one / "a.gguf"))
    remember_model(str(tmp_path / "gone.gguf"))  # no longer there: not offered
    found = find_models([str(one), str(two), str(tiny_llama_dir)])
    paths = [f.path for f in found]
    assert paths[:2] == [str((one / "a.gguf").resolve()), str(tiny_llama_dir.resolve())]
    assert [f.origin for f in found[:2]] == ["loaded before"] * 2
    assert len({Path(p).resolve() for p in paths}) == len(paths)
    assert all(f.origin == "cache" for f in found[2:])
