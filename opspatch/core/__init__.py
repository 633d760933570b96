"""The pure core: what a patch is and what it does to source text, with no I/O at all.

Lives here: the patch model and its TOML parsing (`spec`, `tomlsource`), the file-schema helpers
and the one translation of a schema error into `file:line: field: problem` (`fileschema`),
Python parsing that refuses code nested too deeply (`syntax`), structural anchors
(`anchors`), the edit engine (`edit`: apply, detect, reverse, unapply), validation (`validate`),
unified diffs (`unified`), byte-exact source text (`source`), the host and rollout-policy models
(`host`, `policy`) and the words states are reported in (`vocabulary`).

May import: the standard library, pydantic/packaging/unidiff, and `opspatch.errors`. Never a
transport, the ledger, typer or torch (`.importlinter` enforces it): everything here takes values
and returns values, so it is tested with plain inputs and golden outputs.
"""
