"""Running the router: bind, print where it listens, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from router.app import create_app
from router.settings import RouterSettings


async def serve(settings: RouterSettings, *, new_key: str | None = None, ready_file: str | None = None) -> None:
    """Serve until a signal; sandboxes keep running after exit and are re-adopted on the next start."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=2048)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else settings.port
    url = f"http://{settings.host}:{port}"
    print(f"grove router listening on {url} (backend {settings.backend}, state dir {settings.state_dir})", flush=True)
    if new_key:
        print(f"created API key (shown once; kept in {settings.state_dir}/api_keys): {new_key}", flush=True)
    if ready_file:
        with open(ready_file, "w", encoding="utf-8") as fh:
            fh.write(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("grove router stopping (sandboxes keep running; the next start re-adopts them)", file=sys.stderr)
    await runner.cleanup()
