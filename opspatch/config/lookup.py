"""Where patches, inventories and playbooks are found."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opspatch.config import paths
from opspatch.errors import InputError

if TYPE_CHECKING:  # the loaders (pydantic, yaml) are imported when a file is loaded: a command
    # that loads none (`--version`, `sandbox status`) starts without them
    from opspatch.config.inventory import Inventory
    from opspatch.core.host import Host
    from opspatch.core.policy import Playbook
    from opspatch.core.spec import LoadedPatch

KINDS = ("patches", "inventories", "playbooks")
_SUFFIXES = {
    "patches": (".toml",),
    "playbooks": (".toml",),
    "inventories": (".toml", ".yml", ".yaml"),
}
_SINGULAR = {"patches": "patch", "inventories": "inventory", "playbooks": "playbook"}


def bundled_dir(kind: str) -> Path | None:
    """The folder of `kind` shipped with the package (wheel), or the repository's (checkout)."""
    package = Path(__file__).resolve().parent.parent  # opspatch/
    for candidate in (package / "_bundled" / kind, package.parent / kind):
        if candidate.is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class Workspace:
    """The operator's workspace folder plus the fallbacks above, for one kind of file."""

    root: Path
    state_dir: Path

    @classmethod
    def discover(
        cls, explicit: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> Workspace:
        env = os.environ if environ is None else environ
        root = explicit or (Path(env["OPSPATCH_HOME"]) if env.get("OPSPATCH_HOME") else Path.cwd())
        return cls(root=root.expanduser(), state_dir=paths.state_dir(env))

    def search_dirs(self, kind: str) -> list[Path]:
        """The folders searched for `kind`, first match wins (see the module docstring)."""
        dirs = [self.root / kind]
        if kind == "inventories":
            dirs.append(self.state_dir / "inventories")
        bundled = bundled_dir(kind)
        if bundled is not None and bundled.resolve() not in [d.resolve() for d in dirs]:
            dirs.append(bundled)
        return dirs

    def available(self, kind: str, *, bundled: bool = True) -> dict[str, Path]:
        """Every name of `kind` that can be looked up, with the file it resolves to.

        `bundled=False` leaves out the examples shipped with opspatch (a bare host or group name
        in `--hosts` is looked up in the operator's own inventories only).
        """
        shipped = bundled_dir(kind)
        found: dict[str, Path] = {}
        for directory in self.search_dirs(kind):
            if not directory.is_dir():
                continue
            if not bundled and shipped is not None and directory.resolve() == shipped.resolve():
                continue
            for suffix in _SUFFIXES[kind]:
                for path in sorted(directory.glob(f"*{suffix}")):
                    if path.is_file():
                        found.setdefault(path.stem, path)
        return found

    @staticmethod
    def is_path(kind: str, reference: str) -> bool:
        """Whether `reference` is taken as a path rather than a name."""
        return reference.endswith(_SUFFIXES[kind]) or "/" in reference or os.sep in reference

    def locate(self, kind: str, reference: str) -> Path | None:
        """The file a name or path of `kind` resolves to, or None when there is none."""
        if self.is_path(kind, reference):
            path = Path(reference).expanduser()
            return path if path.is_file() else None
        return self.available(kind).get(reference)

    def find(self, kind: str, reference: str) -> Path:
        """Resolve a name or path of `kind` to a file.

        Raises:
            InputError: no such file; the message lists near names and where it looked.
        """
        found = self.locate(kind, reference)
        if found is not None:
            return found
        singular = _SINGULAR[kind]
        if self.is_path(kind, reference):
            raise InputError(f"{reference}: no such file", hint=f"give a {singular} name or a path")
        available = self.available(kind)
        near = difflib.get_close_matches(reference, list(available), n=3, cutoff=0.5)
        looked = ", ".join(str(d) for d in self.search_dirs(kind))
        hint = (
            f"did you mean {', '.join(near)}?"
            if near
            else (f"known: {', '.join(sorted(available)) or 'none'}")
        )
        raise InputError(f"no {singular} named {reference!r} (looked in {looked})", hint=hint)

    # -----------------------------------------------------------------------------------------
    # conveniences: find, then load

    def load_patch(self, reference: str) -> LoadedPatch:
        """The patch a name or path refers to.

        Raises:
            InputError: no such patch (near names suggested).
            SpecError: the file is not a valid patch (file:line: field).
        """
        from opspatch.config.patches import load_patch

        return load_patch(
            self.find("patches", reference), named_by_id=not self.is_path("patches", reference)
        )

    def load_playbook(self, reference: str) -> Playbook:
        """The playbook a name or path refers to.

        Raises:
            InputError: no such playbook (near names suggested).
            SpecError: the file is not a valid playbook (file:line: field).
        """
        from opspatch.config.playbook import load_playbook

        return load_playbook(self.find("playbooks", reference))

    def load_inventory(self, reference: str) -> Inventory:
        """The inventory a name or path refers to (TOML or Ansible YAML).

        Raises:
            InputError: no such inventory (near names suggested).
            SpecError: the file is not a valid inventory (file:line: field).
        """
        from opspatch.config.inventory import load_inventory

        return load_inventory(self.find("inventories", reference))

    def hosts(self, selection: str) -> tuple[Host, ...]:
        """The hosts a `--hosts` selection names (`opspatch.config.inventory.resolve_hosts`).

        Raises:
            SelectionError: an unknown inventory, host or group (near names suggested).
            SpecError: an inventory that had to be read is not valid.
        """
        from opspatch.config.inventory import resolve_hosts

        return resolve_hosts(selection, self)
