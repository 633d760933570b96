"""Runs: what opspatch does to a fleet, built from host operations and recorded in the ledger.

Lives here: the per-host pipeline of an apply (`apply`), rollback and recover (`restore`), runs
on a local file (`localfile`), the live status of patches (`status`).

May import: `opspatch.hosts`, `opspatch.ledger`, `opspatch.config`, `opspatch.core` and
`opspatch.errors`. Never the CLI: every run returns a report value, and printing it is the CLI's.
"""
