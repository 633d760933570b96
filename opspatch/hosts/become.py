"""Raising privileges (`become`) for the host operations that need them, and for nothing else."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from opspatch.core.host import DEFAULT_BECOME_USER, Host
from opspatch.core.reasons import Reason
from opspatch.errors import BecomeError
from opspatch.hosts.transport.base import Command, CommandResult


class RunsAs(Enum):
    """Who runs an agent operation on a host whose inventory says `become` (a fact of each
    operation's descriptor, `results.Operation.runs_as`; without `become`, the login user runs
    every one)."""

    LOGIN = "login"
    """The login user, never raised (whoami names its user itself; measure asks over HTTP);
    it changes nothing on the host."""
    READ = "read"
    """Read-only: the login user, asked again as the become user when the login user may not
    read what it needs (a file or log readable by its owner alone)."""
    CHANGE = "change"
    """It changes the host (the lock, the file, the live plugin, the running engine's fixes):
    the become user."""
    RESTART = "restart"
    """It stops or starts the engine: the user who restarts it (`restart_user`)."""

    @property
    def changes(self) -> bool:
        """Whether an operation run this way changes the host (a change or a restart): one
        lost with its connection did something unknown, where a read or a login operation did
        nothing and may be sent again (`resident.ResidentEndpoint`)."""
        return self in (RunsAs.CHANGE, RunsAs.RESTART)


ROOT_RESTART_KINDS = frozenset({"systemd", "supervisor"})
"""Restart strategies that manage a system service: raised as root, whatever `become_user`."""

SUDO_PROMPT = "[opspatch] sudo password: "
"""sudo's prompt (`-p`), written to stderr when it reads the password; removed from messages."""


def restart_user(host: Host) -> str:
    """Who restarts the engine: root for systemd and supervisor (system services), else the
    become user (a start command starts the engine as the user who owns it)."""
    restart = host.engine.restart
    if restart is not None and restart.kind in ROOT_RESTART_KINDS:
        return DEFAULT_BECOME_USER
    return host.become.user


def raised_user(host: Host, runs_as: RunsAs) -> str | None:
    """The user an operation that `runs_as` runs as through sudo on `host`, or None for the
    login user."""
    if not host.become.enabled or runs_as in (RunsAs.LOGIN, RunsAs.READ):
        return None
    return restart_user(host) if runs_as is RunsAs.RESTART else host.become.user


def raised_users(host: Host) -> tuple[str, ...]:
    """Every user a run may raise to on `host` (the become user first); empty without become."""
    if not host.become.enabled:
        return ()
    return tuple(dict.fromkeys((host.become.user, restart_user(host))))


def sudo_command(user: str, program: Sequence[str], *, with_password: bool) -> Command:
    """`program` run as `user` through sudo, as one command.

    Without a password sudo must not ask (`-n`: it fails at once with "a password is
    required"); with one it reads it from stdin (`-S`), every time (`-k`), after a prompt we
    recognise (`-p`). `-H` gives the program the target user's HOME, as Ansible does.
    """
    flags = ("-S", "-k", "-p", SUDO_PROMPT) if with_password else ("-n",)
    return Command(("sudo", "-H", *flags, "-u", user, "--", *program))


def not_allowed_to_read(runs_as: RunsAs, reply: Mapping[str, Any]) -> bool:
    """Whether the agent's refusal says the login user may not read what a read-only operation
    needs (a file or log only its owner may read): worth asking again as the become user."""
    if runs_as is not RunsAs.READ:
        return False
    code = str(reply.get("code") or "")
    message = str(reply.get("message") or "")
    return code == "permission-denied" or (
        code == "agent-error" and message.startswith("PermissionError")
    )


# ---------------------------------------------------------------------------------------------
# sending raised execs


class Sudo:
    """How one host's raised execs are sent, for one run: without a password until the host's
    sudo says it needs one for a user, then with the password ahead of the payload on stdin.
    What was learned is kept per user, so each later operation is one exec."""

    def __init__(self, host: Host, passwords: BecomePasswords) -> None:
        self.host = host
        self.passwords = passwords
        self._password_needed: dict[str, bool] = {}

    def run(
        self,
        user: str,
        program: Sequence[str],
        payload: bytes,
        *,
        send: Callable[[Command, bytes], CommandResult],
        program_text: str = "",
    ) -> CommandResult:
        """`program` as `user` with `payload` on stdin, through `send` (one exec on the host).

        Raises:
            BecomeError: sudo is missing, needs a password none of the sources has, refused the
                password, denies the command, requires a terminal, or does not know `user`.
        """
        if not self._password_needed.get(user):
            result = send(sudo_command(user, program, with_password=False), payload)
            refusal = _refusal_of(result, program_text)
            if refusal is None:
                self._password_needed[user] = False
                return result
            if refusal.reason != "password-required":
                raise become_error(self.host, user, refusal, source=None)
            self._password_needed[user] = True
        # sudo reads the first line as the password; a wrong one makes it read the next lines as
        # more attempts (the payload: in a run only the lock's, which carries no file, because
        # preflight's lock is the first raised exec) and fail without running the program
        password, source = self.passwords.password_for(self.host, user)
        result = send(
            sudo_command(user, program, with_password=True),
            password.encode("utf-8") + b"\n" + payload,
        )
        refusal = _refusal_of(result, program_text)
        if refusal is not None:
            if refusal.reason == "password-required":  # it asked again: the password was wrong
                refusal = replace(refusal, reason="password-rejected")
            raise become_error(self.host, user, refusal, source=source)
        return result


def _refusal_of(result: CommandResult, program_text: str) -> SudoRefusal | None:
    stderr = result.stderr.decode("utf-8", errors="replace")
    return sudo_refusal(result.exit_code, stderr, program_text=program_text)


# ---------------------------------------------------------------------------------------------
# what sudo said


@dataclass(frozen=True)
class SudoRefusal:
    """sudo did not run the command: a stable `reason` and sudo's own words."""

    reason: str
    words: str


_SUDO_SAYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("requiretty", ("must have a tty",)),
    ("unknown-user", ("unknown user",)),
    (
        "denied",
        (
            "is not allowed to execute",
            "is not in the sudoers file",
            "is not allowed to run sudo",
            "may not run sudo",
        ),
    ),
    ("password-rejected", ("incorrect password attempt", "Sorry, try again.")),
    ("password-required", ("a password is required", "no password was provided")),
    ("interpreter-missing", ("command not found",)),
)


