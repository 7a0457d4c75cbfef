"""OpenAI's OpenAPI document as the tests read it: the pinned component schemas (``tests/data/openai_openapi``,
written by ``scripts/pin_openai_contract.py``) as JSON Schema validators, and the request fields of a schema.

The document declares OpenAPI 3.1 but still marks many fields with 3.0's ``nullable: true``, which JSON Schema
itself ignores; the loader reads ``nullable`` as OpenAPI means it (``null`` allowed as well), so that a ``null``
the document allows is not reported as a violation.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

PINNED = Path(__file__).resolve().parent / "data" / "openai_openapi" / "contract.json"


@functools.cache
def pinned() -> dict[str, Any]:
    """The pinned file: ``source`` (repository, commit, path), ``roots`` and ``components.schemas``."""
    return json.loads(PINNED.read_text(encoding="utf-8"))


def with_nullable(node: Any) -> Any:
    """``node`` with every ``nullable: true`` schema turned into ``anyOf: [itself, null]``."""
    if isinstance(node, list):
        return [with_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: with_nullable(v) if k != "properties" else {p: with_nullable(s) for p, s in v.items()} for k, v in node.items()}
    if out.pop("nullable", False) is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


#: Schemas the tests derive from the document: the name -> how. The document gives ``POST /v1/completions`` no chunk
#: schema (its stream sends ``CreateCompletionResponse`` objects), and that schema's ``finish_reason`` is not
#: nullable, while OpenAI's stream (and the ``openai`` package's own stream handling) sends ``null`` until a choice
#: ends: the chunk schema is ``CreateCompletionResponse`` with a nullable ``finish_reason``, nothing else relaxed.
DERIVED = ("CreateCompletionChunk",)


@functools.cache
def _components() -> dict[str, Any]:
    components = with_nullable(pinned()["components"])
    chunk = json.loads(json.dumps(components["schemas"]["CreateCompletionResponse"]))
    finish = chunk["properties"]["choices"]["items"]["properties"]
    finish["finish_reason"] = {"anyOf": [finish["finish_reason"], {"type": "null"}]}
    components["schemas"]["CreateCompletionChunk"] = chunk
    return components


@functools.cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of component schema ``name`` (its ``$ref`` resolve inside the pinned components)."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"#/components/schemas/{name}",
        "components": _components(),
    }
    return jsonschema.Draft202012Validator(schema)


def violations(name: str, instance: Any) -> list[str]:
    """Where ``instance`` breaks schema ``name``, one line each (empty: it conforms). For an ``anyOf`` / ``oneOf``
    (the stream events) the branch that comes closest is the one reported."""
    errors = list(validator(name).iter_errors(instance))
    if not errors:
        return []
    best = jsonschema.exceptions.best_match(errors)
    shown = [best]
    while shown[-1].context:  # an anyOf: the branch whose "type" the instance has (the event), else best_match's pick
        branches: dict[Any, list] = {}
        for e in shown[-1].context:
            branches.setdefault(e.relative_schema_path[0], []).append(e)
        typed = [errs for errs in branches.values() if not any(list(e.relative_path) == ["type"] for e in errs)]
        pick = typed[0] if len(typed) == 1 else [jsonschema.exceptions.best_match(shown[-1].context)]
        shown = shown[:-1] + pick
        if len(pick) > 1 or not pick[0].context:
            break
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}" for e in shown[:6]]


def assert_conforms(name: str, instance: Any) -> None:
    """Fail naming each violation of schema ``name``."""
    problems = violations(name, instance)
    assert not problems, f"{name}: " + "; ".join(problems) + f"\n{json.dumps(instance)[:2000]}"


def request_properties(name: str) -> dict[str, Any]:
    """The properties of a request schema, its ``allOf`` parts (``CreateModelResponseProperties``, ...) merged."""
    schemas = pinned()["components"]["schemas"]
    schema = schemas[name]
    out: dict[str, Any] = {}
    for part in schema.get("allOf", [schema]):
        if "$ref" in part:
            out.update(request_properties(part["$ref"].rsplit("/", 1)[1]))
        else:
            out.update(part.get("properties", {}))
    return out
