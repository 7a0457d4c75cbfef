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


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> RequestError:
    return RequestError(400, message, param=param, code=code)
