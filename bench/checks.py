"""After each measured run: did the tool really do the job? (Checked outside the timing.)

- the target file parses and `EAGLEWorkerV2` has a class-level `spec_disable_batch_threshold`
  (the fix every tool applies; the early assignment in `__init__` is checked too);
- the full pipeline also: the engine was restarted (its pid changed), answers /health, and a
  greedy decode verifies drafts (`spec_verify_ct > 0`): the bug made the first decode crash.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from fleet import BenchHost, Fleet, decode, http_status

FIELD = "spec_disable_batch_threshold"


def _class_default(tree: ast.Module) -> tuple[bool, bool]:
    """(a class-level default exists, `__init__` assigns it before `init_cuda_graphs`)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EAGLEWorkerV2":
            default = any(
                isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and s.target.id == FIELD
                or isinstance(s, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == FIELD for t in s.targets)
                for s in node.body
            )
            init = next(
                (s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"),
                None,
            )
            early = False
            for statement in init.body if init is not None else []:
                calls = {
                    n.func.attr
                    for n in ast.walk(statement)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                }
                if "init_cuda_graphs" in calls:
                    break
                if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == FIELD for t in statement.targets
                ):
                    early = True
                    break
            return default, early
    return False, False


def file_problems(host: BenchHost) -> list[str]:
    try:
        tree = ast.parse(host.target_file.read_bytes())
    except SyntaxError as exc:
        return [f"{host.name}: the file does not parse ({exc})"]
    default, early = _class_default(tree)
    problems = []
    if not default:
        problems.append(f"{host.name}: no class-level {FIELD}")
    if not early:
        problems.append(f"{host.name}: __init__ does not assign {FIELD} early")
    return problems


def engine_problems(fleet: Fleet, host: BenchHost, pid_before: int | None) -> list[str]:
    pid = fleet.engine_pid(host)
    if pid is None:
        return [f"{host.name}: the engine is not running"]
    problems = []
    if pid == pid_before:
        problems.append(f"{host.name}: the engine was not restarted (pid {pid})")
    if http_status(host.url + "/health") != 200:
        return problems + [f"{host.name}: /health does not answer 200"]
    try:
        reply = decode(host.url, "The capital of France is")
    except OSError as exc:
        return problems + [f"{host.name}: decode failed ({exc})"]
    meta = reply.get("meta_info")
    if not isinstance(meta, dict) or not meta.get("spec_verify_ct"):
        problems.append(f"{host.name}: decode without spec_verify_ct ({reply})")
    return problems


def run_problems(
    fleet: Fleet,
    hosts: Sequence[BenchHost],
    phase: str,
    pids_before: Mapping[str, int | None],
) -> list[str]:
    problems: list[str] = []
    for host in hosts:
        problems += file_problems(host)
        if phase == "full":
            problems += engine_problems(fleet, host, pids_before.get(host.name))
    return problems
