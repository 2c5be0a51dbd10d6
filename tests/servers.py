"""Local HTTP servers that speak the protocols sinal talks to: WhatsApp Cloud API,
OpenAI-compatible chat completions, and a plain webhook receiver. Real sockets, real HTTP;
they stand in for Meta and an AI vendor, never for sinal's own code."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import standardwebhooks


@dataclass
class Behaviour:
    """How the server answers the next requests."""

    status: int = 200
    delay: float = 0.0  # seconds before answering (past the client's timeout: a timeout)
    fail_times: int = 0  # answer `fail_status` (with `fail_body`, if given) this many times first
    fail_status: int = 503
    fail_body: bytes | None = None
    # Close this many connections first once their request is read, answering nothing (a
    # server, or a proxy before it, that crashed after the request arrived).
    hang_up_times: int = 0
    # Called with (request body, request number) before answering: what the far side does
    # meanwhile (Meta's status webhook outrunning the API's answer).
    before_answer: Callable[[Any, int], None] | None = None
    refusal: bytes | None = None  # the body of an answer of 400 or more, as sent
    # Called with (request body, request number) for the answer, instead of the server's own.
    answer: Callable[[Any, int], Any] | None = None
    # Seconds the answer's body takes to arrive: padded with spaces, a byte every 50 ms
    # (each read well within a client's timeout, their sum not).
    trickle: float = 0.0
    answer_headers: dict[str, str] = field(default_factory=dict)  # sent with every answer


@dataclass
class Recorder:
    """What a server received."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    behaviour: Behaviour = field(default_factory=Behaviour)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def bodies(self, path_suffix: str = "") -> list[dict[str, Any]]:
        """JSON bodies received at paths ending with `path_suffix`."""
        with self.lock:
            return [r["body"] for r in self.requests if r["path"].endswith(path_suffix)]


def _handler(recorder: Recorder, answer: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw) if raw else None
            with recorder.lock:
                hang_up = recorder.behaviour.hang_up_times > 0
                if hang_up:
                    recorder.behaviour.hang_up_times -= 1
                recorder.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body,
                        "raw": raw,  # the body's bytes, as a signature covers them
                        "received_at": time.time(),
                        "raw_headers": list(self.headers.keys()),
                    }
                )
                behaviour = recorder.behaviour
                failing = not hang_up and behaviour.fail_times > 0
                if failing:
                    behaviour.fail_times -= 1
                n = next(recorder.counter)
            if hang_up:  # closed without an answer, and reset (no linger)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))  # fmt: skip
                self.close_connection = True
                return
            if behaviour.before_answer is not None and not failing:
                behaviour.before_answer(body, n)
            if behaviour.delay:
                time.sleep(behaviour.delay)
            status = behaviour.fail_status if failing else behaviour.status
            payload = json.dumps(
                (behaviour.answer or answer)(body, n)
                if status < 400
                else {"error": {"message": "unavailable" if failing else "refused", "code": status}}
            ).encode()
            if status >= 400 and not failing and behaviour.refusal is not None:
                payload = behaviour.refusal
            if failing and behaviour.fail_body is not None:
                payload = behaviour.fail_body
            trickled = b" " * int(behaviour.trickle / 0.05)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload) + len(trickled)))
            for name, value in behaviour.answer_headers.items():
                self.send_header(name, value)
            self.end_headers()
            with suppress(OSError):  # the client gave up (a timeout): fine
                self.wfile.write(payload)
                for byte in trickled:
                    self.wfile.flush()
                    time.sleep(0.05)
                    self.wfile.write(bytes([byte]))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def _serve(answer: Any, port: int = 0) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(recorder, answer))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    finally:
        server.shutdown()
        server.server_close()


def _whatsapp_answer(body: Any, n: int) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "contacts": [{"input": body.get("to"), "wa_id": body.get("to")}],
        "messages": [{"id": f"wamid.LOCAL{n:08d}"}],
    }


def _ai_answer(body: Any, n: int) -> dict[str, Any]:
    question = body["messages"][-1]["content"]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": f"Resposta: {question}"}}],
    }  # fmt: skip


def whatsapp_server(port: int = 0) -> Any:
    """A WhatsApp Cloud API: POST /{phone_number_id}/messages → {"messages": [{"id": wamid}]};
    on `port` if given (a free one otherwise)."""
    return _serve(_whatsapp_answer, port)


def meta_error(code: int, message: str, details: str = "") -> bytes:
    """The body of the Cloud API's refusal with Meta's error `code`, as Graph API writes it."""
    error: dict[str, Any] = {"message": f"(#{code}) {message}", "type": "OAuthException",
                             "code": code, "fbtrace_id": "AbCdEf123"}  # fmt: skip
    if details:
        error["error_data"] = {"messaging_product": "whatsapp", "details": details}
    return json.dumps({"error": error}).encode()


def ai_server() -> Any:
    """An OpenAI-compatible /chat/completions endpoint."""
    return _serve(_ai_answer)


def verify_signature(secret: str, request: dict[str, Any]) -> tuple[str, int]:
    """Check a received request's Standard Webhooks signature as a receiver does, by hand
    (the spec's few lines) and with the reference library; its webhook-id and timestamp."""
    headers = {k.lower(): v for k, v in request["headers"].items()}
    message_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + request["raw"]
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    given = [entry.split(",", 1) for entry in headers["webhook-signature"].split(" ")]
    assert any(v == "v1" and hmac.compare_digest(sig, expected) for v, sig in given), headers
    standardwebhooks.Webhook(secret).verify(request["raw"], headers)  # raises if not
    return message_id, int(timestamp)


def webhook_receiver() -> Any:
    """A receiver that accepts anything with {"ok": true}."""
    return _serve(lambda body, n: {"ok": True})
