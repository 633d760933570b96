"""Pure checks on what an engine says: text in, findings out; no I/O, so the tests call the very
functions the agent runs on hosts.
"""

from __future__ import annotations


def log_tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
