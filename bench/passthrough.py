"""A bare aiohttp pass-through proxy: the throughput ceiling of this stack (aiohttp + uvloop).

Every request is forwarded to ``--upstream`` with the same method, path and query, its body, and
its headers minus the hop-by-hop ones; the status, headers (minus hop-by-hop and framing) and
body come back, relayed chunk by chunk as they arrive (so SSE streams are not buffered). One
pooled ``ClientSession`` with no connection limit. No auth, parsing, admission or logging: this
is what any proxy on this stack pays at the least.

    python bench/passthrough.py --upstream http://127.0.0.1:8001 --port 8090
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Final

import aiohttp
from aiohttp import web

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class PassThrough:
    """Forwards every request to one upstream origin."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        """Open the pooled session (needs the running loop)."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self, app: web.Application) -> None:
        """Close the pooled session."""
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Forward one request and relay the answer as it arrives."""
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self.session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


async def serve(upstream: str, host: str, port: int, handler_cancellation: bool = False) -> None:
    """Serve until SIGTERM or SIGINT."""
    proxy = PassThrough(upstream)
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.close)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=handler_cancellation
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", required=True, help="origin, http://127.0.0.1:PORT")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--handler-cancellation",
        action="store_true",
        help="cancel a handler when its client disconnects, as iop-edge does (issue 16 measured "
        "what that costs per request)",
    )
    options = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(options.upstream, options.host, options.port, options.handler_cancellation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
