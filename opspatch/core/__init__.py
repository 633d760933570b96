"""The pure core: what a patch is and what it does to source text, with no I/O at all.

Lives here: the patch model and its TOML parsing (`spec`, `tomlsource`, `fileschema`: one
translation of schema errors into `file:line: field: problem` for every file kind), structural
anchors (`anchors`), where an edit goes (`placement`), the edit engine (`edit`: apply, detect,
reverse, unapply), validation (`validate`), parsing that refuses what is too deep (`syntax`),
unified diffs (`unified`), byte-exact source text (`source`), the version gate (`gate`), the host
and rollout-policy models (`host`, `policy`) and the words states are reported in (`vocabulary`).

May import: the standard library, pydantic/packaging/unidiff, and `opspatch.errors`. Never a
transport, the ledger, typer or torch (`.importlinter` enforces it): everything here takes values
and returns values, so it is tested with plain inputs and golden outputs.
"""