def sudo_refusal(exit_code: int, stderr: str, *, program_text: str = "") -> SudoRefusal | None:
    """Whether sudo refused to run the command, from its exit status and stderr; None when the
    command itself ran (it then replies or fails on its own).

    `program_text` (the agent's `-c` program) is elided from sudo's words: sudo quotes the whole
    command line it refused, which would otherwise flood the message.
    """
    if exit_code == 0 or "Traceback (most recent call last)" in stderr:
        return None
    text = stderr.replace(SUDO_PROMPT, "\n")
    if program_text:
        text = text.replace(program_text, "…")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if exit_code == 127 and any("sudo" in line and "not found" in line for line in lines):
        return SudoRefusal("sudo-missing", _words(lines, "not found"))
    for reason, needles in _SUDO_SAYS:
        for needle in needles:
            if any(needle in line for line in lines):
                return SudoRefusal(reason, _words(lines, needle))
    sudo_lines = [line for line in lines if line.startswith("sudo:")]
    if sudo_lines:
        return SudoRefusal("sudo-failed", " ".join(sudo_lines)[:500])
    return None


def _words(lines: Sequence[str], needle: str) -> str:
    """sudo's line that says it (a refusal sudo spreads over several lines is joined)."""
    for index, line in enumerate(lines):
        if needle in line:
            if line.startswith("Sorry, user") and not line.rstrip().endswith("."):
                line = " ".join(lines[index:])  # the refused command spanned lines
            return re.sub(r"\s+", " ", line).rstrip(".")[:500]
    return ""


# ---------------------------------------------------------------------------------------------
# passwords


