"""Start-up: the app's first frame does not wait for torch (the engine thread imports it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import chatpage.cli.main
import chatpage.ui.app
from chatpage.cli.common import engine_config
from chatpage.config.settings import Settings
app = chatpage.ui.app.ChatApp(config=engine_config(Settings(), None))
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_app_and_the_cli_import_without_torch():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
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
