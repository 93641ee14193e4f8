"""OpenAI-style error bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass
class ErrorReply(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        error_type = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ErrorReply:
    return ErrorReply(400, message, param, code)
