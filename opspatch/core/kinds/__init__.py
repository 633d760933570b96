"""The edit kinds, and their registry: the one list of kinds a patch's `edits` may hold."""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from opspatch.core.kinds.base import EditKind
from opspatch.core.kinds.delete import DeleteEdit
from opspatch.core.kinds.diff import DiffEdit
from opspatch.core.kinds.insert import InsertEdit
from opspatch.core.kinds.move import MoveEdit
from opspatch.core.kinds.replace import ReplaceEdit

Edit = Annotated[
    InsertEdit | ReplaceEdit | DeleteEdit | MoveEdit | DiffEdit, Field(discriminator="kind")
]
"""An edit of any kind; the registry (a kind not listed here is refused as an unknown kind)."""

KINDS: dict[str, type[EditKind]] = {
    get_args(model.model_fields["kind"].annotation)[0]: model
    for model in get_args(get_args(Edit)[0])
}
"""Each kind's word (`insert`) to its model, read from the registry above."""
