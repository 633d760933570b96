"""The HTTP server: SGLang's API subset on the standard library's ThreadingHTTPServer.

Start-up follows SGLang's order and log lines: `server_args=...`, weight loading, the HTTP server
(`Uvicorn running on ...`), then a warm-up thread that waits for the server to answer, runs a
one-token generation through the whole stack, and only then logs
`The server is fired up and ready to roll!` and lets `/health` answer 200. A failed warm-up logs
`Initialization failed. warmup error: ...` and ends the process.

Processes (see `engine.py`): this main process runs the HTTP server and the tokenizer manager;
the schedulers (one per TP rank of the node) and the detokenizer are spawned children. The HTTP
port opens only once every scheduler of every node is ready. On a node other than node 0
(`--node-rank` above 0) the main process runs this node's schedulers and a dummy health server on
`--host:--port` whose `/health` answers 200 unconditionally, as SGLang's does: it proves only
that the process lives.

`/generate` with `"stream": true` answers as SGLang's does: server-sent events (chunked), each
`data: {...}` the whole reply so far (text, output ids, meta_info), sent with the first token and
then once `stream_interval` tokens (a sampling parameter; 1: every step) are unsent, the last
with the finish, then `data: [DONE]`; an error while streaming is one `data: {"error": ...}`
before it.

Test hook (not in SGLang): `SGLANG_STANDIN_WARMUP_DELAY_S=<seconds>` delays the warm-up, so the
503 answers of `/health`, `/health_generate` and `/ready` before it are observable.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from sglang.srt.entrypoints import openai_api
from sglang.srt.entrypoints.engine import EngineProcesses, launch_subprocesses
from sglang.srt.managers.tokenizer_manager import BadRequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import (
    configure_logger,
    flush_log_handlers,
    install_sigquit_handler,
    kill_process_tree,
    mark_shutting_down,
)
from sglang.version import __version__

logger = logging.getLogger(__name__)

WARMUP_DELAY_ENV = "SGLANG_STANDIN_WARMUP_DELAY_S"
WARMUP_PROMPT = "The capital city of France is"
_UVICORN = "INFO:     "

Response = tuple[int, Any]  # status, JSON body (None: empty body; PlainText: text)


class PlainText(str):
    """A body sent as `text/plain` rather than JSON (the Prometheus exposition format)."""


class EventStream:
    """A body sent as server-sent events, chunked: each reply as `data: <json>`, then
    `data: [DONE]` (SGLang's `StreamingResponse` of `/generate`)."""

    def __init__(self, replies: Iterator[dict[str, Any]]):
        self.replies = replies

    def events(self) -> Iterator[bytes]:
        try:
            for reply in self.replies:
                yield b"data: " + json.dumps(reply).encode("utf-8") + b"\n\n"
        except BadRequestError as error:
            failed = {"error": {"message": str(error), "type": "invalid_request_error"}}
            yield b"data: " + json.dumps(failed).encode("utf-8") + b"\n\n"
        yield b"data: [DONE]\n\n"


class HttpApp:
    """Routes a method and path to a handler returning (status, JSON body or None)."""

    def __init__(self, server_args: ServerArgs, tokenizer_manager: TokenizerManager):
        self.server_args = server_args
        self.tokenizer_manager = tokenizer_manager
        self.created = int(time.time())
        self.routes: dict[tuple[str, str], Callable[[Any], Response]] = {
            ("GET", "/health"): self.health,
            ("GET", "/health_generate"): self.health,
            ("GET", "/ready"): self.ready,
            ("GET", "/model_info"): self.model_info,
            ("GET", "/get_model_info"): self.model_info,
            ("GET", "/server_info"): self.server_info,
            ("GET", "/get_server_info"): self.server_info,
            ("GET", "/v1/models"): self.v1_models,
            ("GET", "/v1/loads"): self.v1_loads,
            ("GET", "/metrics"): self.metrics,
            ("GET", "/freeze_gc"): self.freeze_gc,
            ("POST", "/freeze_gc"): self.freeze_gc,
            ("POST", "/generate"): self.generate,
            ("POST", "/v1/completions"): self.v1_completions,
            ("POST", "/v1/chat/completions"): self.v1_chat_completions,
        }

    def handle(self, method: str, path: str, raw_body: bytes) -> Response:
        handler = self.routes.get((method, path))
        if handler is None:
            if any(route_path == path for _, route_path in self.routes):
                return 405, {"detail": "Method Not Allowed"}
            return 404, {"detail": "Not Found"}
        body: Any = None
        if method == "POST":
            try:
                body = json.loads(raw_body or b"null")
            except (ValueError, UnicodeDecodeError) as error:
                return self.bad_request(path, f"the request body is not valid JSON: {error}")
        try:
            return handler(body)
        except BadRequestError as error:
            return self.bad_request(path, str(error))

    @staticmethod
    def bad_request(path: str, message: str) -> Response:
        if path.startswith("/v1/"):
            return 400, openai_api.error_response(message)
        return 400, {"error": {"message": message}}

    # -- routes -----------------------------------------------------------------------------

    def health(self, body: Any) -> Response:
        if not self.tokenizer_manager.is_up:
            return 503, None
        ok = self.tokenizer_manager.health_generate()
        return (200, None) if ok else (503, None)

    def ready(self, body: Any) -> Response:
        if not self.tokenizer_manager.is_up:
            return 503, {"status": "starting"}
        return 200, {"status": "ready"}

    def model_info(self, body: Any) -> Response:
        info = self.tokenizer_manager.scheduler_info
        return 200, {
            "model_path": self.server_args.model_path,
            "tokenizer_path": self.server_args.tokenizer_path,
            "served_model_name": self.server_args.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "tiny_lm",
            "architectures": info["architectures"],
            "vocab_size": info["vocab_size"],
        }

    def server_info(self, body: Any) -> Response:
        # SGLang 0.5.23 `build_server_info`: the server arguments (`tp_size`, `nnodes`,
        # `node_rank`, `dist_init_addr`: on the head, answered only once every rank joined) and
        # `launch_command`, the command line as given.
        return 200, {
            **dataclasses.asdict(self.server_args),
            "launch_command": " ".join(sys.argv[1:]),
            "version": __version__,
            "status": self.tokenizer_manager.server_status.value,
            "internal_states": [self.tokenizer_manager.get_internal_state()],
        }

    def v1_loads(self, body: Any) -> Response:
        # SGLang 0.5.23 `entrypoints/v1_loads.py`: one entry per data-parallel rank.
        return 200, {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": __version__,
            "accelerator": None,
            "num_accelerators": 0,
            "loads": [self.tokenizer_manager.get_load()],
        }

    def metrics(self, body: Any) -> Response:
        # A subset of SGLang's Prometheus metrics (`--enable-metrics`), answered as text like the
        # real exporter: requests finished since the server started, and the speculative
        # gauges of the last decode log interval. The gauges are TP0's (every rank runs the
        # same batches, so the other ranks' figures are the same).
        model = self.server_args.served_model_name
        spec = self.tokenizer_manager.get_spec_metrics()
        rank_labels = f'model_name="{model}",engine_type="unified",tp_rank="0",pp_rank="0"'
        lines = [
            "# TYPE sglang:num_requests_total counter",
            f'sglang:num_requests_total{{model_name="{model}"}} '
            f"{self.tokenizer_manager.num_requests_total}",
        ]
        for name, help_text in (
            ("spec_accept_length", "The average acceptance length of speculative decoding."),
            ("spec_accept_rate", "The average acceptance rate of speculative decoding."),
        ):
            lines += [
                f"# HELP sglang:{name} {help_text}",
                f"# TYPE sglang:{name} gauge",
                f"sglang:{name}{{{rank_labels}}} {float(spec.get(name, 0.0))}",
            ]
        return 200, PlainText("\n".join(lines) + "\n")

    def v1_models(self, body: Any) -> Response:
        return 200, openai_api.models(self.server_args, self.created)

    def freeze_gc(self, body: Any) -> Response:
        self.tokenizer_manager.freeze_gc()
        return 200, None

    def generate(self, body: Any) -> Response:
        request = self.tokenizer_manager.parse_generate_request(body)
        if request.stream:
            return 200, EventStream(self.tokenizer_manager.generate_stream(request))
        return 200, self.tokenizer_manager.generate(request)

    def v1_completions(self, body: Any) -> Response:
        return 200, openai_api.completions(body, self.tokenizer_manager, self.server_args)

    def v1_chat_completions(self, body: Any) -> Response:
        return 200, openai_api.chat_completions(body, self.tokenizer_manager, self.server_args)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    # TCP_NODELAY, as uvicorn's asyncio transports set it: a streamed event is sent as it comes,
    # not held back (Nagle) until the client acknowledges the one before
    disable_nagle_algorithm = True
    server: _HttpServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: requests are logged in uvicorn's access format by `_dispatch`."""

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length > 0 else b""
        try:
            status, payload = self.server.app.handle(method, path, raw_body)
        except Exception as error:  # a bug in a route, not in the scheduler: answer 500
            logger.exception(f"Exception in route {method} {path}")
            status, payload = 500, {"error": {"message": f"internal error: {error}"}}
        if isinstance(payload, EventStream):
            if not self._stream(status, payload):
                return
        elif not self._send(status, payload):
            return
        host, port = self.client_address[:2]
        phrase = HTTPStatus(status).phrase
        logger.info(f'{_UVICORN}{host}:{port} - "{method} {self.path} HTTP/1.1" {status} {phrase}')

    def _send(self, status: int, payload: Any) -> bool:
        """One whole body; False when the client has gone."""
        if isinstance(payload, PlainText):
            data, kind = payload.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8"
        else:
            data = b"" if payload is None else json.dumps(payload).encode("utf-8")
            kind = "application/json"
        try:
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def _stream(self, status: int, stream: EventStream) -> bool:
        """Events as they come, each its own HTTP chunk; False when the client has gone."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in stream.events():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: HttpApp | DummyHealthApp


class DummyHealthApp:
    """What a node other than node 0 serves: `/health` is 200 while the process lives."""

    def handle(self, method: str, path: str, raw_body: bytes) -> Response:
        if method == "GET" and path in ("/health", "/health_generate"):
            return 200, None
        return 404, {"detail": "Not Found"}


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _warmup_delay() -> float:
    raw = os.environ.get(WARMUP_DELAY_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        logger.warning(f"ignoring {WARMUP_DELAY_ENV}={raw!r}: not a number")
        return 0.0


def _wait_and_warmup(server_args: ServerArgs, tokenizer_manager: TokenizerManager) -> None:
    url = server_args.url()
    try:
        delay = _warmup_delay()
        if delay:
            logger.info(
                f"Delaying warm-up by {delay:g} s ({WARMUP_DELAY_ENV}, a stand-in test hook)"
            )
            time.sleep(delay)
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = _request(f"{url}/get_model_info", None, timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}/get_model_info did not answer within 60 s")
            time.sleep(0.1)
        if not server_args.skip_server_warmup:
            payload = {
                "text": WARMUP_PROMPT,
                "sampling_params": {"temperature": 0, "max_new_tokens": 1},
            }
            status, answer = _request(f"{url}/generate", payload, timeout=600)
            if status != 200:
                raise RuntimeError(f"/generate answered {status}: {answer[:500]!r}")
    except Exception as error:
        logger.error(f"Initialization failed. warmup error: {error}")
        kill_process_tree(os.getpid())
        return
    tokenizer_manager.mark_up()
    # As SGLang (0.5.23 `_freeze_gc_after_server_warmup`), warm-up skipped or not: from here on
    # gc.get_objects() in any of the server's processes lists nothing built before.
    try:
        status, _ = _request(f"{url}/freeze_gc", {}, timeout=10)
        if status != 200:
            raise RuntimeError(f"/freeze_gc answered {status}")
    except (OSError, RuntimeError):
        logger.warning("post-warmup freeze_gc failed", exc_info=True)
    logger.info("The server is fired up and ready to roll!")


def _raise_system_exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _bind(server_args: ServerArgs, processes: EngineProcesses) -> _HttpServer:
    try:
        return _HttpServer((server_args.host, server_args.port), _RequestHandler)
    except OSError as error:
        logger.error(
            f"ERROR:    [Errno {error.errno}] error while attempting to bind on address "
            f"({server_args.host!r}, {server_args.port}): {str(error.strerror).lower()}"
        )
        processes.stop()
        flush_log_handlers()
        sys.exit(1)


def _serve(httpd: _HttpServer, processes: EngineProcesses) -> None:
    try:
        httpd.serve_forever(poll_interval=0.5)
    except SystemExit:
        logger.info(f"{_UVICORN}Shutting down")
    finally:
        httpd.server_close()
        processes.stop()
        logger.info(f"{_UVICORN}Finished server process [{os.getpid()}]")
        flush_log_handlers()


def launch_server(server_args: ServerArgs) -> None:
    """Start the engine's processes, serve HTTP until SIGTERM/SIGINT; a fatal error in any
    process ends the whole tree with a non-zero status."""
    configure_logger(server_args)
    install_sigquit_handler()
    signal.signal(signal.SIGTERM, _raise_system_exit)
    signal.signal(signal.SIGINT, _raise_system_exit)
    # as SGLang 0.5.20 and later: a dict (older releases wrote `server_args=ServerArgs(...)`)
    logger.info(f"server_args={dataclasses.asdict(server_args)}")

    try:
        processes = launch_subprocesses(server_args)
    except SystemExit:  # stopped while the processes were starting
        mark_shutting_down()
        for child in multiprocessing.active_children():
            child.kill()
        flush_log_handlers()
        os._exit(0)
    if server_args.node_rank != 0:
        # SGLang's non-head node: schedulers only, and a health endpoint that proves nothing.
        httpd = _bind(server_args, processes)
        httpd.app = DummyHealthApp()
        logger.info(
            f"Dummy health check server running on http://{server_args.host}:{server_args.port} "
            f"(node rank {server_args.node_rank}; TP ranks "
            f"{list(server_args.node_tp_ranks())})"
        )
        _serve(httpd, processes)
        return

    tokenizer_manager = processes.tokenizer_manager
    assert tokenizer_manager is not None
    app = HttpApp(server_args, tokenizer_manager)

    logger.info(f"{_UVICORN}Started server process [{os.getpid()}]")
    logger.info(f"{_UVICORN}Waiting for application startup.")
    logger.info(f"{_UVICORN}Application startup complete.")
    httpd = _bind(server_args, processes)
    httpd.app = app
    logger.info(
        f"{_UVICORN}Uvicorn running on http://{server_args.host}:{server_args.port} "
        f"(Press CTRL+C to quit)"
    )
    threading.Thread(
        target=_wait_and_warmup, args=(server_args, tokenizer_manager), name="Warmup", daemon=True
    ).start()
    _serve(httpd, processes)
