"""Pin the parts of OpenAI's OpenAPI document that the server's tests validate against.

The server's contract is OpenAI's published OpenAPI document (https://github.com/openai/openai-openapi, MIT
licence). The whole document is 3.4 MB; the tests need the request and answer schemas of three endpoints. This
script takes the named component schemas and every schema they reach through ``$ref`` (the closure, so the pinned
file resolves on its own), drops the prose (``description``, ``example``, ``x-*`` annotations: no validation reads
them), and writes them with the commit and path they came from::

    git clone https://github.com/openai/openai-openapi && cd openai-openapi
    python scripts/pin_openai_contract.py --spec openapi.json --commit "$(git rev-parse HEAD)"

The output is ``tests/data/openai_openapi/contract.json``; ``tests/data/openai_openapi/NOTICE.md`` carries the
licence. Re-running it with a newer document and the tests tells what changed upstream.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The component schemas the tests validate against (requests and answers of the three POST endpoints).
ROOTS = (
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionRequest",
    "CreateCompletionResponse",
    "CreateResponse",
    "Response",
    "ResponseStreamEvent",
    "ErrorResponse",
)
#: Annotation keys that no validator reads (kept out to keep the file small).
PROSE = ("description", "example", "examples", "title", "deprecated")
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "openai_openapi" / "contract.json"
UPSTREAM = "https://github.com/openai/openai-openapi"


def refs_in(node: Any) -> set[str]:
    """The component names that ``node`` refers to (``#/components/schemas/<name>``)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                found.add(ref.rsplit("/", 1)[1])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> list[str]:
    """``roots`` and every schema they reach, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise SystemExit(f"error: the document has no component schema {name!r}")
        seen.add(name)
        todo.extend(refs_in(schemas[name]) - seen)
    return sorted(seen)


def without_prose(node: Any, in_properties: bool = False) -> Any:
    """``node`` without annotation keys; the keys of a ``properties`` map are field names, kept whatever they are."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not in_properties and (key in PROSE or key.startswith("x-")):
                continue
            out[key] = without_prose(value, in_properties=not in_properties and key in ("properties", "patternProperties"))
        return out
    if isinstance(node, list):
        return [without_prose(v) for v in node]
    return node


def pin(spec: dict[str, Any], commit: str, path: str) -> dict[str, Any]:
    """The pinned contract: where it came from and the schemas' closure."""
    schemas = spec["components"]["schemas"]
    names = closure(schemas, ROOTS)
    return {
        "source": {
            "repository": UPSTREAM,
            "commit": commit,
            "path": path,
            "openapi": spec.get("openapi"),
            "version": spec["info"]["version"],
        },
        "roots": list(ROOTS),
        "components": {"schemas": {name: without_prose(schemas[name]) for name in names}},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="openapi.json of a checkout of openai/openai-openapi")
    ap.add_argument("--commit", required=True, help="the checkout's commit (git rev-parse HEAD)")
    ap.add_argument("--path", default="openapi.json", help="the document's path in that repository")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    pinned = pin(spec, args.commit, args.path)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(pinned, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(pinned['components']['schemas'])} schemas from {args.commit[:12]} -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
