"""Running the router: bind, print where it listens, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from grove.runfile import remove_run_file, write_run_file
from router.app import SERVICE, create_app
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
    print(f"  viewer: {url}/ui/ (log in with an API key)", flush=True)
    if new_key:
        print(f"created API key (shown once; kept in {settings.state_dir}/api_keys): {new_key}", flush=True)
    print(f"  stop it with Ctrl-C (sandboxes keep running) or `grove --state-dir {settings.state_dir} down` "
          "(stops every sandbox and stores its trajectory)", flush=True)
    write_run_file(settings.state_dir, url)
    if ready_file:
        with open(ready_file, "w", encoding="utf-8") as fh:
            fh.write(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    remove_run_file(settings.state_dir)
    left = len(app[SERVICE].registry.live())
    if left:
        print(f"grove router stopping: {left} sandbox(es) keep running, and nothing enforces their TTLs until the "
              f"next `grove --state-dir {settings.state_dir} up` re-adopts them; "
              f"`grove --state-dir {settings.state_dir} down` stops them and stores their trajectories",
              file=sys.stderr, flush=True)
    else:
        print("grove router stopping (no sandbox running)", file=sys.stderr, flush=True)
    await runner.cleanup()
