"""The version gate: is a file on a host the target of a patch, in a release the patch is for?

A patch names its target module, the distribution that ships it and a PEP 440 range. The version
that counts is the version of the distribution that *owns the file* (the host agent finds it in
the installed distributions' RECORD files), not whatever `sglang` happens to be installed: a fork
published under another name, a second copy of the package, or a file copied in by hand must not
pass the gate on someone else's version. When the owner is unknown (an editable checkout is not
listed in any RECORD), the version of the target distribution installed for the engine's
interpreter is used; when no version is known at all and the patch declares a range, the gate
refuses instead of passing silently.
"""

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
