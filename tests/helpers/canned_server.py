"""A tiny HTTP server that answers every POST with bytes a test set, for an SDK to read.

The translation tests serve what the translation renders — an event stream as
``text/event-stream``, a whole answer as JSON, an error object with its status — to an official
SDK over a real socket on 127.0.0.1 (``http.server`` in a thread), so that the SDK parses it as
it parses the real API's; the server also keeps each request's body, so that the request
translation is checked on the SDK's own serialisation.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


class CannedServer:
    """Answers every POST with the answer set last (:meth:`answer`) and keeps each request's
    body, on 127.0.0.1 at a free port, in a thread of its own."""

    def __init__(self) -> None:
        self.status = 200
        self.content_type = "application/json"
        self.body = b""
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                server.requests.append(orjson.loads(self.rfile.read(length)))
                self.send_response(server.status)
                self.send_header("Content-Type", server.content_type)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # (the test's output is the assertions')

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # (shutdown() waits for the loop's next poll: a short one keeps each test's teardown short)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(
        self, body: bytes, *, status: int = 200, content_type: str = "application/json"
    ) -> None:
        self.body, self.status, self.content_type = body, status, content_type

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
