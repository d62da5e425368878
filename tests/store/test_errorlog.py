"""The error log keeps the whole traceback of what the user saw as one line."""

from __future__ import annotations

from chatpage.config import errorlog


def _raise_nested() -> None:
    try:
        {}["missing"]
    except KeyError as e:
        raise RuntimeError("the step failed\nsecond line") from e


def test_log_error_writes_the_traceback_and_returns_one_line():
    try:
        _raise_nested()
    except RuntimeError as e:
        line = errorlog.log_error(e, "engine step")
    assert line == "the step failed"
    text = errorlog.log_path().read_text()
    assert "engine step: the step failed" in text
    assert "Traceback (most recent call last)" in text
    assert "_raise_nested" in text and "KeyError: 'missing'" in text  # the cause is kept


def test_one_line_of_an_empty_message_is_the_type_name():
    assert errorlog.one_line(ValueError()) == "ValueError"
    assert errorlog.one_line(ValueError("  \n")) == "ValueError"


def test_the_log_rotates_past_its_limit(monkeypatch):
    monkeypatch.setattr(errorlog, "MAX_BYTES", 200)
    for i in range(5):
        errorlog.log_error(ValueError(f"error {i}"), "test")
    path = errorlog.log_path()
    assert path.stat().st_size < 2000
    assert "error 4" in path.read_text()
    assert path.with_name(errorlog.LOG_NAME + ".1").exists()


def test_an_unwritable_log_never_raises(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))  # data dir under a regular file
    assert errorlog.log_error(OSError("disk"), "test") == "disk"
