"""`chatpage pull REPO[:QUANT]`, `chatpage models` and `chatpage models rm REPO[:QUANT]`: models
from the Hugging Face Hub, fetched into huggingface_hub's cache (`chatpage.hub`).

Errors are one line on stderr, exit 1 (argparse's own usage errors exit 2); ctrl+c stops a pull
with what it fetched kept for the next pull to resume (exit 130). huggingface_hub is imported by
the commands that use it, not by every `chatpage` start (a third of a second).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import TYPE_CHECKING

from chatpage.cli.common import one_line, print_table
from chatpage.config.settings import format_size
from chatpage.hub.refs import HubError

if TYPE_CHECKING:
    from chatpage.hub.pull import Plan, Progress

PROG = "chatpage"
BAR_WIDTH = 30
REDRAW_S = 0.1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `pull` and `models` (with `models rm`) to a parser."""
    pull = subparsers.add_parser(
        "pull",
        help="download a model from Hugging Face",
        description="Download a model from the Hugging Face Hub into its cache: a GGUF repo's "
        "file of QUANT (default Q4_K_M, else Q8_0, else the first .gguf), or a repo's config, "
        "tokenizer and safetensors. An interrupted pull resumes. HF_ENDPOINT, HF_TOKEN, "
        "HF_HUB_CACHE and HF_HUB_OFFLINE apply.",
    )
    pull.add_argument("model", metavar="REPO[:QUANT]", help="e.g. bartowski/SmolLM2-135M-GGUF:Q8_0")
    pull.set_defaults(func=cmd_pull)

    models = subparsers.add_parser(
        "models",
        help="list the models pulled (`models rm REPO[:QUANT]` removes one)",
        description="List the models in the Hugging Face cache that chatpage can run, with "
        "their sizes; `models rm REPO[:QUANT]` removes one (a whole repo without :QUANT).",
    )
    models.set_defaults(func=cmd_models)
    models_sub = models.add_subparsers(dest="models_command", metavar="{rm}")
    rm = models_sub.add_parser("rm", help="remove a model pulled")
    rm.add_argument("model", metavar="REPO[:QUANT]")
    rm.set_defaults(func=cmd_models_rm)


def _fail(message: str, code: int = 1) -> int:
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
    return code


def cmd_pull(args: argparse.Namespace) -> int:
    from chatpage.hub.cache import run_name
    from chatpage.hub.pull import plan_pull, run_pull

    try:
        plan = plan_pull(args.model)
        print(_plan_line(plan))
        bar = _Bar()
        try:
            path = run_pull(plan, bar.draw)
        finally:
            bar.end()
    except HubError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        print(f"{PROG}: pull interrupted; run it again to resume", file=sys.stderr)
        return 130
    print(f"pulled {plan.ref.repo} to {path}")
    print(f"run it: {PROG} --model {shlex.quote(run_name(plan.ref.repo, path))}")
    return 0


def _plan_line(plan: Plan) -> str:
    files = len(plan.files)
    what = f"{plan.ref} ({files} file{'s' if files != 1 else ''}, {format_size(plan.size)})"
    if plan.to_fetch <= 0:
        return f"{what}: already pulled"
    resumed = f", resuming after {format_size(plan.partial)}" if plan.partial else ""
    return (
        f"{what}: {format_size(plan.to_fetch)} to fetch{resumed}; {format_size(plan.free)} free "
        f"at {plan.storage.parent}"
    )


class _Bar:
    """The pull's progress on stderr: one line redrawn, where stderr is a terminal."""

    def __init__(self) -> None:
        self.shown = sys.stderr.isatty()
        self.last = 0.0
        self.start = time.monotonic()
        self.first: int | None = None  # the bytes done at the first chunk (resumed, cached)
        self.drawn = False

    def draw(self, p: Progress) -> None:
        now = time.monotonic()
        if not self.shown or (now - self.last < REDRAW_S and p.done < p.total):
            return
        self.last = now
        share = p.done / p.total if p.total else 1.0
        filled = int(share * BAR_WIDTH)
        if self.first is None:
            self.first = p.done
        rate = int((p.done - self.first) / max(now - self.start, 1e-3))
        line = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} "
            f"{format_size(p.done)} of {format_size(p.total)}  {format_size(rate)}/s  {p.file}"
        )
        sys.stderr.write(f"\r{line[:160]}\x1b[K")
        sys.stderr.flush()
        self.drawn = True

    def end(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")


def cmd_models(args: argparse.Namespace) -> int:
    from chatpage.hub.cache import partial_downloads, pulled_models

    models = pulled_models()
    if not models:
        print(f"no models pulled; `{PROG} pull REPO[:QUANT]` fetches one")
    else:
        print_table(
            ("MODEL", "SIZE", "PATH"),
            ((str(m.ref), format_size(m.size), str(m.path)) for m in models),
        )
    partial = partial_downloads()
    if partial:
        print(
            f"{format_size(sum(partial.values()))} of interrupted pulls kept "
            f"({', '.join(sorted(partial))}): pull again to resume"
        )
    return 0


def cmd_models_rm(args: argparse.Namespace) -> int:
    from chatpage.hub.cache import remove_pulled

    try:
        gone, partial = remove_pulled(args.model)
    except HubError as e:
        return _fail(str(e))
    for model in gone:
        print(f"removed {model.ref} ({format_size(model.size)})")
    if partial:
        print(f"removed {format_size(partial)} of interrupted pulls")
    return 0
