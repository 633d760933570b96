"""Runs: what opspatch does to a fleet, built from host operations and recorded in the ledger.

Three rooms (docs/architecture.md, "The layers"), layered in `.importlinter`:
`commands` (one module per command, named after it), `fleet` (the run engine every command runs
through: fleet run, host session, steps, executor, recorder, rotation, the run's leases) and
`judgments` (pure: facts already read, judged); `report` holds the values all three share.

May import: `opspatch.hosts`, `opspatch.ledger`, `opspatch.config`, `opspatch.analysis`,
`opspatch.core` and `opspatch.errors`. Never the CLI: every run returns a report value, and
printing it is the CLI's.
"""
