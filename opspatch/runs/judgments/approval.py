"""A second pair of eyes before an apply: the patch's sha256 signed with OpenSSH, kept in the
ledger, verified against the playbook's `allowed_signers` (docs/team.md)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opspatch.core.policy import TeamSettings
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command
from opspatch.errors import ApprovalRefused, InputError
from opspatch.ledger.records import Approval
from opspatch.ledger.store import Ledger

NAMESPACE = "opspatch"
"""The OpenSSH signature namespace: a signature made for git or for a file cannot pass here."""

SSH_KEYGEN_SECONDS = 30.0


@dataclass(frozen=True)
class Approved:
    """The verified approvals an apply goes ahead with (signers other than its author)."""

    approvals: tuple[Approval, ...]
    allowed_signers: str

    @property
    def principals(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.principal for a in self.approvals))


def approval_message(patch_sha256: str) -> bytes:
    """What a signer signs: the patch's sha256, said to be an opspatch approval."""
    return f"opspatch approve {patch_sha256}\n".encode("ascii")


def _ssh_keygen(*args: str, patch_sha256: str) -> subprocess.CompletedProcess[bytes]:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise InputError(
            "ssh-keygen is not installed (OpenSSH signs and verifies approvals)",
            hint="install the OpenSSH client (apt-get install openssh-client)",
        )
    return subprocess.run(
        [found, "-Y", *args],
        input=approval_message(patch_sha256),
        capture_output=True,
        timeout=SSH_KEYGEN_SECONDS,
        check=False,
    )


def sign(key: Path, patch_sha256: str) -> str:
    """`key` a private key (or a `.pub`: the agent's key); `InputError` when ssh-keygen refuses."""
    if not key.exists():
        raise InputError(f"no key file {key}", hint="give --key the private key (or its .pub)")
    try:
        done = _ssh_keygen("sign", "-f", str(key), "-n", NAMESPACE, patch_sha256=patch_sha256)
    except subprocess.TimeoutExpired:
        raise InputError(
            f"ssh-keygen did not sign with {key} within {SSH_KEYGEN_SECONDS:g} s",
            hint="a key with a passphrase needs ssh-agent (ssh-add it, pass the .pub)",
        ) from None
    signature = done.stdout.decode("ascii", errors="replace")
    if done.returncode != 0 or "BEGIN SSH SIGNATURE" not in signature:
        said = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise InputError(
            f"ssh-keygen could not sign with {key}: {said}",
            hint="give --key an SSH private key (a key with a passphrase: ssh-add it, pass the .pub)",
        )
    return signature


def verifies(allowed_signers: Path, approval: Approval) -> bool:
    """Whether `approval`'s signature is its principal's, for its sha256, per `allowed_signers`."""
    with tempfile.TemporaryDirectory(prefix="opspatch-verify-") as folder:
        signature = Path(folder) / "approval.sig"
        signature.write_text(approval.signature, encoding="ascii")
        args = ["verify", "-f", str(allowed_signers), "-I", approval.principal, "-n", NAMESPACE]
        try:
            done = _ssh_keygen(*args, "-s", str(signature), patch_sha256=approval.patch_sha256)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def approve_patch(
    ledger: Ledger,
    patch: LoadedPatch,
    *,
    key: Path,
    principal: str,
    operator: str,
    command_line: str,
) -> Approval:
    signature = sign(key, patch.sha256)
    run_id = ledger.record_approval(
        patch_id=patch.spec.id,
        patch_sha256=patch.sha256,
        principal=principal,
        signature=signature,
        operator=operator,
        command_line=command_line,
    )
    return next(a for a in ledger.approvals(patch.sha256) if a.run_id == run_id)


def author_principals(operator: str) -> frozenset[str]:
    """The account is read from the password database: `$USER` is the caller's to set."""
    return frozenset({operator, operator.split("@", 1)[0], _login_user()})


def _login_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without an entry (a container's): the number is the account
        return str(os.getuid())


def _by_author(approval: Approval, authors: frozenset[str]) -> bool:
    """Signed as the author, or recorded by the author's account under another principal."""
    return approval.principal in authors or approval.operator.split("@", 1)[0] in authors


def require_approval(
    ledger: Ledger, patch: LoadedPatch, team: TeamSettings, *, operator: str
) -> Approved | None:
    """None when the playbook asks for none; `ApprovalRefused` when no signature verifies, or only
    the author's."""
    if not team.require_approval:
        return None
    assert team.allowed_signers is not None  # the playbook's loader requires it
    signers = Path(team.allowed_signers)
    if not signers.is_file():
        raise ApprovalRefused(
            f"the allowed_signers file {signers} (the playbook's or fleet.toml's [team]) does "
            "not exist",
            hint="nothing was changed; write it in OpenSSH allowed_signers format "
            '(`principal namespaces="opspatch" ssh-ed25519 AAAA...`)',
        )
    recorded = ledger.approvals(patch.sha256)
    sign_it = (
        f"a second operator signs it: "
        f"`{remedy_text(Command.APPROVE, patch.reference, key='KEY', principal='NAME')}` "
        "(the same ledger)"
    )
    if not recorded:
        raise ApprovalRefused(
            f"{patch.spec.id} (sha256 {patch.sha256[:12]}) needs an approval and nobody signed it",
            hint=f"nothing was changed; {sign_it}",
        )
    valid = [a for a in recorded if verifies(signers, a)]
    if not valid:
        raise ApprovalRefused(
            f"no signature of {patch.spec.id} (sha256 {patch.sha256[:12]}) verifies against "
            f"{signers}: {_principals(recorded)} signed it with a key that file does not allow",
            hint=f"nothing was changed; add the signer's key to {signers}, or {sign_it}",
        )
    authors = author_principals(operator)
    others = [a for a in valid if not _by_author(a, authors)]
    if not others:
        raise ApprovalRefused(
            f"{patch.spec.id} is signed only by its author ({_principals(valid)}, who runs this "
            "apply): an approval is a second operator's",
            hint=f"nothing was changed; {sign_it}",
        )
    return Approved(tuple(others), str(signers))


def _principals(approvals: Sequence[Approval]) -> str:
    return ", ".join(dict.fromkeys(a.principal for a in approvals))
