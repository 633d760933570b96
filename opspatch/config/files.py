"""Reading the operator's files: one place where a patch, inventory or playbook file is read."""

from __future__ import annotations

from pathlib import Path

from opspatch.core.tomlsource import TomlDocument, parse_toml
from opspatch.errors import Location, SpecError


def read_text(path: Path) -> str:
    """The file's text (UTF-8).

    Raises:
        SpecError: the file does not exist, cannot be read, or is not UTF-8.
    """
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise SpecError(Location(str(path)), "file not found") from None
    except IsADirectoryError:
        raise SpecError(Location(str(path)), "is a folder, not a file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(Location(str(path)), f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise SpecError(Location(str(path)), f"cannot read: {exc.strerror}") from None


def read_toml(path: Path) -> TomlDocument:
    """Read and parse a TOML file (positions kept for `file:line` messages).

    Raises:
        SpecError: unreadable, not UTF-8, or not valid TOML.
    """
    return parse_toml(read_text(path), str(path))
