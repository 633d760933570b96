"""Effects on one host: the transports (`transport/`: SSH and local), the host agent that runs
on the host (`agent`), the typed operations built on it (`operations`: inspect, swap, restore,
lock), engine control (`engine`: restart, readiness, smoke decode) and a host's incident facts in
one exec (`diagnosis`: what `opspatch diagnose` and `lint-init --hosts` read).

May import: `opspatch.core` (the host and policy models) and `opspatch.errors`. Not config (how
inventories are written), the ledger, runs or the CLI: a host operation takes values and returns
values, and the fleet logic that decides what to do with them lives in `opspatch.runs`.
"""
