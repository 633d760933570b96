"""`opspatch sandbox reinstall HOST [--version V] [--restart]`: what a reinstall or an upgrade
does to a host, done to a sandbox host, so that `status`, `drift`, `sync` and `diagnose` can be
seen meeting one."""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.codec import Record
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import HostError, InputError
from opspatch.sandbox import containers as sandbox_containers
from opspatch.sandbox.checkout import install_editable, release_checkout
from opspatch.sandbox.dist import DIST_NAME, InstallShape, check_version, installed_entries, remove
from opspatch.sandbox.install import host_venv_dir, install_standin, venv_site_packages
from opspatch.sandbox.layout import SandboxLayout, quiet
from opspatch.sandbox.manifest import Manifest, load_manifest
from opspatch.sandbox.processes import sandbox_lock, server_pid
from opspatch.sandbox.real.prepare import make_real_host
from opspatch.sandbox.up import engine_controls

PURGE = remedy_text(Command.SANDBOX_DOWN, purge=True)
"""The command that removes the sandbox, for hints."""

UP = remedy_text(Command.SANDBOX_UP)
"""The command that builds the sandbox, for hints."""


@dataclass(frozen=True)
class ReinstallReport(Record):
    """What `sandbox reinstall` did to one host: the release before and after, and whether
    its engine was restarted onto it (`pid`: the engine's process afterwards, None if none)."""

    host: str
    install: InstallShape
    version_before: str
    version: str
    restarted: bool
    pid: int | None

    @property
    def upgrade(self) -> bool:
        return self.version != self.version_before


def installed_version(layout: SandboxLayout, host: str) -> str:
    """The version of the `sglang` distribution installed on the sandbox host (its dist-info).

    Raises:
        InputError: the host has none (or more than one).
    """
    site_packages = venv_site_packages(host_venv_dir(layout.host_dir(host)))
    found = sorted(site_packages.glob(f"{DIST_NAME}-*.dist-info"))
    if len(found) != 1:
        raise InputError(
            f"sandbox host {host} has {len(found)} installed {DIST_NAME} distributions in "
            f"{site_packages}, expected one",
            hint=f"{PURGE}, then up again",
        )
    return found[0].name[len(DIST_NAME) + 1 : -len(".dist-info")]


def sandbox_reinstall(
    layout: SandboxLayout, host: str, *, version: str | None = None, restart: bool = False
) -> ReinstallReport:
    """Reinstall (or, with another `version`, upgrade) the stand-in on sandbox host `host`
    (see the module's docstring).

    Raises:
        InputError: no sandbox, no such host, a malformed version, a sandbox of containers
            (their files come from the image), `restart` of a unit's node (a node is never
            restarted alone), another sandbox command running.
        HostError: the install or the restart failed (the restart: the engine did not come up).
    """
    with sandbox_lock(layout):
        manifest = load_manifest(layout)
        if manifest is None:
            raise InputError(
                f"no sandbox in {layout.root}",
                hint=f"create one with `{UP}`",
            )
        names = [r.name for r in manifest.hosts]
        if host not in names:
            raise InputError(
                f"the sandbox has no host {host!r}; nothing was changed",
                hint=f"its hosts: {', '.join(names)}",
            )
        unit = manifest.unit_of(host)
        if restart and unit is not None:
            raise InputError(
                f"sandbox host {host} is a node of {unit.name} ({', '.join(unit.hosts)}): "
                "restarted alone it could not rejoin its server; nothing was changed",
                hint=f"reinstall without --restart, then `{remedy_text(Command.SANDBOX_DOWN)}` "
                f"and `{UP}` restart the unit as one",
            )
        if manifest.containers:
            container = sandbox_containers.container_name(layout, host)
            raise InputError(
                f"sandbox host {host} runs in container {container}, whose files come from its "
                "image: it is not reinstalled, it is recreated; nothing was changed",
                hint=f"podman rm --force {container}, then `{UP}` creates it "
                "again from the image (the fix gone, as a recreated container loses it)",
            )
        before = installed_version(layout, host)
        target = version or before
        check_version(target)
        host_dir = layout.host_dir(host)
        site_packages = venv_site_packages(host_venv_dir(host_dir))
        if manifest.engine.real:
            _reinstall_real(layout, manifest, host, before, target)
        elif manifest.install == "editable":
            release_checkout(host_dir, target)
            install_editable(host_dir, site_packages, target)
        else:
            install_standin(site_packages, target)
        if restart:
            control = engine_controls(layout, manifest)[host]
            try:
                control.wait_ready(control.restart(step="start"))
            except HostError as exc:
                raise HostError(
                    f"sglang {target} was installed, but the engine did not come up on it: "
                    f"{exc.detail}",
                    host=host,
                    step="sandbox-restart",
                    hint=f"see {layout.log_file(host)}",
                ) from None
        return ReinstallReport(
            host=host,
            install=manifest.install,
            version_before=before,
            version=target,
            restarted=restart,
            pid=server_pid(layout, host),
        )


def _reinstall_real(
    layout: SandboxLayout, manifest: Manifest, host: str, before: str, target: str
) -> None:
    """Real SGLang's files put back from its wheel, with the sandbox's base patches.

    Raises:
        InputError: another release than the installed one (the sandbox runs one).
    """
    if target != before:
        raise InputError(
            f"sandbox host {host} runs real SGLang {before}; the sandbox installs no other "
            f"release ({target}); nothing was changed",
            hint="reinstall without --version (the release's files as pip installs them, "
            "with the sandbox's base patches)",
        )
    site_packages = venv_site_packages(host_venv_dir(layout.host_dir(host)))
    for entry in installed_entries(site_packages):
        remove(entry)
    make_real_host(layout, manifest, host, quiet)
