"""`ottvid serve`: check the flags, bind the port, load the model once, run uvicorn.

The port is bound before the model loads, so a busy port is a one-line error at once. SIGTERM (and
Ctrl-C) is uvicorn's graceful shutdown: no new connections, the requests in flight finish, then the
worker thread ends and the process exits 0.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from dataclasses import dataclass, field

import typer

from ..checks import DEFAULT_MAX_FRAMES, MAX_SINKHORN_ITER, check_count, check_positive
from .errors import EXIT_RUN, err, fail
from .options import CACHE, LOCAL, checked, with_options
from .progress import Progress
from .request import Request, cache_path, parse, settled
from .steps import load_model, make_engine

_SERVING = "Serving"  # serve's own options: the first heading of its --help


@dataclass(frozen=True)
class Serving:
    """serve's own flags: where it listens, who may use it, what one request may ask. `limits`: more
    ServeSettings (max_prompt_chars, max_request_frames, max_sinkhorn_iter, allowed_hosts)."""

    host: str
    port: int
    api_key: str | None
    allowed_media_dir: str | None
    max_upload_mb: float
    max_queue: int
    timeout: float
    limits: dict = field(default_factory=dict)


@with_options("model", "host", "port", "api_key", "allowed_media_dir", "max_upload_mb", "max_queue", "timeout",
              "max_prompt_chars", "max_request_frames", "max_sinkhorn_iter", "allowed_host", *CACHE, *LOCAL, "cuda_graphs")
def serve(
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS", rich_help_panel=_SERVING,
                             help="Address to listen on; 0.0.0.0 exposes the model to your network (then set "
                                  "--api-key)."),
    port: int = typer.Option(8000, "--port", metavar="PORT", rich_help_panel=_SERVING,
                             callback=checked(check_count, "--port", 0),
                             help="TCP port (0: any free one; the address is printed)."),
    api_key: str = typer.Option(None, "--api-key", metavar="KEY", rich_help_panel=_SERVING, envvar="OTTVID_API_KEY",
                                show_default="none", help="Require `Authorization: Bearer KEY` on /v1 requests."),
    allowed_media_dir: str = typer.Option(None, "--allowed-media-dir", metavar="DIR", rich_help_panel=_SERVING,
                                          show_default="none",
                                          help="Serve local videos (file:// or absolute paths) from under this folder "
                                               "only, symlinks and .. resolved."),
    max_upload_mb: float = typer.Option(100.0, "--max-upload-mb", metavar="MB", rich_help_panel=_SERVING,
                                        callback=checked(check_positive, "--max-upload-mb"),
                                        help="Largest video sent as a data: URL (413 beyond)."),
    max_queue: int = typer.Option(16, "--max-queue", metavar="N", rich_help_panel=_SERVING,
                                  callback=checked(check_count, "--max-queue", 0),
                                  help="Requests waiting for the model at most (503 with Retry-After beyond)."),
    timeout: float = typer.Option(300.0, "--timeout", metavar="SECONDS", rich_help_panel=_SERVING,
                                  callback=checked(check_positive, "--timeout"),
                                  help="Seconds a request may take, waiting included (504 beyond)."),
    max_prompt_chars: int = typer.Option(16384, "--max-prompt-chars", metavar="N", rich_help_panel=_SERVING,
                                         callback=checked(check_count, "--max-prompt-chars"),
                                         help="Longest question (with its choices) in characters (400 beyond)."),
    max_request_frames: int = typer.Option(DEFAULT_MAX_FRAMES, "--max-request-frames", metavar="N",
                                           rich_help_panel=_SERVING,
                                           callback=checked(check_count, "--max-request-frames"),
                                           help="Most frames one request may sample (ottvid.frames, max_frames; "
                                                "400 beyond)."),
    max_sinkhorn_iter: int = typer.Option(MAX_SINKHORN_ITER, "--max-sinkhorn-iter", metavar="N",
                                          rich_help_panel=_SERVING,
                                          callback=checked(check_count, "--max-sinkhorn-iter"),
                                          help="Most Sinkhorn iterations one request may ask for (method_args "
                                               "max_iter; 400 beyond)."),
    allowed_host: list[str] = typer.Option(None, "--allowed-host", metavar="NAME", rich_help_panel=_SERVING,
                                           show_default="none",
                                           help="Another name the server answers to in the Host header (a reverse "
                                                "proxy's; repeatable; '*' for any). Always: localhost, IP addresses, "
                                                "--host."),
    **options,
) -> None:
    """Serve the model over HTTP: a web page at / and an OpenAI-compatible API at /v1.

    The model is loaded once; /v1/chat/completions takes a video_url part. Needs the serve extra
    (FastAPI, uvicorn); API, errors and security rules: docs/serve.md."""
    limits = {"max_prompt_chars": max_prompt_chars, "max_request_frames": max_request_frames,
              "max_sinkhorn_iter": max_sinkhorn_iter, "allowed_hosts": tuple(allowed_host or ())}
    run_server(parse("serve", None, [], options), Serving(host, port, api_key, allowed_media_dir, max_upload_mb,
                                                          max_queue, timeout, limits))


def run_server(request: Request, serving: Serving) -> None:
    """Check serve's flags, bind the port, load the model, then serve until SIGTERM / SIGINT."""
    cache_dir = cache_path(request.cache.cache_dir, request.cache.cache_max_gb)
    request = settled(request, config_frames=False)
    model, quiet, limits = request.model.model, request.output.quiet, serving.limits
    host, port, api_key, allowed_media_dir = serving.host, serving.port, serving.api_key, serving.allowed_media_dir
    if port > 65535:
        fail(f"--port must be at most 65535, got {port}")
    for name in limits.get("allowed_hosts", ()):
        if not name.strip() or any(c in name for c in "/ \t"):
            fail(f"--allowed-host takes a host name (a proxy's, without scheme or path), got {name!r}")
    if api_key is not None and not api_key.strip():
        fail("--api-key (or OTTVID_API_KEY) is empty")
    if allowed_media_dir is not None:
        if not os.path.isdir(allowed_media_dir):
            fail(f"--allowed-media-dir must be an existing folder, got {allowed_media_dir}")
        allowed_media_dir = os.path.realpath(allowed_media_dir)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        fail("ottvid serve needs FastAPI and uvicorn: pip install 'ottvid-cli[serve]'", code=EXIT_RUN)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    progress = Progress(quiet)
    backbone = load_model(request.model, progress)
    progress.stop()

    from ..serve.app import ServeSettings, create_app

    settings = ServeSettings(model_id=model, api_key=api_key or None, allowed_media_dir=allowed_media_dir,
                             max_upload_mb=serving.max_upload_mb, max_queue=serving.max_queue,
                             timeout=serving.timeout, max_pixels=request.model.max_pixels,
                             decoder=request.sampling.decoder, host=host,
                             **{k: v for k, v in limits.items() if v is not None})
    app = create_app(make_engine(backbone, cache_dir, max_gb=request.cache.cache_max_gb,
                                 cuda_graphs=request.model.cuda_graphs), settings)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    err.print(f"ottvid serve: {model} on http://{shown}:{bound_port}/v1 (the page: http://{shown}:{bound_port}/; "
              f"{'API key required' if api_key else 'no API key'}; local videos: "
              f"{allowed_media_dir or 'none'}; uploads up to {serving.max_upload_mb:g} MB)", highlight=False,
              markup=False, soft_wrap=True)
    if not _loopback(host) and not api_key:
        err.print(f"warning: listening on {host} without --api-key: anyone who reaches this port can use the model",
                  style="yellow", highlight=False, markup=False)
    if not serve_app(app, sock, quiet, serving.timeout):
        fail("the server could not start (see the log above)", code=EXIT_RUN)


