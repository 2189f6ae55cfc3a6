"""The route table: every served endpoint in one visible list, and the OpenAPI document generated from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from grove.core.api import ExecBody
from grove.core.errors import GroveError
from router.api.artifacts import get_artifact, list_artifacts, list_sandbox_artifacts
from router.api.batch import create_sandboxes
from router.api.builds import BuildQuery, build_image
from router.api.checkpoints import (
    create_checkpoint,
    delete_checkpoint,
    fork_sandbox,
    get_checkpoint,
    list_checkpoints,
)
from router.api.commit import commit_sandbox, derive_image
from router.api.compat.e2b import control as e2b
from router.api.compat.e2b import envd
from router.api.compat.e2b import ports as e2b_ports
from router.api.compat.e2b.wire import e2b_error_body
from router.api.compat.fusion.models import RunCodeBody
from router.api.compat.fusion.run import run_code
from router.api.computer import computer_handler, display_handler, screenshot_handler
from router.api.datapath import exec_handler, transfer
from router.api.image_models import CommitRequest, DeriveRequest
from router.api.images import get_image
from router.api.mcp import mcp_handler, publish_mcp, unpublish_mcp
from router.api.openapi import build_spec
from router.api.pools import create_pool, delete_pool, get_pool, list_pools, resize_pool
from router.api.ports import port_handler, port_url_handler
from router.api.processes import (
    get_process,
    list_processes,
    process_logs,
    signal_process,
    start_process,
    wait_process,
)
from router.api.projects import get_project, list_projects
from router.api.pty import pty_handler
from router.api.replay import replay_trajectory
from router.api.runs import get_run_file, list_run_files, put_run_file
from router.api.sandboxes import create_sandbox, delete_sandbox, get_sandbox, healthz, heartbeat, list_sandboxes
from router.api.snapshots import snapshot_upload
from router.api.storage import GcRequest, storage_gc, storage_report
from router.api.swerex import swerex_handler
from router.api.trajectories import (
    get_live_trajectory,
    get_trajectory,
    list_trajectories,
    post_artifacts,
    post_events,
)
from router.checkpoints.models import ForkRequest
from router.lifecycle.replay import ReplayRequest
from router.models import (
    ArtifactQuery,
    BatchCreateRequest,
    CreateRequest,
    Empty,
    EventsRequest,
    FetchQuery,
    PoolRequest,
    PoolResize,
    PushRequest,
    SandboxArtifactQuery,
)
from router.ports.models import McpServerRequest, PortUrlRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PORT_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""The methods the port proxy takes on the API path (HEAD, CONNECT and TRACE stay out; the host-named listener
takes any)."""


@dataclass(frozen=True)
class Route:
    """One served endpoint; the OpenAPI document is generated from this table."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type | None = None
    public: bool = False
    raw_body: str | None = None
    """Content type of a raw (streamed) request body, for the spec."""
    key_header: str | None = None
    """A header that may carry the API key instead of ``Authorization`` (SWE-ReX's client sends ``X-API-Key``)."""
    query: type | None = None
    """The model of the query parameters, for the spec (the handler parses them with it)."""
    own_auth: bool = False
    """The handler checks a bearer credential of its own instead of an API key (an executor's upload token)."""
    basic_auth: bool = False
    """The key may come as the password of HTTP Basic auth: for clients that can only carry credentials in
    their URL (SandboxFusion's and verl's: ``http://grove:KEY@host/sandbox-fusion``)."""
    error_body: Callable[[GroveError], dict[str, Any]] | None = None
    """The body an error answers in on this route, if not grove's (E2B's clients parse ``{"code", "message"}``)."""


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_spec(ROUTES))


def _e2b(method: str, path: str, handler: Handler, summary: str, *, sandbox_side: bool = False) -> Route:
    """A route of the E2B API: the key in E2B's header, E2B's errors. The sandbox side checks envd's access token
    (or the traffic token) itself, and sends a request naming another port than envd's to that port."""
    served = e2b_ports.or_port(handler) if sandbox_side else handler
    return Route(method, "/e2b" + path, served, "E2B: " + summary, raw_body="application/json",
                 key_header="X-Access-Token" if sandbox_side else "X-API-KEY", error_body=e2b_error_body,
                 own_auth=sandbox_side)


