"""The edit kinds, and their registry: the one list of kinds a patch's `edits` may hold.

Each kind is one module here (`insert`, `replace`, `delete`, `move`, `diff`): its model, its
alternative model, its placement, its detection and its undo, behind the protocol of
`kinds/base.py:EditKind`. `Edit` below is the registry: the discriminated union (by `kind`) that
the patch model validates `edits` against, and so the only place a new kind is listed;
`opspatch.core.edit` (apply, detect, unapply) drives every kind through the protocol alone.
"""

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
