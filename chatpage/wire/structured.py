"""Structured output fields of a request <-> `Structured`: OpenAI's ``response_format``
(``text``, ``json_object``, ``json_schema``) and vLLM's ``structured_outputs`` (``json``,
``regex``, ``choice``, ``grammar``, ``json_object``). A schema that is not one, or a spec longer
than `MAX_SPEC_CHARS`, is a 400 naming the field and what is wrong; whether a spec compiles is
the grammar threads' to say (`chatpage.engine.text.grammar`; `chatpage serve` answers its 400 naming
the field of `structured_field`). `write_structured` is the client's side (JSON as OpenAI's
response_format, the rest as vLLM's structured_outputs).
"""

from __future__ import annotations

import json
from typing import Any

from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.grammar import MAX_SPEC_CHARS
from chatpage.wire.errors import ApiError, bad_value

VLLM_KEYS = {
    "json": GrammarKind.JSON_SCHEMA,
    "regex": GrammarKind.REGEX,
    "choice": GrammarKind.CHOICE,
    "grammar": GrammarKind.GRAMMAR,
    "json_object": GrammarKind.JSON_OBJECT,
}
"""vLLM's structured_outputs keys and the grammar each is."""


def check_size(chars: int, where: str) -> None:
    """A 400 for specs of more than `MAX_SPEC_CHARS` (their compile would take seconds)."""
    if chars > MAX_SPEC_CHARS:
        raise ApiError(
            400,
            f"{where} is {chars} characters (as JSON); at most {MAX_SPEC_CHARS} are taken",
            where,
        )


def check_schema(schema: Any, where: str) -> str:
    """``schema`` as JSON text; a 400 unless it is a JSON schema (by its own meta-schema) of
    at most `MAX_SPEC_CHARS`."""
    import jsonschema

    if not isinstance(schema, dict):
        raise bad_value(where, "a JSON schema (an object)", schema)
    text = json.dumps(schema, sort_keys=True)
    check_size(len(text), where)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "".join(f"[{p!r}]" for p in e.absolute_path)
        raise ApiError(
            400,
            f"{where} is not a valid JSON schema: {e.message}" + (f" (at {path})" if path else ""),
            where,
        ) from None
    return text


def checked(spec: Structured, where: str) -> Structured:
    """``spec`` unless it is too long to compile (a 400 naming ``where``)."""
    check_size(len(spec.spec), where)
    return spec


def _schema_spec(schema: Any, where: str) -> Structured:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ApiError(400, f"{where} is not valid JSON: {e}", where) from None
    return Structured(GrammarKind.JSON_SCHEMA, check_schema(schema, where))


def _response_format(raw: Any) -> Structured | None:
    if not isinstance(raw, dict):
        raise bad_value("response_format", 'an object such as {"type": "json_object"}', raw)
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Structured(GrammarKind.JSON_OBJECT)
    if kind != "json_schema":
        raise bad_value("response_format.type", "text, json_object or json_schema", kind)
    spec = raw.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad_value("response_format.json_schema", "an object with a name and a schema", spec)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_value("response_format.json_schema.strict", "true or false", strict)
    # strict or not, the output follows the schema: chatpage always decodes under it
    return _schema_spec(
        spec.get("schema", {"type": "object"}), "response_format.json_schema.schema"
    )


def _structured_outputs(raw: Any) -> Structured | None:
    if not isinstance(raw, dict):
        raise bad_value("structured_outputs", 'an object such as {"regex": "[0-9]+"}', raw)
    given = [k for k, v in raw.items() if v is not None and v is not False]
    unknown = [k for k in given if k not in VLLM_KEYS]
    if unknown:
        raise ApiError(
            400,
            f"structured_outputs.{unknown[0]} is not supported; use one of {', '.join(VLLM_KEYS)}",
            f"structured_outputs.{unknown[0]}",
        )
    if len(given) != 1:
        raise ApiError(
            400,
            f"structured_outputs must set exactly one of {', '.join(VLLM_KEYS)}, got {len(given)}",
            "structured_outputs",
        )
    key = given[0]
    where, value = f"structured_outputs.{key}", raw[key]
    kind = VLLM_KEYS[key]
    if kind is GrammarKind.JSON_SCHEMA:
        return _schema_spec(value, where)
    if kind is GrammarKind.JSON_OBJECT:
        return Structured(kind)
    if kind is GrammarKind.CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise bad_value(where, "a non-empty list of strings", value)
        return checked(Structured(kind, json.dumps(value)), where)
    if not isinstance(value, str) or not value:
        raise bad_value(where, "a non-empty string", value)
    return checked(Structured(kind, value), where)


def structured_field(body: dict[str, Any]) -> str:
    """The field of ``body`` that asks for a grammar (what its 400 names)."""
    fmt = body.get("response_format")
    if fmt is not None:
        return "response_format.json_schema.schema"
    given = [k for k, v in body["structured_outputs"].items() if v is not None and v is not False]
    return f"structured_outputs.{given[0]}"


def read_structured(body: dict[str, Any]) -> Structured | None:
    """The grammar a request body asks its output to follow (None: free text)."""
    fmt, vllm = body.get("response_format"), body.get("structured_outputs")
    if fmt is not None and vllm is not None:
        raise ApiError(
            400, "use response_format or structured_outputs, not both", "structured_outputs"
        )
    if fmt is not None:
        return _response_format(fmt)
    return _structured_outputs(vllm) if vllm is not None else None


SCHEMA_NAME = "output"
"""The name a JSON schema is sent under (response_format.json_schema.name)."""


def write_structured(spec: Structured) -> dict[str, Any]:
    """The request fields asking for ``spec``: a JSON schema or object as ``response_format``
    (every OpenAI-compatible server reads it), a regex, choice or grammar as vLLM's
    ``structured_outputs``."""
    if spec.kind is GrammarKind.JSON_OBJECT:
        return {"response_format": {"type": "json_object"}}
    if spec.kind is GrammarKind.JSON_SCHEMA:
        schema = json.loads(spec.spec)
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": True},
            }
        }
    key = next(k for k, kind in VLLM_KEYS.items() if kind is spec.kind)
    value = json.loads(spec.spec) if spec.kind is GrammarKind.CHOICE else spec.spec
    return {"structured_outputs": {key: value}}
