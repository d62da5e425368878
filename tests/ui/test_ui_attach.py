"""/file in the real app (no model needed): only regular text files attach; a named pipe, a
device or a file over the limit is refused with one line, and the app goes on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from helpers import offline_app, send, wait_for

from chatpage.chat.commands import MAX_ATTACHMENT_BYTES
from chatpage.ui.widgets.prompt_input import PromptInput

SIZE = (140, 44)


def feed_if_opened(fifo: Path, opened: list[bool], stop: threading.Event) -> threading.Thread:
    """Should anything open ``fifo`` to read it, write a line into it and close it (a reader
    waiting on the pipe then gets text and EOF, and the test fails instead of hanging)."""

    def run() -> None:
        while not stop.wait(0.05):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader
                continue
            opened.append(True)
            os.write(fd, b"from the pipe\n")
            os.close(fd)
            return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # drives the app over an engine
async def test_file_takes_regular_files_only_and_the_app_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # short paths to type
    fifo = Path("pipe")
    os.mkfifo(fifo)
    Path("notes.txt").write_text("alpha beta gamma")
    Path("big.txt").write_bytes(b"a" * (MAX_ATTACHMENT_BYTES + 1))
    opened: list[bool] = []
    stop = threading.Event()
    feeder = feed_if_opened(fifo, opened, stop)
    app = offline_app(tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            session = app.chat.current
            prompt = app.chat.query_one(PromptInput)
            for path, kind in ((fifo, "a named pipe"), (Path("/dev/zero"), "a device")):
                await pilot.press(*f"/file {path}", "enter")  # typed, as the user would
                line = (
                    f"error: {path}: is {kind}, not a regular file; only text files can be attached"
                )
                await wait_for(pilot, lambda line=line: app.notices[-1:] == [line], str(path))
                assert session.attachments == []
                prompt.clear()
                await pilot.press(*"still here")  # the app goes on taking keys
                assert prompt.text == "still here"
                prompt.clear()

            await send(pilot, "/file big.txt")
            await wait_for(
                pilot,
                lambda: (
                    "big.txt: 1025 KiB is too big to attach (the limit is "
                    "1024 KiB)" in app.notices[-1]
                ),
                "the refusal of the big file",
            )
            assert session.attachments == []
            await send(pilot, "/file notes.txt")
            await wait_for(pilot, lambda: session.attachments, "the attachment")
            assert [(a.name, a.text) for a in session.attachments] == [
                ("notes.txt", "alpha beta gamma")
            ]
            assert app.notices[-1] == "information: attached notes.txt to your next message"
    finally:
        stop.set()
        feeder.join()
    assert opened == []  # the pipe was never opened, so nothing waited on it
