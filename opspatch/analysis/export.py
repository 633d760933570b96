"""An upstreamable change from a patch: a git-style unified diff, or a `git format-patch` mail."""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from email.header import Header
from email.utils import format_datetime, formataddr, parseaddr

from opspatch.analysis.provenance import Provenance
from opspatch.core.codec import NOT_WRITTEN, Record, json_field
from opspatch.core.edit import AlreadyApplied, Applied, apply_patch
from opspatch.core.remedy import remedy_text
from opspatch.core.source import SourceText, split_lines
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError, TargetError

ZERO_COMMIT = "0" * 40
_NO_NEWLINE = "\\ No newline at end of file\n"
# Lines git mailinfo would take for the end of the message (`---`, `diff -`, `Index: `).
_MESSAGE_BREAKERS = re.compile(r"^(---(\s|$)|diff -|Index: )")


@dataclass(frozen=True, kw_only=True)
class ExportedChange(Record):
    """What a patch changes in one file, as a git-style unified diff."""

    patch_id: str = json_field(key="patch")
    path: str  # as it appears after a/ and b/, prefix included
    insertions: int
    deletions: int
    diff: str
    new_source: bytes = field(metadata=NOT_WRITTEN)

    def diffstat(self) -> str:
        """git's summary: ` path | 5 +++--` and ` 1 file changed, 3 insertions(+), ...`."""
        total = self.insertions + self.deletions
        graph = "+" * self.insertions + "-" * self.deletions
        parts = ["1 file changed"]
        if self.insertions:
            parts.append(f"{self.insertions} insertion{'s' if self.insertions != 1 else ''}(+)")
        if self.deletions:
            parts.append(f"{self.deletions} deletion{'s' if self.deletions != 1 else ''}(-)")
        return f" {self.path} | {total} {graph}\n {', '.join(parts)}\n"


def git_blob_sha1(data: bytes) -> str:
    """The object id git gives a file's content (for the `index` line)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def normalize_prefix(prefix: str) -> str:
    """`python` / `python/` / `./python/` -> `python/`; `` -> ``.

    Raises:
        InputError: an absolute prefix or one that climbs out (`..`).
    """
    cleaned = prefix.strip().replace("\\", "/").removeprefix("./").strip("/")
    if not cleaned:
        return ""
    if prefix.startswith("/") or ".." in cleaned.split("/"):
        raise InputError(
            f"--prefix {prefix!r} must be a relative folder inside the repository",
            hint="e.g. --prefix python/ for SGLang's layout",
        )
    return cleaned + "/"


def _diff_body(old_text: str, new_text: str, path: str) -> tuple[str, int, int]:
    out = []
    insertions = deletions = 0
    for line in difflib.unified_diff(
        split_lines(old_text), split_lines(new_text), f"a/{path}", f"b/{path}", lineterm="\n"
    ):
        if line.startswith(("---", "+++", "@@")):
            out.append(line)
            continue
        if line.startswith("+"):
            insertions += 1
        elif line.startswith("-"):
            deletions += 1
        out.append(line if line.endswith("\n") else line + "\n" + _NO_NEWLINE)
    return "".join(out), insertions, deletions


def export_diff(patch: PatchSpec, pristine: bytes, *, prefix: str = "") -> ExportedChange:
    """The change `patch` makes to `pristine` (the release's own file), as a git-style diff.

    Raises:
        TargetError: the patch does not apply to this file (the reason and nearest candidates),
            or the file already contains it (nothing to export).
        InputError: a bad prefix.
    """
    path = normalize_prefix(prefix) + patch.target.module_relpaths()[0]
    outcome = apply_patch(pristine, patch)
    if isinstance(outcome, AlreadyApplied):
        raise TargetError(
            f"the file already contains {patch.id} ({outcome.reason}): nothing to export",
            hint="export against the pristine file of the release (--release/--from)",
        )
    if not isinstance(outcome, Applied):
        raise TargetError(
            f"{patch.id} does not apply to this file: {outcome.render()}",
            hint="export against a release the patch supports "
            f"({remedy_text(Command.CHECK, releases=True)})",
        )
    old = SourceText.decode(pristine)
    new = SourceText.decode(outcome.new_source)
    body, insertions, deletions = _diff_body(old.text, new.text, path)
    header = (
        f"diff --git a/{path} b/{path}\n"
        f"index {git_blob_sha1(pristine)}..{git_blob_sha1(outcome.new_source)}\n"
    )
    return ExportedChange(
        patch_id=patch.id,
        path=path,
        diff=header + body,
        insertions=insertions,
        deletions=deletions,
        new_source=outcome.new_source,
    )


def _header(value: str) -> str:
    return value if value.isascii() else Header(value, "utf-8").encode()


def _message_body(patch: PatchSpec, signoff: str | None) -> str:
    lines = [
        (" " + line if _MESSAGE_BREAKERS.match(line) else line)
        for line in patch.rationale.strip("\n").splitlines()
    ]
    trailer = []
    if patch.incident:
        trailer.append(f"Incident: {patch.incident}")
    trailer.append(f"Opspatch-Patch: {patch.id}")
    if signoff:
        trailer.append(f"Signed-off-by: {signoff}")
    return "\n".join([*lines, "", *trailer]) + "\n"


def render_mail(
    change: ExportedChange,
    patch: PatchSpec,
    *,
    author: str,
    date: datetime,
    signature: str = "opspatch",
    signoff: str | None = None,
) -> str:
    """The change as a `git format-patch` style mail; `git am` applies it as one commit whose
    subject is the patch's summary and whose message is its rationale and incident reference.

    `author` is `Name <email>`; `date` must carry a time zone.

    Raises:
        InputError: an author without an email address, or a naive date.
    """
    name, address = parseaddr(author)
    if "@" not in address:
        raise InputError(
            f"author {author!r} is not `Name <email>`", hint='e.g. --author "Ops <ops@example.com>"'
        )
    if date.tzinfo is None:
        raise InputError("the mail's date needs a time zone")
    text = patch.summary + patch.rationale + (patch.incident or "") + change.diff
    mime = (
        ""
        if text.isascii() and author.isascii()
        else "MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\n"
        "Content-Transfer-Encoding: 8bit\n"
    )
    subject = " ".join(patch.summary.split())
    provenance = "".join(
        f"{header}: {_header(' '.join(value.split()))}\n"
        for header, value in Provenance.of(patch).headers()
    )
    return (
        f"From {ZERO_COMMIT} Mon Sep 17 00:00:00 2001\n"
        f"From: {formataddr((name, address), charset='utf-8')}\n"
        f"Date: {format_datetime(date)}\n"
        f"Subject: {_header('[PATCH] ' + subject)}\n"
        f"{provenance}"
        f"{mime}"
        "\n"
        f"{_message_body(patch, signoff)}"
        "---\n"
        f"{change.diffstat()}"
        "\n"
        f"{change.diff}"
        "-- \n"
        f"{signature}\n"
        "\n"
    )
