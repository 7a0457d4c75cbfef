"""The one error type of the server: an HTTP status plus OpenAI's error object."""

from __future__ import annotations

from typing import Any

#: OpenAI's error ``type`` of each status the server answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class RequestError(Exception):
    """A request the server refuses: ``status``, a one-line ``message`` naming the problem, the request field
    (``param``, e.g. ``asymspec.beta``) and a short machine ``code``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def renamed_param(param: str | None, params: dict[str, str]) -> str | None:
    """``param`` (an engine field's path) as the endpoint names it: the longest key of ``params`` that is the path
    or its head (followed by ``.`` or ``[``) replaced by its value, e.g. ``response_format.json_schema.schema`` with
    ``{"response_format.json_schema.schema": "text.format.schema"}``, ``response_format.regex`` with
    ``{"response_format": "structured_outputs"}``; unchanged when no key matches."""
    if param is None:
        return None
    for key in sorted(params, key=len, reverse=True):
        if param == key or param.startswith((key + ".", key + "[")):
            return params[key] + param[len(key) :]
    return param


def renamed(err: RequestError, params: dict[str, str]) -> RequestError:
    """``err`` naming the endpoint's field (:func:`renamed_param`), in its param and in its message."""
    new = renamed_param(err.param, params)
    if new != err.param:
        err.message = err.message.replace(str(err.param), str(new))
        err.param = new
    return err


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> RequestError:
    return RequestError(400, message, param=param, code=code)
