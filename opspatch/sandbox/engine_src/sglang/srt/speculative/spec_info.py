"""Which speculative algorithm a server runs."""

from __future__ import annotations

import enum


class SpeculativeAlgorithm(enum.Enum):
    NONE = "NONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    STANDALONE = "STANDALONE"

    @classmethod
    def from_string(cls, name: str | None) -> SpeculativeAlgorithm:
        if name is None:
            return cls.NONE
        name = name.upper()
        if name == "NEXTN":
            return cls.EAGLE
        return cls[name]

    def is_none(self) -> bool:
        return self is SpeculativeAlgorithm.NONE

    def is_eagle(self) -> bool:
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3)

    def is_standalone(self) -> bool:
        return self is SpeculativeAlgorithm.STANDALONE