E2B_ROUTES = [
    _e2b("POST", "/sandboxes", e2b.create, "create a sandbox (templateID, timeout, metadata, envVars)"),
    _e2b("POST", "/v2/sandboxes", e2b.create, "create a sandbox (templateID, timeout, metadata, envVars)"),
    _e2b("GET", "/sandboxes/{id}", e2b.get, "a sandbox's details"),
    _e2b("DELETE", "/sandboxes/{id}", e2b.kill, "kill a sandbox"),
    _e2b("POST", "/sandboxes/{id}/timeout", e2b.set_timeout, "set the sandbox's timeout from now"),
    _e2b("POST", "/sandboxes/{id}/connect", e2b.connect, "connect to a sandbox (its timeout extended)"),
    _e2b("POST", "/v2/sandboxes/{id}/connect", e2b.connect, "connect to a sandbox (its timeout extended)"),
    _e2b("GET", "/sandbox/health", envd.health, "envd: the sandbox (E2b-Sandbox-Id) is there", sandbox_side=True),
    _e2b("GET", "/sandbox/files", envd.files, "envd: read a file (?path=)", sandbox_side=True),
    _e2b("POST", "/sandbox/files", envd.files, "envd: write files (multipart, or octet-stream to ?path=)",
         sandbox_side=True),
    _e2b("POST", "/sandbox/{service}/{method}", envd.rpc,
         "envd Connect-RPC (JSON codec): process.Process Start/Connect (streaming), List, SendSignal, SendInput, "
         "CloseStdin; filesystem.Filesystem Stat, ListDir, MakeDir, Move, Remove", sandbox_side=True),
    *(_e2b(method, "/sandbox/{tail:.*}", e2b_ports.not_envd,
           "a server in the sandbox on the port E2b-Sandbox-Port names (HTTP or WebSocket), through the port proxy",
           sandbox_side=True)
      for method in ("GET", "POST", "PUT", "PATCH", "DELETE")),
    *(_e2b(method, "/{tail:.*}", e2b.unsupported,
           "any other call: 404 in E2B's error body, as E2B answers a call it does not serve")
      for method in ("GET", "POST", "PUT", "PATCH", "DELETE")),
]

