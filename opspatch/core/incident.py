"""What a patch says about where it came from: the exceptions it fixes (`Fix`, read by
diagnose), the upstream fix it stands for (`Upstream`) and the DEP-3 header fields (origin, bug,
forwarded, last update) with their checks."""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any

from packaging.version import InvalidVersion, Version
from pydantic import BeforeValidator, Field, field_validator

from opspatch.core.fileschema import FileSchema
from opspatch.core.selectors import _QUALNAME_RE


class Fix(FileSchema):
    """An exception a patch fixes, so a diagnosis that finds it in a log can name the patch.

    `exception` is the exception's type name (a dotted name matches by its last part:
    `torch.OutOfMemoryError` matches `OutOfMemoryError`); `message` is a Python regular expression
    searched in the exception's message (the text after `Type: ` on the traceback's last line).
    """

    exception: str = Field(description="Exception type name, e.g. AttributeError")
    message: str = Field(
        description="Regular expression searched in the exception's message, e.g. "
        "\"object has no attribute 'spec_disable_batch_threshold'\""
    )

    @field_validator("exception")
    @classmethod
    def _exception_is_dotted(cls, value: str) -> str:
        if not _QUALNAME_RE.match(value):
            raise ValueError(f"{value!r} is not an exception type name such as AttributeError")
        return value

    @field_validator("message")
    @classmethod
    def _message_compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


_URL_RE = re.compile(r"^https?://[^\s/]+\S*$")
_GITHUB_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*#[0-9]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
NOT_FORWARDED = "no"
NOT_NEEDED_PREFIX = "not-needed:"


class Upstream(FileSchema):
    """The upstream fix a patch stands for: a pull request, a commit, the first release with it.

    `fixed_in` is a claim that opspatch checks against the release's own file (a release at or
    after it whose file does not pass the patch's proof of the fix is reported, not trusted)."""

    pr: str | None = Field(None, description="The upstream pull request: a URL, or owner/repo#N")
    commit: str | None = Field(None, description="The upstream commit (7-40 hex digits)")
    fixed_in: str | None = Field(
        None, description="The first release of the distribution that ships the fix, e.g. 0.5.24"
    )

    @field_validator("pr")
    @classmethod
    def _pr_is_a_reference(cls, value: str | None) -> str | None:
        if value is not None and not (_URL_RE.match(value) or _GITHUB_REF_RE.match(value)):
            raise ValueError(
                f"{value!r} is not a pull request: give its URL "
                "(https://github.com/sgl-project/sglang/pull/1234) or owner/repo#1234"
            )
        return value

    @field_validator("commit")
    @classmethod
    def _commit_is_hex(cls, value: str | None) -> str | None:
        if value is not None and not _COMMIT_RE.match(value):
            raise ValueError(
                f"{value!r} is not a commit: give 7 to 40 lower-case hex digits of its hash"
            )
        return value

    @field_validator("fixed_in")
    @classmethod
    def _fixed_in_is_a_version(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Version(value)
            except InvalidVersion:
                raise ValueError(
                    f"{value!r} is not a version: give the release, e.g. '0.5.24'"
                ) from None
        return value

    @property
    def fixed_in_version(self) -> Version | None:
        return Version(self.fixed_in) if self.fixed_in is not None else None


def _check_forwarded(value: str | None) -> str | None:
    """DEP-3's Forwarded: the upstream URL it was sent to, `no`, or `not-needed: <why>`."""
    if value is None or value == NOT_FORWARDED or _URL_RE.match(value):
        return value
    if value.startswith(NOT_NEEDED_PREFIX) and value.removeprefix(NOT_NEEDED_PREFIX).strip():
        return value
    raise ValueError(
        f"{value!r} is not a forwarding: give the upstream pull request's URL, "
        f"'{NOT_FORWARDED}' (not sent upstream yet) or '{NOT_NEEDED_PREFIX} <why>'"
    )


def _check_bug(value: str | None) -> str | None:
    if value is not None and not (_URL_RE.match(value) or _GITHUB_REF_RE.match(value)):
        raise ValueError(f"{value!r} is not a bug reference: give the bug's URL or owner/repo#N")
    return value


def _check_text(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise ValueError(
            "is empty: say who wrote the patch and from what incident, or leave it out"
        )
    return value


def _read_date(value: Any) -> Any:
    """A TOML date (`2026-12-01`) or the same written as a string; nothing else."""
    if isinstance(value, datetime.datetime):
        raise ValueError(f"{value.isoformat()} is a date and time: write the date only, YYYY-MM-DD")
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a date: write YYYY-MM-DD, e.g. 2026-12-01"
            ) from None
    return value


LastUpdate = Annotated[datetime.date | None, BeforeValidator(_read_date)]
