"""The socket's protocol: one JSON object on one line each way (a request, then its reply), then
the connection closes. No code travels: a request names a module, the sha256 its file on disk must
have and the definitions to take from it (`fixes`)."""

from __future__ import annotations

import json
import socket
from typing import Any, BinaryIO

MAX_LINE_BYTES = 1 << 20
"""The longest request or reply line read (a request lists definitions, never code)."""

ASK_TIMEOUT_S = 150.0
"""How long `ask` waits for a reply by default: longer than the entry rank may wait (twice
`boundary.BOUNDARY_TIMEOUT_S`: for a boundary, then for every rank), so it is answered, not cut."""

# Refusal codes of the delivery path (`fixes` has its own for what a fix refuses).
BAD_REQUEST = "bad-request"
PEER_NOT_ALLOWED = "peer-not-allowed"
NOT_ENTRY_RANK = "not-entry-rank"
NO_BOUNDARY = "no-boundary"
OUTCOME_UNKNOWN = "outcome-unknown"
PLUGIN_ERROR = "plugin-error"


class WireError(Exception):
    """A line that is not one JSON object of acceptable size; `code` is a refusal code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def refusal(code: str, message: str) -> dict[str, Any]:
    """A reply that took nothing, saying why."""
    return {"ok": False, "took": [], "refused": {"code": code, "message": message}}


def encode(document: dict[str, Any]) -> bytes:
    """One line: the document as compact JSON, then a newline."""
    return (json.dumps(document, separators=(",", ":"), default=str) + "\n").encode("utf-8")


def read_document(stream: BinaryIO) -> dict[str, Any]:
    """The next line of `stream` as a JSON object.

    Raises:
        WireError: no whole line, a line over MAX_LINE_BYTES, not JSON, or not an object.
    """
    line = stream.readline(MAX_LINE_BYTES + 1)
    if len(line) > MAX_LINE_BYTES:
        raise WireError(BAD_REQUEST, f"the line is longer than {MAX_LINE_BYTES} bytes")
    if not line.endswith(b"\n"):
        raise WireError(BAD_REQUEST, "the connection closed before a whole line was sent")
    try:
        document = json.loads(line.decode("utf-8"))
    except ValueError as error:
        raise WireError(BAD_REQUEST, f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise WireError(BAD_REQUEST, "a request is one JSON object")
    return document


def ask(path: str, request: dict[str, Any], timeout: float = ASK_TIMEOUT_S) -> dict[str, Any]:
    """Send `request` to the socket at `path` and return its reply.

    Raises:
        OSError: the socket cannot be reached (no such file, nobody listening, refused by mode).
        WireError: the reply is not one JSON object (the process closed the connection early).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        connection.connect(path)
        connection.sendall(encode(request))
        with connection.makefile("rb") as stream:
            return read_document(stream)
