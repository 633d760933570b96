"""Which test resources a process starts (the test tiers' check, tests/tiers.py).

The tests put this folder on PYTHONPATH, so every Python the tests start, however deep (the CLI,
the host agent over the local transport, a sandbox's engine), imports this module at start-up.
While `OPSPATCH_TEST_RESOURCE_LOG` names a file it installs an audit hook that appends one line,
`<resource> <program>`, for every process started whose command line is a resource's: sshd,
PostgreSQL's programs, podman, the SGLang router, a program that needs root (sudo, useradd,
mount, ...), or an engine (`python -m sglang.launch_server`: `sglang` for a real SGLang
server, whose environment sets `SGLANG_USE_CPU_ENGINE`, else `engine`, the stand-in). A program
found in the temporary folder (a test's stand-in for podman, say) is not the real thing and
counts for nothing. The test process installs the same hook (`install(every=True)`), where any
other process started counts as `process` and each line names the thread
(`<resource>@<thread> <program>`); tests/tiers.py reads the file after each test phase. Without
the variable this module does nothing, so it costs one import.

Python 3.8's grammar (the host agent runs on it in some tests), and the standard library only.
"""

from __future__ import annotations

import _thread
import os
import sys

LOG_VARIABLE = "OPSPATCH_TEST_RESOURCE_LOG"

PROGRAMS = {
    "sshd": "ssh",
    "initdb": "postgres",
    "pg_ctl": "postgres",
    "pg_ctlcluster": "postgres",
    "postgres": "postgres",
    "podman": "podman",
    "debootstrap": "podman",  # builds the sandbox's base image for podman
    "sglang-router": "router",
    "sudo": "root",
    "runuser": "root",
    "visudo": "root",
    "useradd": "root",
    "userdel": "root",
    "usermod": "root",
    "groupadd": "root",
    "chpasswd": "root",
    "mount": "root",
    "umount": "root",
}
"""A program's name, and the resource starting it counts as."""

MODULES = {
    "sglang.launch_server": "engine",
    "sglang_router.launch_router": "router",
    "sglang_router.launch_server": "router",
}
"""A module run as `python -m MODULE`, and its resource."""

SHELLS = frozenset(("sh", "bash", "dash", "zsh"))
WRAPPERS = frozenset(("exec", "env", "nohup", "setsid", "nice", "command", "time", "stdbuf"))
"""Programs that run the rest of their command line (their options and VAR=value skipped)."""
SEPARATORS = frozenset((";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", "then", "do", "else"))

_counted_as = None  # set by `counted_as`: what every resource started meanwhile counts as
_temp = None


def _name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _is_stub(program: str, env: object) -> bool:
    """Whether `program` is not the real thing: not found, or found in the temporary folder."""
    import shutil
    import tempfile

    global _temp
    if _temp is None:
        _temp = os.path.realpath(tempfile.gettempdir()) + os.sep
    if "/" in program:
        found = program
    else:
        path = env.get("PATH") if isinstance(env, dict) else None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        found = shutil.which(program, path=path if path is not None else os.environ.get("PATH"))
    return found is None or os.path.realpath(found).startswith(_temp)


