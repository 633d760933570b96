"""The router's HTTP control plane (sglang-router 0.3.2, "SGLang Model Gateway"), as typed calls."""

from __future__ import annotations

import json
from dataclasses import dataclass
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
