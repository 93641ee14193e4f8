"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import msgspec

_encoder = msgspec.json.Encoder()


class ProxyError(Exception):
    """An error the proxy answers itself, with an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return _encoder.encode({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_request") -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", code, param)


def upstream_unreachable(detail: str) -> ProxyError:
    return ProxyError(502, f"upstream unreachable: {detail}", "upstream_error", "upstream_unreachable")


def upstream_timeout(detail: str) -> ProxyError:
    return ProxyError(504, f"upstream timed out: {detail}", "upstream_error", "upstream_timeout")


_STATUS_TYPES = {
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "body_too_large"),
    429: ("rate_limit_error", "rate_limited"),
}


def from_status(status: int, message: str) -> ProxyError:
    type_, code = _STATUS_TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return ProxyError(status, message, type_, code)
