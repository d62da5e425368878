"""A JSON schema the grammar tests constrain outputs to (a string enum, a bounded integer, a
boolean: every output of the tiny random models ends within a few dozen tokens)."""

from __future__ import annotations

import json

from chatpage.engine.sampling_params import GrammarKind, Structured

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
    "additionalProperties": False,
}
JSON = Structured(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
