"""`chatpage serve`'s app on a thread of this process, on a free port (benchmarks and tests: the
real server, where the caller can also reach the engine client it serves)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from starlette.applications import Starlette


@dataclass(frozen=True)
class ServerThread:
    """A running server: its base URL and the thread whose event loop serves it."""

    url: str
    thread: threading.Thread


@contextmanager
def serving(app: Starlette, host: str = "127.0.0.1") -> Iterator[ServerThread]:
    """Serve ``app`` with uvicorn on a port the system picks; stopped on exit."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="chatpage-serve", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the server on {host} did not start (see the log above)")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield ServerThread(f"http://{host}:{port}", thread)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
