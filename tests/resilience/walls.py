"""Helpers of the trust tests: canary strings, a client that keeps every answer to scan it, the upstream's view,
test images whose bytes carry a canary, and a vision model that describes an image by the text in its bytes."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.e2e.conftest import EmulatorProcess
from tests.e2e.proxyproc import free_port


def canary(label: str) -> str:
    """A string no generated text contains (letters and digits, one token-ish run)."""
    return f"Canary{label}X{secrets.token_hex(6)}"


def png_with(text: str) -> tuple[str, str, bytes]:
    """(data URI, sha256 key, bytes) of a fake PNG whose bytes carry ``text``."""
    data = b"\x89PNG\r\n\x1a\n" + text.encode()
    return "data:image/png;base64," + base64.b64encode(data).decode(), hashlib.sha256(data).hexdigest(), data


def image_message(text: str, url: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}


class Recorder:
    """An httpx client for one tenant that keeps every answer (status, headers, body; streams whole)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.client = httpx.Client(timeout=120)
        self.answers: list[str] = []

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**auth, **(extra or {})}

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        r = self.client.request(method, self.base_url + path, headers=self.headers(headers), **kw)
        self.answers.append(f"{method} {path} {r.status_code}\n{json.dumps(dict(r.headers))}\n{r.text}")
        return r

    def chat(self, messages: list[dict[str, Any]], headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
        body = {"model": "m", "messages": messages, "max_tokens": 128, **extra}
        return self.request("POST", "/v1/chat/completions", headers=headers, json=body)

    def leaks(self, canaries: Iterable[str]) -> list[str]:
        """Every canary found in any answer kept (status line, headers, body, SSE events)."""
        text = "\n".join(self.answers)
        return [c for c in canaries if c in text]

    def close(self) -> None:
        self.client.close()


class UpstreamLog:
    """Every chat request the emulator received, collected from its ring buffer before it wraps."""

    def __init__(self, emulator: EmulatorProcess) -> None:
        self.emulator = emulator
        self.seen: dict[str, dict[str, Any]] = {}

    def collect(self) -> list[dict[str, Any]]:
        for item in self.emulator.requests(200):
            key = hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()
            self.seen.setdefault(key, item)
        return list(self.seen.values())

    def bodies_with(self, marker: str) -> list[str]:
        """The request bodies (as JSON text) that contain ``marker``: the prompts sent for one tenant."""
        texts = (json.dumps(item.get("body"), ensure_ascii=False) for item in self.collect())
        return [t for t in texts if marker in t]


class LocalServer:
    """An HTTP server on a loopback port, served by a thread (an OpenAI-style base URL at /v1)."""

    port: int

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class VisionStub(LocalServer):
    """An OpenAI-style vision model: describes an image as the text its bytes carry. Keeps what it was sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.images: list[bytes] = []
        self.urls: list[str] = []  # every image URL it was given (data URIs included)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                url = body["messages"][0]["content"][1]["image_url"]["url"]
                stub.urls.append(url)
                data = base64.b64decode(url.split(",", 1)[1]) if url.startswith("data:") else url.encode()
                stub.images.append(data)
                text = "A picture showing " + data[8:].decode(errors="replace")
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.serve(Handler)


class Tap(LocalServer):
    """A recording hop in front of the upstream: every request the proxy makes (method, path, all headers, body)
    is kept, then forwarded; the upstream's answer comes back whole (streams included)."""

    def __init__(self, upstream_base_url: str) -> None:
        self.port = free_port()
        self.requests: list[dict[str, Any]] = []
        self.upstream = upstream_base_url.rstrip("/")
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                tap.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                                     "body": body})
                path = self.path[len("/v1"):] if self.path.startswith("/v1") else self.path
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(self.command, tap.upstream + path, content=body or None, headers=headers,
                                  timeout=120)
                self.send_response(r.status_code)
                for name in ("content-type",):
                    if name in r.headers:
                        self.send_header(name, r.headers[name])
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

        self.serve(Handler)

    def holding(self, secret: str) -> list[str]:
        """The requests (method and path) whose headers or body hold ``secret``."""
        found = []
        for item in self.requests:
            text = json.dumps(item["headers"]) + item["body"].decode("utf-8", "replace")
            if secret in text:
                found.append(f"{item['method']} {item['path']}")
        return found
