"""Python source bytes <-> text without losing a single byte."""

from __future__ import annotations

import codecs
import hashlib
import io
import itertools
import re
import threading
import tokenize
from dataclasses import dataclass

_NEWLINE_RE = re.compile(r"\r\n|\r|\n")


class SourceDecodeError(ValueError):
    """The bytes are not text in the encoding the file declares (or UTF-8 when it declares none)."""


@dataclass(frozen=True)
class SourceText:
    """Decoded source plus what it takes to encode it back exactly."""

    text: str
    encoding: str
    bom: bool
    newline: str

    @classmethod
    def decode(cls, data: bytes) -> SourceText:
        """Decode `data` as Python does (BOM, then cookie, then UTF-8).

        Raises:
            SourceDecodeError: undecodable bytes, an unknown cookie, or a lossy round trip.
        """
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as exc:
            raise SourceDecodeError(f"cannot determine the encoding: {exc.msg}") from None
        bom = data.startswith(codecs.BOM_UTF8)
        body = data[len(codecs.BOM_UTF8) :] if bom else data
        codec = "utf-8" if encoding == "utf-8-sig" else encoding
        try:
            text = body.decode(codec)
        except UnicodeDecodeError as exc:
            raise SourceDecodeError(
                f"byte {exc.start} is not valid {codec} ({exc.reason}); "
                "declare the file's encoding with a coding cookie or fix the file"
            ) from None
        source = cls(text=text, encoding=codec, bom=bom, newline=detect_newline(text))
        if source.encode(text) != data:
            raise SourceDecodeError(f"{codec} does not round-trip this file byte-exactly")
        return source

    def encode(self, text: str) -> bytes:
        """Encode edited text with the original encoding and BOM.

        Raises:
            SourceDecodeError: the text has characters the file's encoding cannot hold.
        """
        try:
            body = text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise SourceDecodeError(
                f"the new text has {exc.object[exc.start : exc.end]!r}, which {self.encoding} cannot encode"
            ) from None
        return codecs.BOM_UTF8 + body if self.bom else body


def detect_newline(text: str) -> str:
    """The file's first line ending (what inserted lines will use); LF when there is none."""
    match = _NEWLINE_RE.search(text)
    return match.group(0) if match else "\n"


def split_lines(text: str) -> list[str]:
    """Split into lines, each keeping its ending, the way Python's tokenizer counts lines.

    Unlike `str.splitlines`, form feeds and other Unicode separators do not end a line here, so
    line numbers agree with `ast` line numbers.
    """
    # `str.splitlines` (in C) also ends lines at form feeds and other separators: its result is
    # ours when it found no more lines than CR, LF and CRLF make (one such separator at the very
    # end makes the same last line either way)
    fast = text.splitlines(keepends=True)
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    if len(fast) == breaks + (1 if text and text[-1] not in "\r\n" else 0):
        return fast
    lines: list[str] = []
    start = 0
    for match in _NEWLINE_RE.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


def strip_newline(line: str) -> str:
    return line.rstrip("\r\n")


class LineIndex:
    """Converts `ast` positions (1-based line, UTF-8 byte column) to offsets into the text."""

    def __init__(self, text: str, lines: list[str] | None = None) -> None:
        self.text = text
        self.lines = split_lines(text) if lines is None else lines
        # the last start is one past the last line: insertion at the end
        self.starts: list[int] = [0, *itertools.accumulate(map(len, self.lines))]

    @classmethod
    def of(cls, text: str) -> LineIndex:
        """The index of `text`, made once for the same string: placing an edit and then the
        next on the text it leaves index the same texts (`remember`)."""
        with _RECENT_LOCK:
            known = _RECENT.get(id(text))
        if known is not None and known.text is text:
            return known
        return cls(text).remember()

    def remember(self) -> LineIndex:
        """Keep this index for `LineIndex.of(self.text)`, among the last few."""
        with _RECENT_LOCK:
            _RECENT[id(self.text)] = self
            while len(_RECENT) > 16:
                del _RECENT[next(iter(_RECENT))]
        return self

    def spliced(self, text: str, first: int, end: int) -> LineIndex:
        """The index of `text`, which is this index's text with lines `first` to `end` (and no
        other) changed: the lines around them are taken over, not split again."""
        low = self.starts[first - 1]
        high = len(text) - (len(self.text) - self.starts[end])
        return LineIndex(
            text, [*self.lines[: first - 1], *split_lines(text[low:high]), *self.lines[end:]]
        )

    def line_start(self, lineno: int) -> int:
        """Offset of the first character of line `lineno` (lineno = count+1 means end of text)."""
        return self.starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just past line `lineno`, its newline included."""
        return self.starts[lineno]

    def offset(self, lineno: int, col_utf8: int) -> int:
        """Offset of `ast`'s (lineno, col_offset); col_offset counts UTF-8 bytes."""
        line = self.lines[lineno - 1]
        prefix = line.encode("utf-8")[:col_utf8].decode("utf-8", errors="strict")
        return self.starts[lineno - 1] + len(prefix)

    def line_text(self, lineno: int) -> str:
        return strip_newline(self.lines[lineno - 1]) if 0 < lineno <= len(self.lines) else ""

    def indentation(self, lineno: int) -> str:
        line = self.line_text(lineno)
        return line[: len(line) - len(line.lstrip(" \t\f"))]


_RECENT: dict[int, LineIndex] = {}
_RECENT_LOCK = threading.Lock()


def sha256_hex(data: bytes) -> str:
    """The sha256 of `data` as 64 lowercase hex digits: how every file version is named (the
    ledger, host backups, plans). The host agent keeps its own copy: it runs on hosts alone."""
    return hashlib.sha256(data).hexdigest()
