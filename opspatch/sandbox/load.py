"""`opspatch sandbox load`: a steady stream of generate requests through a router, bounded in
count and time, and what the clients saw."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError

FAILURE_PAUSE = 0.05
"""Seconds a client waits after a failed request before the next."""

WATCH_INTERVAL = 0.2
"""Seconds between two looks at the router's worker list."""

_COUNTER_RE = re.compile(r"^sglang:num_requests_total(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", re.M)


class EndedBy(str, Enum):
    """Which limit ended a load: its time, its request count, or the caller (`until`)."""

    SECONDS = "seconds"
    REQUESTS = "requests"
    STOPPED = "stopped"


@dataclass(frozen=True)
class WorkerServed:
    """One worker: how often the router (re-)registered it while the load ran, and how many
    requests it finished after the last time (None: its counter could not be read)."""

    url: str
    registrations: int
    served_after_last_admission: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "readmitted": self.registrations > 1,
            "served_after_last_admission": self.served_after_last_admission,
        }


@dataclass(frozen=True)
class LoadReport:
    """What the clients saw."""

    router: str
    seconds: float
    sent: int
    succeeded: int
    failures: dict[str, int]
    latency_ms: dict[str, float]
    workers: tuple[WorkerServed, ...] = field(default_factory=tuple)
    ended_by: EndedBy = EndedBy.SECONDS
    limit_seconds: float = 0.0
    limit_requests: int | None = None

    @property
    def ended(self) -> str:
        """Which limit ended the load, in words (`--seconds 60`, `--requests 1000`)."""
        if self.ended_by is EndedBy.REQUESTS:
            return f"--requests {self.limit_requests} (all sent)"
        if self.ended_by is EndedBy.STOPPED:
            return "its caller"
        return f"--seconds {self.limit_seconds:g}"

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "ended_by": self.ended_by.value,
            "limits": {"seconds": self.limit_seconds, "requests": self.limit_requests},
            "seconds": round(self.seconds, 3),
            "sent": self.sent,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "failures": dict(self.failures),
            "latency_ms": self.latency_ms,
            "workers": [w.to_json() for w in self.workers],
        }


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max (nearest rank) in milliseconds; empty without samples."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        index = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        return round(ordered[index] * 1000, 1)

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": round(ordered[-1] * 1000, 1)}


class _Tally:
    def __init__(self, requests: int | None) -> None:
        self.lock = threading.Lock()
        self.left = requests
        self.sent = 0
        self.succeeded = 0
        self.failures: Counter[str] = Counter()
        self.latencies: list[float] = []

    def take(self) -> bool:
        with self.lock:
            if self.left is not None:
                if self.left <= 0:
                    return False
                self.left -= 1
            self.sent += 1
            return True


