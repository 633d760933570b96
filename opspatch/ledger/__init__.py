"""The ledger: the append-only, hash-chained SQLite record of every run, step, file version and
host fact (`store`).

May import: `opspatch.core` and `opspatch.errors`. It knows nothing of hosts or runs beyond the
values it is asked to record, so a second backend (PostgreSQL for a team ledger) plugs in here.
"""
