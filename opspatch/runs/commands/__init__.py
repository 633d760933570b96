"""The commands: one module per command that reads or changes hosts, named after it.

Each is a strategy of the one fleet run (`opspatch.runs.fleet`) or a read over hosts, and returns
a report value for the CLI to print: `apply`, `restart`, `rollback`, `recover` (and unlock),
`status`, `sync` (`plan --fleet`, `sync`, `drift`), `smoke`, `adopt`, `bake`, `diagnose`,
`ledger_report`, `check_releases` (with its cache, `releasecache`), and `local_files` (apply and
rollback on this machine's files: `--file`, `--root`).

May import `opspatch.runs.fleet`, `opspatch.runs.judgments` and the layers below `opspatch.runs`.
"""
