"""The sandbox's base patches: what a real-engine host's `sglang` is built with before its engine
first starts, beyond the release as pip installs it (the incident's build, say)."""

from __future__ import annotations

from dataclasses import replace

from opspatch.config import paths
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import RestartPolicy
from opspatch.errors import HostError
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet.connect import transport_factory
from opspatch.sandbox import incident
from opspatch.sandbox.layout import Progress, SandboxLayout
from opspatch.sandbox.manifest import Manifest, sandbox_inventory
from opspatch.sandbox.real.release import EngineChoice

BASE_PLAYBOOK = Playbook(name="sandbox-base", restart=RestartPolicy.NEVER)
"""How a base patch is applied: the file staged, the engine started afterwards by `up`."""


def base_patches_for(engine: EngineChoice) -> tuple[LoadedPatch, ...]:
    """The base patches of a real-engine host running `engine`: the incident's build where it
    is made for the release (`opspatch.sandbox.incident`), so the sandbox's real hosts run the
    release the incident happened on, as the stand-in's do."""
    return incident.base_patches_for(engine.version)


def base_patch_target(layout: SandboxLayout, manifest: Manifest, host: str) -> Host:
    """`host` as a base patch reaches it: built per node with its engine stopped, as pip
    installs the wheel on each node (a reinstall rebuilds one), so neither part of a running
    multi-node server nor a worker of the router (which `up` starts once every engine is
    ready: draining it first would find no router)."""
    inventory = sandbox_inventory(layout, manifest, over_ssh=False)
    return replace(inventory.host(host), unit=None, router=None)


def apply_base_patches(
    layout: SandboxLayout,
    manifest: Manifest,
    host: str,
    patches: tuple[LoadedPatch, ...],
    progress: Progress,
) -> None:
    """Apply each base patch to `host` (its engine stopped), recorded in the ledger.

    Raises:
        HostError: a patch did not apply (the run's outcome said why).
    """
    if not patches:
        return
    target = base_patch_target(layout, manifest, host)
    with Ledger.open(paths.default_ledger_location()) as ledger:
        for patch in patches:
            progress(f"{host}: applying the sandbox's base patch {patch.spec.id}")
            report = apply_to_hosts(
                patch, [target], BASE_PLAYBOOK, factory=transport_factory(), ledger=ledger
            )
            if report.exit_code != 0:
                said = "; ".join(f"{o.host}: {o.outcome} {o.error or ''}" for o in report.hosts)
                raise HostError(
                    f"the sandbox's base patch {patch.spec.id} did not apply ({said})",
                    host=host,
                    step="sandbox-base",
                )
