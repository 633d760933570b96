"""The run engine: how any command runs over hosts, written once.

Lives here: one fleet run (`fleetrun`: sessions, preflight, leases, execute, report, Ctrl-C), one
host within it (`session`), the steps commands share (`steps`: restart, ready, smoke, prove,
undo), the per-host change-prove-undo template (`pipeline`), the executor (`executor`: batches,
in-flight limit, halt policy), where records go (`recorder`, `recorded`), drain and admit behind a
router (`rotation`), the run's leases on its hosts and their heartbeat (`host_leases`), how
transports are opened (`connect`). What a run reports is `opspatch.runs.report`, beside the rooms (every room reads it).

May import the layers below `opspatch.runs` and `opspatch.runs.judgments`; never a command.
"""
