"""What a patch is for (`Target`): a module, the distribution that ships it, the versions it
fits, the pre-images it accepts and the oldest Python it must still parse on."""

from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Field, field_validator

from opspatch.core.fileschema import FileSchema
from opspatch.core.selectors import _QUALNAME_RE

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class Target(FileSchema):
    """What a patch is for: a module, the distribution that ships it, the versions it fits."""

    module: str = Field(
        description="Dotted module name, e.g. sglang.srt.speculative.eagle_worker_v2"
    )
    distribution: str = Field("sglang", description="Distribution whose version is gated")
    versions: str = Field(
        "", description="PEP 440 specifier set the patch is meant for, e.g. '>=0.5.4'; empty = any"
    )
    accept_sha256: list[str] = Field(
        default_factory=list,
        description="Optional: sha256 of the only pre-images accepted (lower-case hex)",
    )
    min_python: str | None = Field(
        None,
        description="Oldest Python the patched file must still parse on, e.g. '3.10'",
    )

    @field_validator("module")
    @classmethod
    def _module_is_dotted(cls, value: str) -> str:
        if not _QUALNAME_RE.match(value):
            raise ValueError(f"{value!r} is not a dotted module name")
        return value

    @field_validator("versions")
    @classmethod
    def _versions_parse(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(
                f"{value!r} is not a version range (PEP 440, e.g. '>=0.5.4')"
            ) from None
        return value

    @field_validator("accept_sha256")
    @classmethod
    def _hashes_are_hex(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not _SHA256_RE.match(digest):
                raise ValueError(f"{digest!r} is not a lower-case hex sha256")
        return value

    @field_validator("min_python")
    @classmethod
    def _python_is_major_minor(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^3\.\d{1,2}$", value):
            raise ValueError(f"{value!r} is not a Python version like '3.10'")
        return value

    @property
    def specifier(self) -> SpecifierSet:
        return SpecifierSet(self.versions)

    @property
    def feature_version(self) -> tuple[int, int] | None:
        if self.min_python is None:
            return None
        major, minor = self.min_python.split(".")
        return int(major), int(minor)

    def mismatch(self, file_path: str, installed_version: str | None) -> str | None:
        """Why a file is not this target (wrong module path, version outside the range), or None.

        `installed_version` is the distribution's version where the file lives (None: unknown,
        which is not a mismatch: a source checkout has no dist-info).
        """
        normalized = file_path.replace("\\", "/")
        if not any(
            normalized == rel or normalized.endswith("/" + rel) for rel in self.module_relpaths()
        ):
            return (
                f"{file_path} is not {self.module} "
                f"(its path should end in {self.module_relpaths()[0]})"
            )
        if installed_version is not None and self.versions:
            try:
                inside = self.specifier.contains(installed_version, prereleases=True)
            except Exception:  # an unparseable installed version is treated as outside
                inside = False
            if not inside:
                return (
                    f"{self.distribution} {installed_version} is outside the versions this patch is "
                    f"for ({self.versions})"
                )
        return None

    def module_relpaths(self) -> tuple[str, str]:
        """The two file paths a module can live at: `a/b/c.py` and `a/b/c/__init__.py`."""
        base = self.module.replace(".", "/")
        return f"{base}.py", f"{base}/__init__.py"
