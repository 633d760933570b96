"""Host-side CPU of one host's patch phase, as `apply` runs it: begin (lock, then inspect) and the
swap that gives the lock back (no restart: the swap is the host's last step), repeated.

Runs the real agent through the local transport (each exec one `python -c BOOTSTRAP` process,
as on a host) and reads the CPU its processes used from `getrusage(RUSAGE_CHILDREN)`, so the
figure is what a host pays, not the controller (sshd's share is not in it). Also prints the
interpreter's own start (`python -c pass`), the floor of every exec. Usage:

    PYTHONPATH=$PWD python bench/agent_cost.py [rounds]

Prints the median and the best CPU-seconds per round (user + system of the children). The
machine is shared, so repeat it and read the best figure.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from opspatch.core.host import EngineSettings, Host
from opspatch.core.source import sha256_hex
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.local import LocalTransport


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(ops: HostOperations, target: Path, round_number: int) -> float:
    """CPU-seconds the host's agent processes used for one begin + swap (lock given back)."""
    run_id = f"bench-{round_number}"
    before = _children_cpu()
    _, inspection = ops.begin(path=str(target), run_id=run_id, timeout=60)
    new = inspection.file.content + f"# round {round_number}\n".encode()
    ops.swap(
        str(target),
        expected_sha256=sha256_hex(inspection.file.content),
        new_content=new,
        lock_run_id=run_id,
        release_lock=True,
        timeout=60,
    )
    return _children_cpu() - before


def interpreter_floor(rounds: int) -> float:
    """The best CPU-seconds of `python -c pass` with this interpreter (its site imports)."""
    figures = []
    for _ in range(rounds):
        before = _children_cpu()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        figures.append(_children_cpu() - before)
    return min(figures)


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "worker.py"
        target.write_text("A = 1\n" * 200)
        host = Host.local(
            "bench",
            str(Path(folder) / "state"),
            EngineSettings(python=sys.executable),
            inventory="bench",
        )
        with LocalTransport("bench") as transport:
            ops = HostOperations(transport, host)
            figures = [one_round(ops, target, n) for n in range(rounds)]
            execs = transport.exec_count / rounds
    floor = interpreter_floor(rounds)
    print(
        f"host CPU per patch phase (begin + swap, {execs:g} execs) over {rounds} rounds: "
        f"median {statistics.median(figures) * 1000:.0f} ms, best {min(figures) * 1000:.0f} ms; "
        f"interpreter start (python -c pass) {floor * 1000:.0f} ms per exec"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
