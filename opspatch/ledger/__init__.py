"""The ledger: the append-only, hash-chained record of every run, step, file version and host
fact (a SQLite file, or a PostgreSQL database a team shares), and the run statuses derived from it.

`store` (the `Ledger` class, put together from its parts: `transactions`, the write transaction
retried through an outage and the chained append; `run_writes`, a run's lifecycle; `queries`, the
reads; `leasing`, the host leases a run holds), `database` (the small interface the SQL runs
over: `sqlite`, the embedded default, and `postgres`, psycopg imported there only), `copy` (one
history into another ledger), `schema` (SQLite's tables, triggers, pragmas), `chain` (canonical
JSON, event hashes, the verify walk), `events` (event rows read back into records, derived run
statuses), `records` (the frozen dataclasses the queries return, serialised by the core's one
JSON mechanism, `opspatch.core.jsonrecord`), `liveness` (the controller process that began a
run, from /proc), `failures` (a full or read-only filesystem, named as such), `lease_store`
(which run holds which host, with its heartbeat: mutable state beside the history), `lineage`
(where a file stands among its recorded versions), `approvals` (the signatures `approve` runs
recorded). Callers import from here: `from opspatch.ledger import Ledger`.

May import: `opspatch.core` and `opspatch.errors`. It knows nothing of hosts or runs beyond the
values it is asked to record.
"""

from opspatch.ledger.liveness import ControllerProcess, operator_identity
from opspatch.ledger.records import (
    FileVersion,
    HostRecord,
    NewFileVersion,
    RunDetail,
    RunSummary,
    StepRecord,
    VerifyReport,
    new_run_id,
)
from opspatch.ledger.store import Ledger

__all__ = [
    "ControllerProcess",
    "FileVersion",
    "HostRecord",
    "Ledger",
    "NewFileVersion",
    "RunDetail",
    "RunSummary",
    "StepRecord",
    "VerifyReport",
    "new_run_id",
    "operator_identity",
]
