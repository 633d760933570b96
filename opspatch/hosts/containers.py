"""What a container is, as its runtime reported it when it was inspected: the identity a
container transport pins (`hosts.transport.container`) and says on the transport's protocol
(`Transport.container`), which status, diagnose and the ledger's file versions read without
asking which transport they hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ContainerIdentity:
    """Which container a name stood for when it was inspected: its id, when it was created (the
    runtime's own text), the image it was created from, whether it was running, and its labels
    (the image's among them: a baked image's say which patch it carries, `hosts.image`)."""

    runtime: str
    name: str
    id: str
    created: str
    image: str
    running: bool
    status: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "name": self.name,
            "id": self.id,
            "created": self.created,
            "image": self.image,
        }
