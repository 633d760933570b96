"""Host-side CPU of one host's patch phase, as `apply` runs it: begin (lock, then inspect) and the
swap that gives the lock back (no restart: the swap is the host's last step), repeated.

Runs the real agent through the local transport, both ways an inventory may run it (`agent =
"per-exec"`: each request one `python -c BOOTSTRAP` process, as on a host; `"resident"`: one
agent for all the rounds, each request a fork of it), and reads the CPU its processes used from
`getrusage(RUSAGE_CHILDREN)` once the transport closed (a resident agent's forks are reaped by
the agent, so its whole run is counted when it ends), so the figure is what a host pays, not the
controller (sshd's share is not in it). Also prints the interpreter's own start (`python -c
pass`), the floor of every per-exec request. Usage:

    PYTHONPATH=$PWD python bench/agent_cost.py [rounds]

Prints, per way, the host CPU per round (the mean over the rounds: a resident agent's rounds
cannot be told apart) and the median wall of a round, controller included. The machine is
shared, so repeat it and read the best figure.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from opspatch.core.host import AgentMode, EngineSettings, Host
from opspatch.core.source import sha256_hex
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.local import LocalTransport


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(ops: HostOperations, target: Path, round_number: int) -> float:
    """Wall seconds of one begin + swap (lock given back)."""
    run_id = f"bench-{round_number}"
    started = time.perf_counter()
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
    return time.perf_counter() - started


def one_way(host: Host, target: Path, rounds: int) -> tuple[float, float, float]:
    """(host CPU-seconds per round, median wall per round, requests per round) for `host`'s
    way of running the agent, from one transport that is closed (its agent reaped) at the end."""
    before = _children_cpu()
    with LocalTransport("bench") as transport:
        ops = HostOperations(transport, host)
        walls = [one_round(ops, target, n) for n in range(rounds)]
        execs = transport.exec_count / rounds
    return (_children_cpu() - before) / rounds, statistics.median(walls), execs


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
        # a host's interpreter by another path: this very one would answer in this process
        python = Path(folder) / "python"
        python.symlink_to(sys.executable)
        host = Host.local(
            "bench",
            str(Path(folder) / "state"),
            EngineSettings(python=str(python)),
            inventory="bench",
        )
        ways: tuple[AgentMode, ...] = ("per-exec", "resident")
        figures = {way: one_way(replace(host, agent=way), target, rounds) for way in ways}
    floor = interpreter_floor(rounds)
    for way, (cpu, wall, execs) in figures.items():
        print(
            f"{way}: host CPU per patch phase (begin + swap, {execs:g} requests) over {rounds} "
            f"rounds: {cpu * 1000:.0f} ms; wall per round, median {wall * 1000:.0f} ms"
        )
    print(f"interpreter start (python -c pass): {floor * 1000:.0f} ms per per-exec request")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
