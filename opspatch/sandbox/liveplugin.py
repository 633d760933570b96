"""`up --live`: opspatch's live plugin installed (`live enable`, recorded) on a host before its
engine starts, since the plugin loads only at a start: no second start (a minute each on real
SGLang, and a restart into it would be the incident build's first decode)."""

from __future__ import annotations

from dataclasses import replace

from opspatch.config import paths
from opspatch.core.policy import Playbook
from opspatch.errors import HostError
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.live import enable_live
from opspatch.runs.fleet.connect import transport_factory
from opspatch.sandbox.install import host_venv_dir, venv_site_packages
from opspatch.sandbox.layout import Progress, SandboxLayout
from opspatch.sandbox.manifest import Manifest, sandbox_inventory

LIVE_PLAYBOOK = Playbook(name="sandbox-live")
"""How `up` enables live fixes on a host: one host, its engine not running yet."""


def has_live_plugin(layout: SandboxLayout, host: str) -> bool:
    """Whether `host`'s environment holds an installation of `opspatch_live`."""
    site = venv_site_packages(host_venv_dir(layout.host_dir(host)))
    return any(site.glob("opspatch_live-*.dist-info"))


def enable_live_before_start(
    layout: SandboxLayout, manifest: Manifest, host: str, progress: Progress
) -> None:
    """Install the live plugin on `host` (its engine stopped) where the sandbox is live and the
    host's environment lacks it, recorded in the ledger as `live enable`.

    Raises:
        HostError: the plugin was not installed (the run's outcome said why).
    """
    if not manifest.live or has_live_plugin(layout, host):
        return
    progress(f"{host}: installing opspatch's live plugin before its engine starts")
    # per node, as the base patches: not a run over part of a running multi-node server
    target = replace(sandbox_inventory(layout, manifest, over_ssh=False).host(host), unit=None)
    with Ledger.open(paths.default_ledger_location()) as ledger:
        report = enable_live(
            ledger=ledger, hosts=[target], factory=transport_factory(), playbook=LIVE_PLAYBOOK
        )
    if report.exit_code != 0:
        said = "; ".join(f"{o.host}: {o.outcome} {o.error or ''}" for o in report.hosts)
        raise HostError(
            f"opspatch's live plugin was not installed ({said})", host=host, step="sandbox-live"
        )