def _failure_reason(status: int, body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        code = error.get("code") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        code = None
    return f"HTTP {status}" + (f" {code}" if code else "")


def _client(url: str, tally: _Tally, deadline: float, tokens: int, until: threading.Event) -> None:
    body = json.dumps(
        {
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
        }
    ).encode()
    while time.monotonic() < deadline and not until.is_set() and tally.take():
        started = time.monotonic()
        request = urllib.request.Request(
            url + "/generate", data=body, headers={"Content-Type": "application/json"}
        )
        reason = None
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - the operator's router URL
                response.read()
        except urllib.error.HTTPError as exc:
            reason = _failure_reason(exc.code, exc.read())
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = type(getattr(exc, "reason", exc)).__name__
        with tally.lock:
            if reason is None:
                tally.succeeded += 1
                tally.latencies.append(time.monotonic() - started)
            else:
                tally.failures[reason] += 1
        if reason is not None:
            time.sleep(FAILURE_PAUSE)


def _get(url: str, key: str | None = None) -> bytes | None:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback/operator URLs
            return bytes(response.read())
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return None


def _served(worker_url: str) -> int | None:
    raw = _get(worker_url + "/metrics")
    match = _COUNTER_RE.search(raw.decode(errors="replace")) if raw else None
    return int(float(match.group(1))) if match else None


class _Watcher(threading.Thread):
    """Notes each worker's registrations (a new id for a URL is a re-admission) and its served
    counter right after the last one."""

    def __init__(self, router: str, key: str | None, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="router-watch")
        self.router, self.key, self.stop_event = router, key, stop
        self.ids: dict[str, str] = {}
        self.registrations: Counter[str] = Counter()
        self.counter_at_admission: dict[str, int | None] = {}

    def look(self) -> None:
        raw = _get(self.router + "/workers", self.key)
        try:
            listed = json.loads(raw or b"{}").get("workers", [])
        except ValueError:
            return
        for worker in listed:
            url, worker_id = str(worker.get("url")), str(worker.get("id"))
            if self.ids.get(url) != worker_id:
                self.ids[url] = worker_id
                self.registrations[url] += 1
                self.counter_at_admission[url] = 0 if self.registrations[url] == 1 else _served(url)

    def run(self) -> None:
        while not self.stop_event.wait(WATCH_INTERVAL):
            self.look()


def load_url(url: str) -> str:
    """`url` as the load sends to it (no trailing slash).

    Raises:
        InputError: it is not an http:// or https:// URL with a host.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - a port that is not a number raises ValueError
    except ValueError:
        usable = False
    if not usable:
        raise InputError(
            f"--url {url!r} is not a router URL; nothing was sent",
            hint="give the router as http://HOST:PORT (for the sandbox's own, leave --url out)",
        )
    return url.rstrip("/")


def run_load(
    router: str,
    *,
    requests: int | None,
    seconds: float,
    concurrency: int = 4,
    max_new_tokens: int = 16,
    admin_key: str | None = None,
    until: threading.Event | None = None,
) -> LoadReport:
    """Send generate requests through `router` for `seconds`, at most `requests` of them when
    a count is given (or until `until` is set: a caller that ends the load when its own work is
    done); the report says which ended it.

    Raises:
        InputError: `router` is not an http(s) URL, a bound is not positive, or the router
            does not answer.
    """
    router = load_url(router)
    if (requests is not None and requests < 1) or seconds <= 0 or concurrency < 1:
        raise InputError("--requests, --seconds and --concurrency must be above 0")
    if _get(router + "/health") is None and _get(router + "/workers", admin_key) is None:
        raise InputError(
            f"router {router} does not answer",
            hint=f"start it: {remedy_text(Command.SANDBOX_UP, router=True)}",
        )
    stop = threading.Event()
    watcher = _Watcher(router, admin_key, stop)
    watcher.look()
    watcher.start()
    tally = _Tally(requests)
    started = time.monotonic()
    deadline = started + seconds
    clients = [
        threading.Thread(
            target=_client,
            args=(router, tally, deadline, max_new_tokens, until or threading.Event()),
            daemon=True,
        )
        for _ in range(concurrency)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    elapsed = time.monotonic() - started
    if until is not None and until.is_set():
        ended_by = EndedBy.STOPPED
    elif tally.left is not None and tally.left <= 0:
        ended_by = EndedBy.REQUESTS
    else:
        ended_by = EndedBy.SECONDS
    stop.set()
    watcher.join(timeout=5)
    watcher.look()
    workers = []
    for url in sorted(watcher.registrations):
        now, then = _served(url), watcher.counter_at_admission.get(url)
        served = None if now is None or then is None else max(0, now - then)
        if watcher.registrations[url] == 1:
            served = now  # never re-admitted: everything since it started
        workers.append(WorkerServed(url, watcher.registrations[url], served))
    return LoadReport(
        router,
        elapsed,
        tally.sent,
        tally.succeeded,
        dict(tally.failures),
        percentiles(tally.latencies),
        tuple(workers),
        ended_by,
        seconds,
        requests,
    )
