"""A scripted chat-completions server on 127.0.0.1, for testing the LLM agent end to end.

It speaks just enough of the OpenAI protocol (``POST /v1/chat/completions`` with tool calls,
``usage`` included) for the real ``openai`` client. Each request consumes the next step of a
script: a reply (tool calls and/or text), an HTTP error, or a hang. When the script runs out
it answers with plain text and no tool call, so a misbehaving agent loop still ends.
Requests are recorded (body and headers) for the tests to inspect.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from pytest_kopt.judge import candidate_id  # noqa: F401  (the tests' scripts name candidates by it)


@dataclass
class Reply:
    """An assistant turn: ``calls`` are (tool name, arguments) with arguments a dict or raw text."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    content: str | None = None
    quirky: bool = False  # as a few self-hosted servers do: arguments as an object, no call ids


@dataclass
class Error:
    """An HTTP error status, e.g. 429 or 500; ``headers`` may carry ``retry-after-ms``."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    message: str = ""


@dataclass
class Hang:
    """Hold the request for ``seconds`` (past the client's time-out), then answer with an error."""

    seconds: float


Step = Reply | Error | Hang | Callable[[dict], "Reply | Error | Hang"]


def call(tool: str, **args: Any) -> tuple[str, Any]:
    return (tool, args)


class FakeOpenAI:
    """Start with ``with FakeOpenAI(script) as server:``; ``server.base_url`` ends in ``/v1``."""

    def __init__(self, script: list[Step], *, prompt_tokens: Callable[[dict], int] | None = None):
        self.script = list(script)
        self.requests: list[dict] = []  # {"body", "headers", "step"}
        self.prompt_tokens = prompt_tokens or (lambda body: len(json.dumps(body.get("messages", []))) // 4)
        self._lock = threading.Lock()
        self._served = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> "FakeOpenAI":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.script) - self._served

    # ---- protocol -------------------------------------------------------------------
    def _next_step(self, body: dict) -> tuple[int, Step | None]:
        with self._lock:
            index = self._served
            self._served += 1
        step = self.script[index] if index < len(self.script) else None
        if callable(step) and not isinstance(step, (Reply, Error, Hang)):
            step = step(body)
        return index, step

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(h, 400, {"error": {"message": "body is not JSON"}})
            return
        if not h.path.rstrip("/").endswith("/chat/completions"):
            self._send(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        index, step = self._next_step(body)
        self.requests.append({"body": body, "headers": {k.lower(): v for k, v in h.headers.items()}, "step": index})
        if isinstance(step, Hang):
            time.sleep(step.seconds)  # bounded: the client has long since given up
            self._send(h, 504, {"error": {"message": "hung"}})
        elif isinstance(step, Error):
            self._send(h, step.status, {"error": {"message": step.message or f"scripted {step.status}", "type": "scripted"}}, step.headers)
        else:
            reply = step if isinstance(step, Reply) else Reply(content="(script finished) I have nothing more to try.")
            self._send(h, 200, self._completion(body, reply, index))

    def _completion(self, body: dict, reply: Reply, index: int) -> dict:
        tool_calls = []
        for n, (name, args) in enumerate(reply.calls):
            arguments = args if isinstance(args, str) or reply.quirky else json.dumps(args)
            tool_call = {"id": f"call_{index}_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
            if reply.quirky:
                del tool_call["id"]
            tool_calls.append(tool_call)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt = int(self.prompt_tokens(body))
        completion = len(json.dumps(message)) // 4
        return {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": 1700000000 + index,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and went away