def _shell_words(script: str) -> list:
    import shlex

    lexer = shlex.shlex(script.replace("\n", ";"), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: the words as they come
        return script.split()


def _simple_commands(words: list) -> list:
    commands, current = [], []
    for word in words:
        if word in SEPARATORS or (word and set(word) <= set(";&|()")):
            if current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    if current:
        commands.append(current)
    return commands


def classify(argv: list, env: object = None) -> list:
    """The `(resource, program)` pairs that running `argv` starts (see the module's doc)."""
    found: list = []
    _classify(list(argv), env, found, 0)
    return found


REAL_ENGINE_VARIABLE = "SGLANG_USE_CPU_ENGINE"
"""Set in the environment of every real SGLang server the tests start (`opspatch.sandbox.real`):
such a `python -m sglang.launch_server` counts as `sglang`, the stand-in's as `engine`."""


def _real_engine(env: object, assigned: list) -> bool:
    if any(word.split("=", 1)[0] == REAL_ENGINE_VARIABLE for word in assigned):
        return True
    if not isinstance(env, dict):
        return bool(os.environ.get(REAL_ENGINE_VARIABLE))
    value = env.get(REAL_ENGINE_VARIABLE, env.get(REAL_ENGINE_VARIABLE.encode()))
    return bool(value)


def _classify(words: list, env: object, found: list, depth: int, assigned: tuple = ()) -> None:
    if depth > 8:
        return
    assigned = list(assigned)
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        assigned.append(words[0])
        words = words[1:]  # VAR=value before the program
    if not words:
        return
    name = _name(words[0])
    rest = words[1:]
    if name in WRAPPERS:
        if name == "command" and rest and rest[0] in ("-v", "-V"):
            return  # looks the program up, runs nothing
        while rest and (rest[0].startswith("-") or "=" in rest[0]):
            assigned += [rest[0]] if "=" in rest[0] else []
            rest = rest[1:]
        _classify(rest, env, found, depth + 1, tuple(assigned))
        return
    if name in SHELLS and "-c" in rest[:-1]:
        script = rest[rest.index("-c") + 1]
        for command in _simple_commands(_shell_words(script)):
            _classify(command, env, found, depth + 1)
        return
    if name in PROGRAMS and not _is_stub(words[0], env):
        found.append((PROGRAMS[name], " ".join(words)[:200]))
        if name in ("sudo", "runuser") and "--" in rest:  # and what it runs, as that user
            _classify(rest[rest.index("--") + 1 :], env, found, depth + 1)
        return
    if name.startswith("python"):
        for index, word in enumerate(rest[:-1]):
            if word == "-c":
                return  # the code and its arguments follow, no module
            if word == "-m":
                if rest[index + 1] in MODULES:
                    resource = MODULES[rest[index + 1]]
                    if resource == "engine" and _real_engine(env, assigned):
                        resource = "sglang"
                    found.append((resource, " ".join(words)[:200]))
                return


def _argv(event: str, args: tuple) -> tuple:
    """The command line and environment of a process-starting audit event, or (None, None)."""
    if event == "subprocess.Popen":  # (executable, args, cwd, env); asyncio's processes too
        return args[1], args[3]
    if event in ("os.posix_spawn", "os.exec"):  # (path, argv, env)
        return args[1], args[2]
    if event == "os.spawn":  # (mode, path, args, env)
        return args[2], args[3]
    if event == "os.system":  # (command,)
        return ["/bin/sh", "-c", args[0]], None
    return None, None


def _record(pairs: list) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    text = "".join(f"{resource} {' '.join(program.split())}\n" for resource, program in pairs)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, text.encode("utf-8", "replace"))
    finally:
        os.close(descriptor)


_EVENTS = frozenset(("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system"))


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS:  # every audited event comes here: open, import, compile, ...
        return
    try:
        argv, env = _argv(event, args)
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        words = [os.fsdecode(word) for word in argv] if argv else []
        pairs = classify(words, env)
        if _every and not pairs:
            pairs = [("process", " ".join(words)[:200])]
        if pairs:
            if _counted_as is not None:
                pairs = [(_counted_as, program) for _, program in pairs]
            if _every:  # which thread: one a test left running is not the next test's
                pairs = [(f"{resource}@{_thread.get_ident()}", p) for resource, p in pairs]
            _record(pairs)
    except Exception as exc:  # never in the way of what the test runs; said where it is read
        _record([("unreadable", f"{event}: {exc!r}")])


_installed = False
_every = False  # also every other process started, as `process` (in the test process only)


def install(every: bool = False) -> None:
    """Install the audit hook in this process (once; an audit hook cannot be removed); with
    `every`, a process that is no resource's counts as `process`."""
    global _installed, _every
    _every = _every or every
    if not _installed and hasattr(sys, "addaudithook"):
        sys.addaudithook(_hook)
        _installed = True


class counted_as:  # noqa: N801 - used as a context manager, like contextlib's
    """Within `with counted_as("postgres"):`, what this process starts counts as that resource
    (pgkit's cluster, started through runuser as a service user when the tests run as root)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource

    def __enter__(self) -> None:
        global _counted_as
        self._outer = _counted_as
        _counted_as = self.resource

    def __exit__(self, *exc: object) -> None:
        global _counted_as
        _counted_as = self._outer


if os.environ.get(LOG_VARIABLE):
    install()
