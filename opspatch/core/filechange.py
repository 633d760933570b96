"""The file a host's run was about, as a run reports it and the ledger records it with the host's
outcome: its path and sha256 before and after, and for a patch set where every file stands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from opspatch.core.codec import NOT_WRITTEN, Record, dump, json_field
from opspatch.core.vocabulary import SetState


@dataclass(frozen=True)
class SetFile(Record):
    """One file of a patch set on a host: the pre- and post-image its change was planned (or
    recorded) with, and the bytes it holds when the host's outcome is decided."""

    path: str
    pre_sha256: str = json_field(key="sha256_pre")
    post_sha256: str = json_field(key="sha256_post")
    live_sha256: str | None = json_field(key="sha256_live")

    @property
    def is_new(self) -> bool:
        return self.live_sha256 == self.post_sha256

    @property
    def is_old(self) -> bool:
        return self.live_sha256 == self.pre_sha256

    @property
    def standing(self) -> str:
        """`new`, `old` or `changed`."""
        return "new" if self.is_new else "old" if self.is_old else "changed"

    def to_json(self) -> dict[str, Any]:
        return {**dump(self), "standing": self.standing}  # derived, so written here


def set_state(files: tuple[SetFile, ...]) -> SetState:
    """Where a set's files stand together: all new, all old, partly applied, or changed."""
    if all(f.is_new for f in files):
        return SetState.ALL_NEW
    if all(f.is_old for f in files):
        return SetState.ALL_OLD
    if all(f.is_new or f.is_old for f in files):
        return SetState.PARTLY_APPLIED
    return SetState.CHANGED


@dataclass(frozen=True)
class FileChange(Record):
    """The file a host's run was about, with its sha256 before and after (equal: unchanged).

    For a patch set, `set_files` holds every file of the set (this one, the set's first, too):
    the JSON and the ledger's host outcome then say where the set stands (`set.state`)."""

    path: str
    sha256_before: str | None
    sha256_after: str | None
    set_files: tuple[SetFile, ...] = field(default=(), metadata=NOT_WRITTEN)

    @property
    def set_state(self) -> SetState | None:
        return set_state(self.set_files) if self.set_files else None

    def paths(self) -> tuple[str, ...]:
        """Every file this change is about (one, or a set's)."""
        return tuple(f.path for f in self.set_files) or (self.path,)

    def to_json(self) -> dict[str, Any]:
        data = dump(self)
        if self.set_files:  # reshaped: a set's state beside its files, only for a set
            data["set"] = {
                "state": str(self.set_state),
                "files": [f.to_json() for f in self.set_files],
            }
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileChange:
        """Read back what `to_json` wrote, a set's files included (its `state` and each file's
        `standing` are derived from them again).

        Raises:
            ValueError: a key is missing or a value does not have its field's type.
        """
        change = super().from_json(data)
        shown = data.get("set")
        if shown is None:
            return change
        if not isinstance(shown, Mapping) or not isinstance(shown.get("files"), list):
            raise ValueError("FileChange.set: expected an object with an array of files")
        files = tuple(SetFile.from_json(item) for item in shown["files"])
        return replace(change, set_files=files)
