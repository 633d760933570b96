"""The run engine: how any command runs over hosts, written once.

Lives here: one fleet run (`fleetrun`: sessions, preflight, leases, execute, report, Ctrl-C), one
host within it (`session`), the node group every run targets, a host by itself a group of one,
and its steps (`group`: restart, ready, prove, undo; a host's own steps in `steps`), the
change-prove-undo template of an apply (`pipeline`, `liveapply`), the executor (`executor`: batches,
in-flight limit, halt policy), where records go (`recorder`, `recorded`), drain and admit behind a
router (`rotation`), the run's leases on its hosts and their heartbeat (`host_leases`), how
transports are opened (`connect`). What a run reports is `opspatch.runs.report`, beside the rooms (every room reads it).

May import the layers below `opspatch.runs` and `opspatch.runs.judgments`; never a command.
"""
