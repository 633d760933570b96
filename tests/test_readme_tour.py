"""The README's tour runs as written: every command of its sandbox block, in order, on a fresh
state directory, with the exit code the README says (exit 1 where its comment says so, else 0);
as the README says it runs behind a router too (`sandbox up --router`), where its rollback
leaves sandbox-01 out of rotation and the apply after it brings the host back; and on real SGLang
0.5.23 (`sandbox up --engine sglang`), where the hosts run the incident's build (the sandbox's
base, in the ledger), the first decode crashes with the real AttributeError, `diagnose` names
the cause from the real log and source, and `eagle-init-guard` makes every server decode through
EAGLE-3 (the decodes' texts are the real model's, not the stand-in's the README shows)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory.load import load_inventory
from opspatch.sandbox.incident import INCIDENT_BUILD
from opspatch.sandbox.real.build import ENGINE_CACHE_ENV
from tests.realkit import real_engine  # its cache resolved at import, before HOME is isolated

pytestmark = [pytest.mark.pure, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
GRAPHS_FAILED = "CUDA graph capture failed: torch.cuda.Stream requires CUDA support"
ERROR = "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"


def tour_commands() -> list[str]:
    """The lines of the first code block under the README's tour heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A tour on the sandbox", 1)[1]
    block = section.split("```", 2)[1]
    return [line for line in block.splitlines() if line.strip()]


