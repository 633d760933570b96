"""Where patches, inventories and playbooks are found.

Lookup order, first match wins:
1. the workspace: `--workspace DIR`, else `$OPSPATCH_HOME`, else the current directory
   (`<workspace>/patches/`, `<workspace>/inventories/`, `<workspace>/playbooks/`);
2. for inventories, the controller's state directory (`opspatch sandbox up` writes
   `sandbox.toml` and `sandbox-ssh.toml` there, so `--hosts sandbox` works from any directory);
3. the files bundled with the package (the repository's top-level folders, shipped in the wheel).

A reference that looks like a path (it ends in `.toml`/`.yml`/`.yaml` or contains a `/`) is taken
as a path and nothing is searched.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opspatch.config import paths
from opspatch.errors import InputError

KINDS = ("patches", "inventories", "playbooks")
_SUFFIXES = {
    "patches": (".toml",),
    "playbooks": (".toml",),
    "inventories": (".toml", ".yml", ".yaml"),
}


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
        dirs = [self.root / kind]
        if kind == "inventories":
            dirs.append(self.state_dir / "inventories")
        bundled = bundled_dir(kind)
        if bundled is not None and bundled.resolve() not in [d.resolve() for d in dirs]:
            dirs.append(bundled)
        return dirs

    def available(self, kind: str) -> dict[str, Path]:
        """Every name of `kind` that can be looked up, with the file it resolves to."""
        found: dict[str, Path] = {}
        for directory in self.search_dirs(kind):
            if not directory.is_dir():
                continue
            for path in sorted(directory.iterdir()):
                if path.suffix in _SUFFIXES[kind] and path.is_file():
                    found.setdefault(path.stem, path)
        return found

    def find(self, kind: str, reference: str) -> Path:
        """Resolve a name or path of `kind` to a file.

        Raises:
            InputError: no such file; the message lists near names and where it looked.
        """
        if reference.endswith(_SUFFIXES[kind]) or "/" in reference or os.sep in reference:
            path = Path(reference).expanduser()
            if not path.is_file():
                raise InputError(
                    f"{reference}: no such file", hint=f"give a {kind[:-1]} name or a path"
                )
            return path
        available = self.available(kind)
        if reference in available:
            return available[reference]
        near = difflib.get_close_matches(reference, list(available), n=3, cutoff=0.5)
        looked = ", ".join(str(d) for d in self.search_dirs(kind))
        hint = (
            f"did you mean {', '.join(near)}?"
            if near
            else (f"known: {', '.join(sorted(available)) or 'none'}")
        )
        raise InputError(f"no {kind[:-1]} named {reference!r} (looked in {looked})", hint=hint)
