"""The version gate: is a file on a host the target of a patch, in a release the patch is for?"""

from __future__ import annotations

import re

from opspatch.core.spec import Target


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_gate(
    target: Target,
    file_path: str,
    *,
    owner: str | None,
    owner_version: str | None,
    installed_version: str | None,
    version_hint: str = "",
) -> str | None:
    """Why `file_path` is not this patch's target, or None when it is.

    `owner`/`owner_version`: the distribution whose RECORD lists the file (None: no RECORD does);
    `installed_version`: the version of `target.distribution` installed for the interpreter that
    imports the file (None: not installed, or not known). `version_hint` is appended to the
    message when no version is known (e.g. "pass --target-version").
    """
    problem = target.mismatch(file_path, None)
    if problem is not None or not target.versions:
        return problem
    if owner is not None:
        if _normalized(owner) != _normalized(target.distribution):
            return (
                f"{file_path} belongs to {owner} {owner_version or '(unknown version)'}, not to "
                f"{target.distribution}, so the version range ({target.versions}) cannot be checked"
            )
        version = owner_version
    else:
        version = installed_version
    if version is None:
        return (
            f"cannot tell which version of {target.distribution} provides {file_path}, so the "
            f"version range ({target.versions}) cannot be checked"
            + (f"; {version_hint}" if version_hint else "")
        )
    return target.mismatch(file_path, version)
