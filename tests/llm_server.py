"""A real OpenAI-compatible chat server on 127.0.0.1 for the `llm` generator's tests.

Each request takes the next scripted action (or, once the script is spent, `default`): a chat
reply, a bare status with headers, a slow reply, a dropped connection or a malformed body. Every
request is recorded (body, headers, the action it got) so tests can count retries.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Action:
    kind: str  # "reply" | "status" | "raw" | "slow" | "drop"
    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    usage: tuple[int, int] = (100, 50)  # prompt, completion tokens
    finish_reason: str = "stop"


def reply(
    content: str, prompt_tokens: int = 100, completion_tokens: int = 50, finish: str = "stop"
) -> Action:
    return Action("reply", content, usage=(prompt_tokens, completion_tokens), finish_reason=finish)


def status(code: int, headers: dict[str, str] | None = None, body: str = "") -> Action:
    return Action("status", body, status=code, headers=headers or {})


def raw(body: str, code: int = 200) -> Action:
    return Action("raw", body, status=code)


def slow(delay_s: float, content: str = "") -> Action:
    return Action("slow", content, delay_s=delay_s)


def drop() -> Action:
    return Action("drop")


@dataclass
class Request:
    body: dict[str, Any]
    headers: dict[str, str]
    action: str
    at: float


class LLMServer:
    """`with LLMServer(script) as s:` serves on s.base_url until the block ends."""

    def __init__(
        self,
        script: list[Action] | None = None,
        default: Action | Callable[[dict[str, Any]], Action] | None = None,
        models: tuple[str, ...] = ("test-model",),
        models_status: int = 200,
        port: int = 0,
    ) -> None:
        self.script = list(script or [])
        self.models = models  # GET {base}/models lists these (or answers models_status when not 200)
        self.models_status = models_status
        self.default = default if default is not None else status(500, body="script exhausted")
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                data = self.rfile.read(length)
                try:
                    body = json.loads(data)
                except ValueError:
                    body = {}
                action = server._next(body)
                with server.lock:
                    server.requests.append(
                        Request(
                            body, {k.lower(): v for k, v in self.headers.items()}, action.kind, time.time()
                        )
                    )
                server._serve(self, action, body)

            def do_GET(self) -> None:
                with server.lock:
                    server.requests.append(
                        Request({}, {k.lower(): v for k, v in self.headers.items()}, "get", time.time())
                    )
                if self.path.rstrip("/") != "/v1/models":
                    server._write(self, 404, b"not found", {"content-type": "text/plain"})
                elif server.models_status != 200:
                    server._write(self, server.models_status, b"refused", {"content-type": "text/plain"})
                else:
                    data = [{"id": m, "object": "model", "owned_by": "test"} for m in server.models]
                    body = json.dumps({"object": "list", "data": data}).encode()
                    server._write(self, 200, body, {"content-type": "application/json"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _next(self, body: dict[str, Any]) -> Action:
        with self.lock:
            if self.script:
                return self.script.pop(0)
        return self.default(body) if callable(self.default) else self.default

    def _serve(self, h: BaseHTTPRequestHandler, action: Action, body: dict[str, Any]) -> None:
        if action.kind == "drop":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if action.kind == "slow":
            time.sleep(action.delay_s)
            action = reply(action.content)
        if action.kind == "reply":
            payload = {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "test"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": action.content},
                        "finish_reason": action.finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": action.usage[0],
                    "completion_tokens": action.usage[1],
                    "total_tokens": sum(action.usage),
                },
            }
            self._write(h, 200, json.dumps(payload).encode(), {"content-type": "application/json"})
        else:
            ctype = {"content-type": "application/json" if action.kind == "raw" else "text/plain"}
            self._write(h, action.status, action.content.encode(), {**ctype, **action.headers})

    @staticmethod
    def _write(h: BaseHTTPRequestHandler, code: int, data: bytes, headers: dict[str, str]) -> None:
        try:
            h.send_response(code)
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("content-length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except OSError:  # the client gave up (a timeout test)
            pass

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def __enter__(self) -> LLMServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