class BecomePasswords:
    """The sudo passwords of one run: asked for only when sudo says it needs one.

    A host's password comes from the controller's environment variable its inventory names
    (`become_password_env`), else from `prompt` (the CLI's terminal prompt; None without a
    terminal), asked at most once per run and used for every host that needs it. Nothing is
    written anywhere; the value lives in this object for the run.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        prompt: Callable[[str], str] | None = None,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self._prompt = prompt
        self._asked: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the password, whatever prints this object
        return f"BecomePasswords(prompt={'yes' if self._prompt else 'no'})"

    def password_for(self, host: Host, user: str) -> tuple[str, str]:
        """The password for `host`'s sudo, and where it came from (for messages).

        Raises:
            BecomeError: no source has one (`password-missing`, naming the host and the key to
                set), or it cannot be sent (`password-malformed`: it contains a line break).
        """
        name = host.become.password_env
        if name and self._environ.get(name):
            return _sendable(self._environ[name], host, f"${name}"), f"${name}"
        if self._prompt is not None:
            with self._lock:
                if self._asked is None:
                    try:
                        self._asked = self._prompt(
                            "sudo password (opspatch become; asked once for this run): "
                        )
                    except EOFError:
                        raise BecomeError(
                            f"[{host.name}] sudo needs a password to run as {user} and none was "
                            "typed; nothing was changed",
                            host=host.name,
                            reason=Reason.PASSWORD_MISSING,
                        ) from None
            return _sendable(self._asked, host, "the terminal"), "the terminal"
        if name:
            hint = (
                f"export {name} (the variable become_password_env names) with the password, or "
                "run on a terminal to be asked"
            )
            why = f"the environment variable {name} is not set and there is no terminal to ask on"
        else:
            hint = (
                f'set become_password_env = "OPSPATCH_BECOME_PASSWORD" for {host.name} in '
                f"inventory {host.inventory!r} and export that variable, or run on a terminal to "
                "be asked once, or allow the engine's interpreter without a password in sudoers"
            )
            why = "become_password_env is not set and there is no terminal to ask on"
        raise BecomeError(
            f"[{host.name}] sudo needs a password to run as {user}, and none is available "
            f"({why}); nothing was changed",
            host=host.name,
            reason=Reason.PASSWORD_MISSING,
            hint=hint,
        )


def _sendable(password: str, host: Host, source: str) -> str:
    if "\n" in password or "\r" in password:
        raise BecomeError(
            f"[{host.name}] the sudo password from {source} contains a line break; sudo reads one "
            "line",
            host=host.name,
            reason=Reason.PASSWORD_MALFORMED,
        )
    return password


# ---------------------------------------------------------------------------------------------
# refusals as errors


def become_error(host: Host, user: str, refusal: SudoRefusal, *, source: str | None) -> BecomeError:
    """The `BecomeError` for a sudo refusal on `host` when raising to `user`, its `reason` the
    host's report code for what sudo said."""
    login = host.user or "the login user"
    python = host.engine.python or "the engine's interpreter"
    words = refusal.words
    said: dict[str, tuple[Reason, str, str]] = {
        "sudo-missing": (
            Reason.SUDO_MISSING,
            f"sudo is not installed on the host ({words})",
            "install sudo there, or set become = false for this host",
        ),
        "password-required": (
            Reason.PASSWORD_MISSING,
            f"sudo needs a password to run as {user}: {words}",
            "set become_password_env in the inventory and export that variable, or run on a "
            "terminal to be asked",
        ),
        "password-rejected": (
            Reason.PASSWORD_REJECTED,
            f"sudo refused the password from {source or 'the run'} for running as {user}: {words}",
            "it is the login user's own password (as for sudo on a terminal); check the value "
            "of the variable become_password_env names, or type it again",
        ),
        "denied": (
            Reason.SUDO_DENIED,
            f"sudo does not allow {login} to run the host agent as {user}: {words}",
            f"allow it in sudoers (visudo), e.g. `{login} ALL=({user}) NOPASSWD: {python}`",
        ),
        "requiretty": (
            Reason.REQUIRETTY,
            f"sudo requires a terminal (requiretty): {words}",
            f"opspatch runs commands without a terminal; add `Defaults:{login} !requiretty` to "
            "sudoers (visudo)",
        ),
        "unknown-user": (
            Reason.BECOME_USER_UNKNOWN,
            f"sudo does not know the user {user} on this host: {words}",
            "set become_user to a user that exists there",
        ),
        "interpreter-missing": (
            Reason.INTERPRETER_MISSING,
            f"engine.python cannot be run as {user}: {words}",
            "set engine.python in the inventory to the interpreter the server runs with",
        ),
    }
    reason, message, hint = said.get(
        refusal.reason,
        (Reason.BECOME_REFUSED, f"sudo failed to run as {user}: {words}", "see sudo's message"),
    )
    return BecomeError(
        f"[{host.name}] become: {message}; nothing was run as {user}",
        host=host.name,
        reason=reason,
        hint=hint,
    )
