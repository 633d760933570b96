"""The pure core: what a patch is and what it does to source text, with no I/O at all.

Lives here: the patch model and its TOML parsing (`spec`, the front door, over `target`,
`selectors`, `incident` and the edit kinds; `tomlsource`, `fileschema`: one translation of
schema errors into `file:line: field: problem` for every file kind), structural anchors
(`anchors`), the edit kinds (`kinds`: one module per kind, its model, placement, detection and
undo behind one protocol, listed once in the registry), what placing an edit shares
(`placement`), the edit engine (`edit`: apply, detect, reverse, unapply, through the kinds), validation (`validate`), parsing that refuses what is too deep (`syntax`),
unified diffs (`unified`), byte-exact source text (`source`), the version gate (`gate`), the host
and rollout-policy models (`host`, `policy`) and the words states are reported in (`vocabulary`).

May import: the standard library, pydantic/packaging/unidiff, and `opspatch.errors`. Never a
transport, the ledger, typer or torch (`.importlinter` enforces it): everything here takes values
and returns values, so it is tested with plain inputs and golden outputs.
"""
