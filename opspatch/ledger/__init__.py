"""The ledger: the append-only, hash-chained record of every run, step, file version and host
fact (a SQLite file, or a PostgreSQL database a team shares), and the run statuses derived from it.
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
