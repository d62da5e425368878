"""Start-up: the app's first frame does not wait for torch (the engine thread imports it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import chatpage.cli.main
import chatpage.ui.app
from chatpage.config.settings import Settings
from chatpage.engine.config import EngineConfig
app = chatpage.ui.app.ChatApp(config=EngineConfig.for_settings(Settings(), None))
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_app_and_the_cli_import_without_torch():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_engine_package_still_gives_its_names():
    import chatpage.engine as engine
    from chatpage.engine.config import EngineConfig
    from chatpage.engine.llm_engine import LLMEngine

    assert engine.LLMEngine is LLMEngine
    assert engine.EngineConfig is EngineConfig
    assert str(EngineConfig(dtype="bfloat16").torch_dtype) == "torch.bfloat16"
    with pytest.raises(ValueError, match="EngineConfig.dtype must be"):
        EngineConfig(dtype="float64")
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        _ = engine.Engine


@pytest.mark.slow  # real starts of chatpage, each a process of its own
def test_bench_startup_times_real_starts_of_every_format_asked(tiny_llama_dir, capsys, tmp_path):
    """`chatpage bench startup`: fresh processes of the headless app, each format in turn."""
    import json

    from chatpage.bench import report, startup

    assert (
        startup.main(
            [
                "--json",
                "--model",
                str(tiny_llama_dir),
                "--weights",
                "fp32,int8",
                "--repeats",
                "2",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["benchmark"] == "startup" and r["rounds"] == 2
    assert [x["weights"] for x in r["results"]] == ["fp32", "int8"]
    for x in r["results"]:
        assert len(x["starts_s"]) == 2 and x["slowest_model_ready_s"] == max(x["starts_s"])
        assert 0 < x["first_paint_s"] < x["model_ready_s"] <= x["slowest_model_ready_s"]
    runs = {"startup": {"command": "chatpage bench startup --json", "seconds": 20.0, "result": r}}
    goals = {g.goal: g for g in report.goals({"startup": r})}
    assert goals["cached start to model ready, int8"].value == r["results"][1]["model_ready_s"]
    assert "| int8 |" in report.render(runs, tmp_path / "b.md", "test machine", 20.0, "")


@pytest.mark.slow  # drives the app over an engine
def test_a_failed_start_is_one_line(tmp_path, capsys):
    from chatpage.bench import startup

    with pytest.raises(SystemExit, match="error: the fp32 start failed: model path not found"):
        startup.main(["--json", "--model", str(tmp_path / "missing"), "--weights", "fp32"])
