"""Where a patch came from and whether it went upstream, as Debian's DEP-3 headers say it for
package patches: `Origin`, `Bug`, `Forwarded`, `Last-Update`, and the upstream fix it stands for."""

from __future__ import annotations

from dataclasses import dataclass, field

from opspatch.core.codec import NOT_WRITTEN, Record, json_field
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import NOT_FORWARDED, PatchSetSpec, PatchSpec
from opspatch.core.vocabulary import Command


@dataclass(frozen=True, kw_only=True)
class Provenance(Record):
    """A patch's provenance fields, as given (None: not said)."""

    patch_id: str = json_field(key="patch")
    origin: str | None
    bug: str | None
    forwarded: str | None
    last_update: str | None
    upstream_pr: str | None
    upstream_commit: str | None
    fixed_in: str | None
    reference: str | None = field(default=None, metadata=NOT_WRITTEN)
    """How a hint names the patch in a command (`LoadedPatch.reference`; None: its id)."""

    @classmethod
    def of(cls, patch: PatchSpec | PatchSetSpec, reference: str | None = None) -> Provenance:
        upstream = patch.upstream
        return cls(
            patch_id=patch.id,
            reference=reference,
            origin=patch.origin,
            bug=patch.bug,
            forwarded=patch.forwarded,
            last_update=patch.last_update.isoformat() if patch.last_update else None,
            upstream_pr=upstream.pr if upstream else None,
            upstream_commit=upstream.commit if upstream else None,
            fixed_in=upstream.fixed_in if upstream else None,
        )

    @property
    def not_forwarded(self) -> bool:
        return self.forwarded is None or self.forwarded == NOT_FORWARDED

    @property
    def warning(self) -> str | None:
        """One sentence for the author when the fix has not been sent upstream, else None."""
        if not self.not_forwarded:
            return None
        said = "has no `forwarded`" if self.forwarded is None else 'says forwarded = "no"'
        export = remedy_text(
            Command.EXPORT, self.reference or self.patch_id, release="VERSION", format="git"
        )
        return (
            f"not forwarded upstream ({said}): the fix is lost on every reinstall until upstream "
            f"has it; send it (`{export}`) and "
            'set forwarded to the pull request\'s URL, or forwarded = "not-needed: <why>"'
        )

    def headers(self) -> list[tuple[str, str]]:
        """The DEP-3 headers these fields give, in DEP-3's order (fields not given left out)."""
        forwarded = self.forwarded or NOT_FORWARDED
        # DEP-3's Applied-Upstream says upstream has it: a merged commit or a release, not a PR
        # that may still be open
        applied_upstream = self.upstream_commit or self.fixed_in
        rows = [
            ("Origin", self.origin),
            ("Bug", self.bug),
            ("Forwarded", forwarded),
            ("Applied-Upstream", self._applied_upstream() if applied_upstream else None),
            ("Last-Update", self.last_update),
        ]
        return [(name, value) for name, value in rows if value]

    def _applied_upstream(self) -> str:
        shown = [v for v in (self.fixed_in, self.upstream_commit, self.upstream_pr) if v]
        return ", ".join(shown)

    def lines(self) -> list[str]:
        """What `check` prints under the patch: each field given, one a line."""
        return [f"{name.lower()}: {value}" for name, value in self.headers()]