def serve_app(app, sock: socket.socket, quiet: bool, timeout: float) -> bool:
    """Run uvicorn with `app` on the bound `sock` until SIGTERM / SIGINT; False if it did not start.

    The shutdown's grace period: the requests in flight have `timeout` seconds (each has at most
    that anyway), then the model's thread `app.WORKER_GRACE` seconds; the process ends then, whatever
    that thread is doing. A connection must send each request head within `connections.HEAD_TIMEOUT`."""
    import uvicorn

    from ..serve.connections import HeadTimeoutProtocol

    config = uvicorn.Config(app, log_level="warning" if quiet else "info", lifespan="on", http=HeadTimeoutProtocol,
                            timeout_graceful_shutdown=timeout, log_config=log_config(quiet))
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; a handler that
    # does nothing makes that an ordinary return, and so exit code 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    return server.started


def log_config(quiet: bool) -> dict:
    """uvicorn's logging, with every line on stderr: its access lines too (uvicorn writes those to
    stdout), and ottvid's own (the logger `ottvid`: the warm-up, cancelled requests, cache warnings)
    in the same format. stdout stays empty, as it is for every command that prints no result."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["loggers"]["ottvid"] = {"handlers": ["default"], "level": "WARNING" if quiet else "INFO",
                                   "propagate": False}
    return config


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
