"""The server's own OpenAPI document (``GET /openapi.json``): FastAPI's, from the request models, with each POST
endpoint's answers stated as the server sends them: ``200`` as the ``openai`` package's type of the answer (JSON)
or server-sent events, and every error status as OpenAI's error object. FastAPI's ``422`` is left out: the server
answers a body its model refuses with a ``400`` (:func:`~asymspec_mm.serve.models_fields.request_error`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorObject(BaseModel):
    """OpenAI's error object: a one-line ``message`` naming the problem, its ``type``, the request field (``param``)
    and a snake_case ``code``."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    error: ErrorObject


#: One server-sent event (OpenAPI before 3.2 describes each event of a stream with ``schema``): its ``data`` is the
#: JSON text of a chunk (an error object when the answer fails mid-stream) or ``[DONE]``; ``event`` names a
#: Responses API event.
SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string", "contentMediaType": "application/json"}, "event": {"type": "string"}},
    "required": ["data"],
}
#: The statuses a POST endpoint answers with besides 200, and why.
ERRORS = {
    400: "a field the server refuses (the message names it), or a request the model cannot answer",
    401: "a missing or wrong API key",
    413: "a body over --max-request-mb",
    429: "the queue is full (Retry-After)",
    500: "an internal error",
    503: "the server is shutting down or cannot decode",
}


def _answer_type(name: str) -> type:
    if name == "ChatCompletion":
        from openai.types.chat import ChatCompletion

        return ChatCompletion
    if name == "Completion":
        from openai.types import Completion

        return Completion
    from openai.types.responses import Response

    return Response


def answer_docs(name: str) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a POST route whose answer is the ``openai`` package's type ``name`` (``ChatCompletion``,
    ``Completion`` or ``Response``) or, with ``stream: true``, server-sent events."""
    docs: dict[int | str, dict[str, Any]] = {
        200: {
            "model": _answer_type(name),
            "description": f"the answer ({name}); with stream=true, server-sent events",
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        }
    }
    docs.update({status: {"model": ErrorResponse, "description": why} for status, why in ERRORS.items()})
    return docs


def openapi_of(app: Any) -> dict[str, Any]:
    """The app's OpenAPI document (made once), without FastAPI's 422 answers."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description="asymspec-mm's OpenAI-compatible server")
        for item in doc.get("paths", {}).values():
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            doc.get("components", {}).get("schemas", {}).pop(unused, None)
        app.openapi_schema = doc
    return app.openapi_schema
