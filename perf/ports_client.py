"""The measuring client of ``perf.bench_ports``, run as a process of its own: the same code times the request
through grove's port proxy and straight to the server (then inside the sandbox's network namespace).

``python -m perf.ports_client BASE_URL [--key KEY] --requests N --messages M --bytes B`` prints one JSON object:
the seconds of each HTTP request (one keep-alive session, sequential), of each WebSocket message round trip,
and of one streamed download of B bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp


async def measure(base: str, key: str | None, requests: int, messages: int, size: int,
                  http_only: bool = False) -> dict[str, Any]:
    """Time requests, message round trips and one download against the server at ``base`` (only the requests
    with ``http_only``)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(20):  # warm-up: connections and tunnels made, code paths hot
            async with http.get(f"{base}/hello") as resp:
                await resp.read()
        http_s = []
        for _ in range(requests):
            began = time.perf_counter()
            async with http.get(f"{base}/hello") as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            http_s.append(time.perf_counter() - began)
        if http_only:
            return {"http_s": http_s}
        ws_s = []
        async with http.ws_connect(f"{base}/ws") as ws:
            for i in range(messages):
                began = time.perf_counter()
                await ws.send_str(f"message {i}")
                await ws.receive_str()
                ws_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        got = 0
        async with http.get(f"{base}/stream", params={"bytes": str(size)}) as resp:
            async for chunk in resp.content.iter_chunked(1 << 20):
                got += len(chunk)
        stream_s = time.perf_counter() - began
        assert got == size, (got, size)
    return {"http_s": http_s, "ws_s": ws_s, "stream_s": stream_s, "stream_bytes": size}


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.ports_client")
    parser.add_argument("base")
    parser.add_argument("--key")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--bytes", type=int, default=200 * 1024 * 1024)
    parser.add_argument("--http-only", action="store_true", help="only the requests (for CPU accounting)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.base, args.key, args.requests, args.messages, args.bytes,
                                         args.http_only))))


if __name__ == "__main__":
    main()
