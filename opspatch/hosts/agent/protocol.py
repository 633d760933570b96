"""The agent's contract with the controller: operations are registered by name, take the
request's `args` (a JSON object) and return a JSON object; an expected refusal is an `OpFailure`
with a stable, machine-readable `code`.

Adding an operation: in the module of its concern, write `def op_name(args) -> dict`, decorate it
with `@operation("name")`, raise `OpFailure(code, message, data)` for expected refusals, and make
sure `opspatch.hosts.agent.dispatch` imports that module. That is the whole pattern.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # aliases for the checker only: `dict[...]` cannot be evaluated on Python 3.8
    Args = dict[str, Any]
    Result = dict[str, Any]

OPERATIONS: dict[str, Callable[[Args], Result]] = {}


class OpFailure(Exception):
    """An expected refusal or failure; `code` is stable and machine-readable."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}


def operation(name: str) -> Callable[[Callable[[Args], Result]], Callable[[Args], Result]]:
    """Register a function as the operation `name`."""

    def register(function: Callable[[Args], Result]) -> Callable[[Args], Result]:
        OPERATIONS[name] = function
        return function

    return register


def os_failure(code: str, what: str, exc: OSError) -> OpFailure:
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    return OpFailure(
        code,
        f"{what}: {exc.strerror or exc}",
        {"errno": name, "filename": exc.filename},
    )
