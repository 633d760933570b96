"""Patch files: reading `patches/<id>.toml` into a `LoadedPatch`."""

from __future__ import annotations

from pathlib import Path

from opspatch.config.files import read_toml
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, PatchSetSpec, parse_patch_file


def load_patch(path: Path, *, named_by_id: bool = True) -> LoadedPatch:
    """Read, parse and validate a patch file.

    `named_by_id`: the file is found by its id (`patches/<id>.toml`), so its name must be the id;
    False for a file the operator named by its path.

    Raises:
        SpecError: unreadable file, malformed TOML, an invalid patch, or (`named_by_id`) an id
            that is not the file's name (file:line: field).
    """
    document = read_toml(path)
    parsed = parse_patch_file(document)
    parts = parsed.parts() if isinstance(parsed, PatchSetSpec) else ()
    spec = parts[0] if parts else parsed
    assert not isinstance(spec, PatchSetSpec)
    if named_by_id and path.suffix == ".toml" and path.stem != spec.id:
        raise document.error(
            ["id"],
            f"id {spec.id!r} does not match the file name {path.name!r}",
            hint=f"rename the file to {spec.id}.toml or change the id",
        )
    digest = sha256_hex(document.text.encode("utf-8"))
    return LoadedPatch(
        spec=spec,
        path=str(path),
        sha256=digest,
        document=document,
        members=parts,
        given_path=None if named_by_id else str(path),
    )
