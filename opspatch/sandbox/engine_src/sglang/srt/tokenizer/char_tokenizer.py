"""A character tokenizer: one token per printable ASCII character, plus BOS and newline.

A small readable vocabulary keeps the model tiny and the output legible. Characters outside the
vocabulary encode as `?` (the stand-in has no byte fallback).
"""

from __future__ import annotations

from collections.abc import Iterable

BOS_TOKEN = "<s>"
UNKNOWN_CHARACTER = "?"


class CharTokenizer:
    """Encode text to token ids and back; id 0 is BOS, which encode() puts first."""

    def __init__(self) -> None:
        self.vocab: list[str] = [BOS_TOKEN, "\n"] + [chr(code) for code in range(32, 127)]
        self._ids: dict[str, int] = {piece: index for index, piece in enumerate(self.vocab)}
        self.bos_token_id = 0
        self.eos_token_id = None  # the tiny model never ends a sequence on its own
        self.unknown_token_id = self._ids[UNKNOWN_CHARACTER]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self._ids.get(character, self.unknown_token_id) for character in text]
        return [self.bos_token_id] + ids if add_special_tokens else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        pieces = []
        for token_id in ids:
            if token_id == self.bos_token_id and skip_special_tokens:
                continue
            pieces.append(self.vocab[token_id])
        return "".join(pieces)

    def id_of(self, character: str) -> int:
        return self._ids[character]


def get_tokenizer(tokenizer_path: str) -> CharTokenizer:
    """Every model path of the stand-in shares the one character vocabulary."""
    return CharTokenizer()