def readme_smoke_lines() -> list[str]:
    """The decodes the README shows a passing `smoke` print (the block after `and the smoke`)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("and the `smoke` after it", 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if " -> " in line]


def test_the_tour_block_is_found_and_names_its_failing_steps() -> None:
    commands = tour_commands()
    assert commands[0].startswith("export OPSPATCH_STATE_DIR=")
    assert any("exit 1" in line for line in commands)
    assert commands[-1].startswith("opspatch sandbox down")
    assert len(readme_smoke_lines()) == 2


def test_the_tour_puts_the_fix_back_after_its_rollback_and_says_it_runs_behind_a_router() -> None:
    commands = tour_commands()
    rollback = next(i for i, line in enumerate(commands) if line.startswith("opspatch rollback"))
    assert commands[rollback + 1].startswith("opspatch apply eagle-init-guard --hosts sandbox")
    assert "`opspatch sandbox up --router` runs the same tour" in (ROOT / "README.md").read_text()


def rotations(env: dict[str, str], cwd: Path) -> dict[str, tuple[str, str | None]]:
    """`status --json` of the tour's patch: each host's state and rotation."""
    done = subprocess.run(
        [sys.executable, "-m", "opspatch.cli", "status", "--hosts", "sandbox"]
        + ["--patch", "eagle-init-guard", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["status"]
    return {row["host"]: (row["state"], row.get("rotation")) for row in rows}


@pytest.mark.parametrize(
    "variant",
    [
        "plain",
        pytest.param("behind-a-router", marks=pytest.mark.router),
        # three real servers started, restarted four times and crashed four times
        pytest.param("sglang", marks=[pytest.mark.sglang, pytest.mark.timeout(3600)]),
    ],
)
def test_the_readme_tour_runs_as_written(tmp_path: Path, variant: str) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    if variant == "sglang":
        engine = real_engine()  # built where not cached; skips when the index cannot be reached
        env[ENGINE_CACHE_ENV] = str(engine.cache)
    try:
        _run_the_tour(tmp_path, variant, env)
    finally:  # a step that failed before the tour's own `sandbox down` must not leave servers
        subprocess.run(
            [sys.executable, "-m", "opspatch.cli", "sandbox", "down"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=600,
        )


def _run_the_tour(tmp_path: Path, variant: str, env: dict[str, str]) -> None:
    router, real = variant == "behind-a-router", variant == "sglang"
    applies = 0
    for line in tour_commands():
        words = shlex.split(line, comments=True)
        comment = line.partition(" #")[2]
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value.replace("$PWD", str(tmp_path))
            continue
        assert words[0] == "opspatch", line
        if router and words[1:3] == ["sandbox", "up"]:
            words.append("--router")  # as the README says under the tour
        if real and words[1:3] == ["sandbox", "up"]:
            words += ["--engine", "sglang"]  # as the README says under the tour
        expected = 1 if "exit 1" in comment else 0
        done = subprocess.run(
            [sys.executable, "-m", "opspatch.cli", *words[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800 if real else 600,  # a real restart of three hosts, one by one
        )
        said = done.stdout + done.stderr
        assert done.returncode == expected, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if real and words[1:3] == ["sandbox", "up"]:
            assert_healthy_incident_servers_never_decoded(env, tmp_path)
        if real and words[1] == "diagnose":
            assert_diagnose_names_the_cause_from_the_real_log_and_source(env, tmp_path)
        if words[1] == "smoke" and expected == 1:  # a crashed host: one short line each
            crashed = [ln for ln in done.stdout.splitlines() if ln.startswith("sandbox-0")]
            assert len(crashed) == 3, done.stdout
            for host_said in crashed:
                assert ERROR in host_said and len(host_said) <= 200, host_said
                assert "/site-packages/" not in host_said, host_said  # the path cut to its name
        if words[1] == "diagnose":  # the cause, from the host's own log and source
            assert ERROR in said and "eagle-init-guard" in said, said
            assert "stopped between line" in said, said
        if words[1] == "smoke" and expected == 0 and not real:  # the decodes the README shows
            for shown in readme_smoke_lines():
                assert shown in done.stdout, done.stdout
        if words[1] == "smoke" and expected == 0 and real:  # the real model's, through EAGLE-3
            assert all(f"sandbox-0{n}: ok" in done.stdout for n in (1, 2, 3)), done.stdout
            verified = [int(n) for n in re.findall(r"\(spec_verify_ct (\d+)\)", done.stdout)]
            assert len(verified) >= 3 and min(verified) > 0, done.stdout
        if words[1] == "apply":  # the lines the README shows of it
            applies += 1
            assert ": eagle-init-guard on 3 host(s), playbook default" in said, said
            assert "sandbox-01: smoke ok" in said and "outcome: ok (exit 0)" in said, said
        if real and words[1] == "apply":  # the fix holds on a half-built worker: restarted,
            # the build's graph set-up failed again, and the smoke decoded
            since = host_log(env, "sandbox-01").rsplit("server_args=", 1)[1]
            assert GRAPHS_FAILED in since and ERROR not in since
        if words[1] == "rollback":  # the pre-image crashes again: the canary halts the run
            assert "restored-not-serving" in said, said
        if router and words[1] == "rollback":  # the canary drained, its server crashed
            found = rotations(env, tmp_path)
            assert found["sandbox-01"] == ("not-applied", "out-of-rotation"), found
        if router and words[1] == "apply" and applies == 2:  # the way back: every host serves
            found = rotations(env, tmp_path)
            assert set(found.values()) == {("applied", "in-rotation")}, found
            assert len(found) == 3, found
    assert applies == 2


def opspatch_json(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "opspatch.cli", *args, "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def host_log(env: dict[str, str], host: str) -> str:
    log = Path(env["OPSPATCH_STATE_DIR"]) / "sandbox" / "hosts" / host / "server.log"
    return log.read_text(errors="replace")


def assert_healthy_incident_servers_never_decoded(env: dict[str, str], cwd: Path) -> None:
    """Every host's sglang was made the incident's build by `opspatch apply` of the sandbox's
    base patch (a run a host, in the ledger) before its engine first started; each server
    answers `/health` 200, its CUDA graph set-up failed, and nothing has decoded yet."""
    code, listed = opspatch_json(env, cwd, "ledger", "list")
    assert code == 0, listed
    runs = [r for r in listed["runs"] if r["patch_id"] == INCIDENT_BUILD]
    assert {(r["command"], r["outcome"]) for r in runs} == {("apply", "ok")}, runs
    assert sorted(h for r in runs for h in r["hosts"]) == ["sandbox-01", "sandbox-02", "sandbox-03"]
    inventory = load_inventory(Path(env["OPSPATCH_STATE_DIR"]) / "inventories" / "sandbox.toml")
    for host in inventory.hosts:
        with urllib.request.urlopen(f"{host.engine.url}/health", timeout=60) as reply:  # noqa: S310
            assert reply.status == 200, host.name
        log = host_log(env, host.name)
        assert GRAPHS_FAILED in log and '"POST /generate' not in log, host.name


def assert_diagnose_names_the_cause_from_the_real_log_and_source(
    env: dict[str, str], cwd: Path
) -> None:
    """sandbox-01 crashed with exactly the incident's exception, where the decode path reads the
    threshold; `diagnose` names where `__init__` stopped and the fix, from the real log and the
    host's source (the incident's build, patched by opspatch)."""
    log = host_log(env, "sandbox-01")
    assert f"\n{ERROR}\n" in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "Dynamic speculation disable: threshold=" not in log
    code, diagnosed = opspatch_json(env, cwd, "diagnose", "--hosts", "sandbox-01")
    assert code == 1, diagnosed
    (report_host,) = diagnosed["hosts"]
    reports = [e for e in report_host["exceptions"] if f"{e['type']}: {e['message']}" == ERROR]
    assert reports, report_host["exceptions"]
    report = reports[0]
    assert report["context"] == "Scheduler hit an exception"
    assert report["frame"].endswith("in should_disable_speculation")
    assert [f["patch"] for f in report["fixed_by"]] == ["eagle-init-guard"]
    cause = report["missing_attribute"]["likely_cause"]
    assert cause.startswith("EAGLEWorkerV2.__init__ stopped between line ")
    assert "`self.init_plain_decode_cuda_graphs()`" in cause
    assert "was swallowed by a caller and the half-built object was used" in cause
    files = {m["module"]: m for m in report_host["files"]}
    assert files["sglang.srt.speculative.eagle_worker_v2"]["state"] == "patched-by-opspatch"
    assert files["sglang.srt.speculative.eagle_worker_v2"]["patch"] == INCIDENT_BUILD
