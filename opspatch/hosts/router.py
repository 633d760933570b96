"""The router's HTTP control plane (sglang-router 0.3.2, "SGLang Model Gateway"), as typed calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opspatch.core.host import RouterSettings
from opspatch.errors import RouterError

ROUTER_CALL_TIMEOUT = 10.0
"""Seconds one control-plane call may take (they answer in milliseconds)."""


@dataclass(frozen=True)
class RouterWorker:
    """One worker as `GET /workers` lists it."""

    id: str
    url: str
    healthy: bool


@dataclass(frozen=True)
class Listing:
    """One answer to `GET /workers` (or the error it gave), numbered in the order the requests
    began."""

    number: int
    workers: tuple[RouterWorker, ...] = ()
    error: RouterError | None = None
    _by_url: dict[str, tuple[RouterWorker, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for worker in self.workers:  # indexed once, for every host that reads this listing
            self._by_url[worker.url] = (*self._by_url.get(worker.url, ()), worker)

    def of(self, worker_url: str) -> tuple[RouterWorker, ...]:
        """The workers registered under `worker_url` (none, or more than one for a URL the
        router holds twice).

        Raises:
            RouterError: the request this listing answers failed.
        """
        if self.error is not None:
            raise self.error
        return self._by_url.get(worker_url, ())


class SharedListing:
    """One router's `/workers` as every host of a run waiting on it reads it: one request at a
    time, each serving every host that asked before it began, and none sooner than `interval`
    after the one before (so N hosts polling cost the router one request per interval).

    A host is only ever given a listing whose request began after the mark it names: one that
    changed the router (removed or added its worker) never reads a listing older than its
    change."""

    def __init__(
        self,
        fetch: Callable[[], tuple[RouterWorker, ...]],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._interval = interval
        self._clock = clock
        self._turn = threading.Condition()
        self._begun = 0
        """Requests begun so far; the next one's number is one more."""
        self._last: Listing | None = None
        self._last_began = 0.0
        self._fetching = False

    def mark(self) -> int:
        """Now, as `after` reads it: every listing after this mark began after this call."""
        with self._turn:
            return self._begun

    def after(self, mark: int) -> Listing:
        """A listing whose request began after `mark` (from `mark()`, or an earlier listing's
        `number`: the next one); its error, if it failed, is every waiter's."""
        with self._turn:
            while True:
                last = self._last
                if last is not None and last.number > mark:
                    return last
                if not self._fetching:
                    gap = self._last_began + self._interval - self._clock() if last else 0.0
                    if gap <= 0:
                        break
                self._turn.wait(None if self._fetching else gap)
            self._fetching = True
            self._begun += 1
            number = self._begun
            self._last_began = self._clock()
        listing: Listing | None = None
        try:
            try:
                listing = Listing(number, self._fetch())
            except RouterError as exc:
                listing = Listing(number, error=exc)
        finally:  # anything else is this caller's alone: the next waiter asks again
            with self._turn:
                self._fetching = False
                self._last = listing or self._last
                self._turn.notify_all()
        return listing


class RouterClient:
    """Typed calls to one router's control plane; every failure is a `RouterError` naming the
    router, the call and what it answered."""

    def __init__(
        self, settings: RouterSettings, key: str | None, *, timeout: float = ROUTER_CALL_TIMEOUT
    ) -> None:
        self.url = settings.url
        self._key = key
        self._timeout = timeout

    def workers(self) -> tuple[RouterWorker, ...]:
        """Every registered worker (pending adds are not listed)."""
        body = self._call("GET", "/workers")
        listed = body.get("workers") if isinstance(body, dict) else None
        if not isinstance(listed, list):
            raise RouterError(
                f"router {self.url}: GET /workers did not list workers: {body!r:.200}"
            )
        return tuple(
            RouterWorker(str(w.get("id", "")), str(w.get("url", "")), bool(w.get("is_healthy")))
            for w in listed
            if isinstance(w, dict)
        )

    def add(self, worker_url: str) -> str:
        """Ask the router to register `worker_url`; returns the job's worker id."""
        body = self._call("POST", "/workers", {"url": worker_url})
        worker_id = body.get("worker_id") if isinstance(body, dict) else None
        if not isinstance(worker_id, str):
            raise RouterError(f"router {self.url}: POST /workers gave no worker_id: {body!r:.200}")
        return worker_id

    def job_failure(self, worker_id: str) -> str | None:
        """Why the router gave up registering `worker_id`, or None while it is still trying
        (or done: then `workers()` lists it)."""
        body = self._call("GET", f"/workers/{worker_id}", missing_ok=True)
        status = body.get("job_status") if isinstance(body, dict) else None
        if isinstance(status, dict) and status.get("status") == "failed":
            return str(status.get("message") or status.get("error") or status)
        return None

    def remove(self, worker_id: str) -> None:
        self._call("DELETE", f"/workers/{worker_id}", missing_ok=True)

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        missing_ok: bool = False,
    ) -> Any:
        # here, not with the module: every run that may rotate imports it, and http.client
        # brings ssl, a tenth of `apply --file`'s imports, for the runs that reach a router
        import http.client
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self._key:
            request.add_header("Authorization", f"Bearer {self._key}")
        where = f"router {self.url}: {method} {path}"
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310 - the inventory's router URL
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return {}
            text = exc.read()[:300].decode(errors="replace")
            hint = (
                "the router's control plane wants its admin key: name the variable that holds it "
                "in the inventory (router = { ..., admin_key_env = ... }) and export it"
                if exc.code in (401, 403)
                else None
            )
            raise RouterError(f"{where} answered {exc.code}: {text}", hint=hint) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RouterError(f"{where}: no answer ({reason})") from None
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise RouterError(f"{where} answered text that is not JSON: {raw[:200]!r}") from None
