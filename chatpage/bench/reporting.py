"""What a benchmark declares to docs/benchmarks.md: its result as a dataclass read from the JSON
it printed, its goal rows (each threshold written beside the figure it judges, in the benchmark's
own module) and its tables, bundled in one :class:`Section` that ``chatpage/bench/report.py``
loops over.

The results stay JSON on the way out (``chatpage bench NAME --json`` prints the keys users and
saved reports read); the dataclasses are how the report reads them back, so a key a section uses
is declared once, and a key older runs lack is declared with its default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Goal:
    """One row of the report's goals table."""

    bench: str
    goal: str
    value: object
    target: str
    met: bool | None
    why: str


def at_least(
    bench: str, goal: str, value: float, goal_value: float, why: str, spec: str = "g"
) -> Goal:
    """A goal met when ``value >= goal_value`` (the target written with format ``spec``)."""
    return Goal(bench, goal, value, f">= {goal_value:{spec}}", value >= goal_value, why)


def at_most(
    bench: str,
    goal: str,
    value: float,
    goal_value: float,
    why: str,
    spec: str = "g",
    unit: str = "",
) -> Goal:
    """A goal met when ``value <= goal_value`` (the target written with format ``spec``)."""
    return Goal(bench, goal, value, f"<= {goal_value:{spec}}{unit}", value <= goal_value, why)


@dataclass(frozen=True)
class Section(Generic[R]):
    """A benchmark as the report runs and renders it.

    ``read`` types a run's JSON (:func:`reader`); ``args`` are the report's own arguments for it, ``command`` its words after ``bench`` where
    they are not its name; ``plotted`` ones are given ``--plot``; ``own_args`` ones take none of
    ``--bench-args``; ``named_only`` ones run only when ``--only`` names them.
    """

    read: Callable[[Mapping[str, Any]], R]
    goals: Callable[[R], list[Goal]]
    figures: Callable[[R], list[str]]
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    plotted: bool = False
    own_args: bool = False
    named_only: bool = False


def reader(cls: type[R]) -> Callable[[Mapping[str, Any]], R]:
    """A :class:`Section`'s ``read`` for a result whose fields are the JSON's own keys."""
    return lambda raw: from_json(cls, raw)


def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
    """``cls`` (a dataclass) from a JSON object: its fields by name, nested dataclasses, lists
    and dicts of them converted by the fields' annotations; keys it does not declare ignored."""
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            f.name: _convert(hints[f.name], data[f.name])
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name in data
        }
    )


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if origin is list:
        return [_convert(args[0], x) for x in value]
    if origin is dict:
        return {k: _convert(args[1], x) for k, x in value.items()}
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    return value


def fmt(x: object) -> str:
    """A table cell: ``n/a`` for None, floats to 3-4 significant digits."""
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"
    return str(x)


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def listed(values: list[float]) -> str:
    """``1.21, 1.37, 1.33``: a run's per-round figures."""
    return ", ".join(f"{x:.2f}" for x in values)