ROUTES: list[Route] = [
    Route("GET", "/healthz", healthz, "Health of the router", public=True),
    Route("GET", "/v1/openapi.json", openapi, "This API's OpenAPI 3 document", public=True),
    Route("POST", "/v1/sandboxes", create_sandbox, "Create a sandbox", body=CreateRequest),
    Route("POST", "/v1/sandboxes/batch", create_sandboxes,
          "Create up to 1,000 sandboxes in one call; each item answered on its own, in order",
          body=BatchCreateRequest),
    Route("GET", "/v1/sandboxes", list_sandboxes, "List live sandboxes (?label=k=v, ?status=)"),
    Route("GET", "/v1/sandboxes/{id}", get_sandbox, "A sandbox's status"),
    Route("DELETE", "/v1/sandboxes/{id}", delete_sandbox, "Delete a sandbox and everything in it"),
    Route("GET", "/v1/images/{name:.+}", get_image,
          "Whether the backend has an image (or can pull it): its digest, or 404 naming the known ones"),
    Route("POST", "/v1/images/build", build_image,  # before the next: "build" names no image
          "Build a Dockerfile (the body: the context's tar); the output streams as JSON lines, then the image",
          raw_body="application/x-tar", query=BuildQuery),
    Route("POST", "/v1/images/{name:.+}", derive_image,
          "A new image of another's layers with its own config and build record (a build's last step)",
          body=DeriveRequest),
    Route("POST", "/v1/sandboxes/{id}/commit", commit_sandbox,
          "The sandbox's writable layer, consistent at one instant, as a named image on its own image",
          body=CommitRequest),
    Route("GET", "/v1/projects", list_projects,
          "Projects: quotas and retention against what each holds (a key: its own; an admin's X-Grove-Project: *, "
          "all)"),
    Route("GET", "/v1/projects/{name}", get_project, "One project: its quotas, retention and use"),
    Route("POST", "/v1/pools", create_pool, "Define a warm pool of ready sandboxes", body=PoolRequest),
    Route("GET", "/v1/pools", list_pools, "List warm pools"),
    Route("GET", "/v1/pools/{name}", get_pool, "A warm pool: size, ready, starting, claims, misses"),
    Route("PATCH", "/v1/pools/{name}", resize_pool, "Resize a warm pool", body=PoolResize),
    Route("DELETE", "/v1/pools/{name}", delete_pool, "Delete a warm pool and its unclaimed sandboxes"),
    Route("POST", "/v1/sandboxes/{id}/checkpoints", create_checkpoint,
          "Checkpoint a sandbox: its files consistent at one instant (processes frozen only for it)", body=Empty),
    Route("GET", "/v1/sandboxes/{id}/checkpoints", list_checkpoints, "A sandbox's checkpoints, oldest first"),
    Route("GET", "/v1/sandboxes/{id}/checkpoints/{checkpoint}", get_checkpoint, "One checkpoint"),
    Route("DELETE", "/v1/sandboxes/{id}/checkpoints/{checkpoint}", delete_checkpoint, "Delete a checkpoint"),
    Route("POST", "/v1/sandboxes/{id}/fork", fork_sandbox,
          "N new sandboxes with this one's files as they are now (files only); it keeps running", body=ForkRequest),
    Route("POST", "/v1/sandboxes/{id}/heartbeat", heartbeat, "Keep a sandbox alive", body=Empty),
    Route("POST", "/v1/sandboxes/{id}/exec", exec_handler, "Run a command (?stream=1 streams)", body=ExecBody),
    Route("POST", "/v1/sandboxes/{id}/computer", computer_handler,
          "One computer-use action (Anthropic's {\"action\"} or OpenAI's {\"type\"}); the screen after it, "
          "recorded"),
    Route("GET", "/v1/sandboxes/{id}/display", display_handler, "The sandbox's screen: running, its size"),
    Route("POST", "/v1/sandboxes/{id}/display", display_handler,
          "Start the sandbox's screen ({\"browser\": URL} opens Chromium there)"),
    Route("GET", "/v1/screenshots/{sha}", screenshot_handler,
          "A stored screenshot of the project by its sha256 (?thumb=1: its thumbnail)"),
    Route("POST", "/v1/sandboxes/{id}/processes", start_process,
          "Start a background process ({command, env?, cwd?, user?}): it outlives the call; 201 with its pid"),
    Route("GET", "/v1/sandboxes/{id}/processes", list_processes, "The sandbox's background processes"),
    Route("GET", "/v1/sandboxes/{id}/processes/{pid}", get_process,
          "A background process: status (running│exited), exit code"),
    Route("GET", "/v1/sandboxes/{id}/processes/{pid}/logs", process_logs,
          "A background process's output (?offset=; ?follow=1 streams it until the process ends)"),
    Route("POST", "/v1/sandboxes/{id}/processes/{pid}/signal", signal_process,
          "Signal a background process's group ({\"signal\": \"SIGTERM\"})"),
    Route("POST", "/v1/sandboxes/{id}/processes/{pid}/wait", wait_process,
          "Wait for a background process to end ({\"timeout_s\": 30}, at most 280)"),
    Route("GET", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Read a file (?path=)"),
    Route("PUT", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Write a file atomically (?path=&mode=)",
          raw_body="application/octet-stream"),
    Route("DELETE", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Delete a file (?path=&recursive=1)"),
    Route("GET", "/v1/sandboxes/{id}/files/list", transfer("/v1/files/list", "file"), "List a directory (?path=)"),
    Route("GET", "/v1/sandboxes/{id}/files/manifest", transfer("/v1/files/manifest", "file"),
          "Every entry under a directory with type, mode, size and a file's sha256 (?path=&skip=NAME...)"),
    Route("GET", "/v1/sandboxes/{id}/archive", transfer("/v1/archive", "archive"), "Tar of a directory (?path=)"),
    Route("PUT", "/v1/sandboxes/{id}/archive", transfer("/v1/archive", "archive"),
          "Extract a tar into a directory (?path=)", raw_body="application/x-tar"),
    Route("POST", "/v1/sandboxes/{id}/artifacts", post_artifacts,
          "Push files to S3 and index them; keys, sha256 and presigned GET URLs", body=PushRequest),
    Route("GET", "/v1/sandboxes/{id}/artifacts", list_sandbox_artifacts,
          "A sandbox's stored artifacts, live or deleted (paginated)", query=SandboxArtifactQuery),
    Route("GET", "/v1/artifacts", list_artifacts, "Stored artifacts by sandbox, task or run (paginated)",
          query=ArtifactQuery),
    Route("GET", "/v1/artifacts/{sandbox_id}/{path:.+}", get_artifact,
          "One artifact's bytes (Range: 206/416; X-Grove-Sha256), or ?redirect=1: 307 to a fresh presigned URL",
          query=FetchQuery),
    Route("POST", "/v1/sandboxes/{id}/events", post_events, "Append harness events to the trajectory",
          body=EventsRequest),
    Route("GET", "/v1/sandboxes/{id}/trajectory", get_live_trajectory, "The trajectory so far"),
    Route("GET", "/v1/trajectories", list_trajectories, "Stored trajectories (?task_id=&model=&harness=)"),
    Route("GET", "/v1/trajectories/{sandbox_id}", get_trajectory, "One trajectory, alive or stored"),
    Route("POST", "/v1/trajectories/{sandbox_id}/replay", replay_trajectory,
          "Re-run a trajectory's commands and file writes in a fresh sandbox of the same image digest, each step "
          "compared (409: the image is gone)", body=ReplayRequest),
    Route("PUT", "/v1/runs/{run_id}/files/{name}", put_run_file,
          "Store a rollout run's file in S3 under runs/<run_id>/<name>", raw_body="application/octet-stream"),
    Route("GET", "/v1/runs/{run_id}/files", list_run_files, "A rollout run's stored files"),
    Route("GET", "/v1/runs/{run_id}/files/{name}", get_run_file, "One stored file of a rollout run"),
    Route("GET", "/v1/storage", storage_report,
          "What each project stores: trajectories, pushed files, full outputs, run files (count, bytes), records "
          "spooled; for an admin, this host's image layers and how much nothing uses"),
    Route("POST", "/v1/storage/gc", storage_gc,
          "Collect what is past its project's retention and owned by nothing live (dry_run: only list it); an "
          "admin's X-Grove-Project: * covers every project and this host's unused image layers", body=GcRequest),
    # The executor's, not the users': it authenticates with its sandbox's upload token, not an API key.
    Route("POST", "/v1/sandboxes/{id}/snapshot-upload", snapshot_upload,
          "Executors only (Knative): start, extend, complete or abort a workspace snapshot's multipart upload",
          raw_body="application/json", own_auth=True),
    # Ports: the signed URL's route first (it shadows a server's own POST /url on that port).
    Route("POST", "/v1/sandboxes/{id}/ports/{port}/url", port_url_handler,
          "A signed URL of the host-named listener reaching this port, acting as this key until it expires",
          body=PortUrlRequest),
    *(Route(method, "/v1/sandboxes/{id}/ports/{port}/{tail:.*}", port_handler,
            "HTTP or WebSocket to this port on the sandbox's loopback, streamed both ways", raw_body="*/*")
      for method in PORT_METHODS),
    Route("GET", "/v1/sandboxes/{id}/pty", pty_handler,
          "A terminal (WebSocket): binary or {type: input} in, output out, {type: resize}; recorded as steps"),
    Route("PUT", "/v1/sandboxes/{id}/mcp/{name}", publish_mcp,
          "Publish an MCP server of the sandbox under a name: streamable HTTP on a port, or a stdio command started",
          body=McpServerRequest),
    Route("DELETE", "/v1/sandboxes/{id}/mcp/{name}/publication", unpublish_mcp,
          "Remove an MCP server's publication (a stdio server's process ends)"),
    *(Route(method, "/v1/sandboxes/{id}/mcp/{name}", mcp_handler,
            "A published MCP server, as streamable HTTP; each tool call recorded as a step", raw_body="*/*")
      for method in ("GET", "POST", "DELETE")),
    Route("GET", "/v1/sandboxes/{id}/swerex/{tail:.*}", swerex_handler, "SWE-ReX remote runtime: is_alive",
          key_header="X-API-Key"),
    Route("POST", "/v1/sandboxes/{id}/swerex/{tail:.*}", swerex_handler,
          "SWE-ReX remote runtime: create_session, run_in_session, close_session, execute, read_file, write_file, "
          "upload, close", raw_body="application/json", key_header="X-API-Key"),
    Route("POST", "/sandbox-fusion/run_code", run_code,
          "SandboxFusion's run_code: compile and run one program in a fresh sandbox of the project's "
          "'sandbox-fusion' warm pool; its RunCodeResponse", body=RunCodeBody, basic_auth=True),
    *E2B_ROUTES,
]
