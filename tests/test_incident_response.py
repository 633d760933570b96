"""Incident response end to end, on sandbox fleets of real stand-in engines, as an operator runs
it: `diagnose` before and after the fix, a hand edit made with `sed -i` over SSH turned into a
patch by `adopt` (then status and rollback), the editable checkout shape (the commit, the
uncommitted change, a `git diff` hand edit adopted and exported as a mail `git am` applies), the
findings that say a host runs other code than its files (a stale pyc, a second copy of the
package, a server older than its file), a `__getattr__` named as the likelier cause, and the
postmortem timeline of the whole incident.
"""

from __future__ import annotations

import hashlib
import py_compile
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from opspatch.hosts.operations import open_transport
from opspatch.hosts.transport.base import Command
from opspatch.sandbox.sshd import find_sshd
from tests.fleetkit import EAGLE_RELPATH, SandboxFleet, wait_until

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

EAGLE = "sglang.srt.speculative.eagle_worker_v2"
MESSAGE = "'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
HOTFIX_SED = (
    r"s/^        self.speculation_disabled = False$/"
    r"        self.speculation_disabled = False\n        self.spec_disable_batch_threshold = 0/"
)


def line_of(path: Path, text: str) -> int:
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def file_of(host: dict[str, Any], module: str = EAGLE) -> dict[str, Any]:
    return next(f for f in host["files"] if f["module"] == module)


def kinds(host: dict[str, Any]) -> set[str]:
    return {f["kind"] for f in host["findings"]}


def markdown_tables(markdown: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    row: list[str] | None = None
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        if token.type == "table_open":
            tables.append([])
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close" and row is not None:
            tables[-1].append(row)
            row = None
    return tables


def test_the_incident_is_diagnosed_fixed_and_reported(tmp_path: Path) -> None:
    fleet = SandboxFleet(tmp_path, 2).up()
    try:
        names = fleet.names
        eagle = fleet.file(names[0])
        capture_line = line_of(eagle, "        self.init_cuda_graphs()")
        assigned_line = line_of(eagle, "self.spec_disable_batch_threshold = server_args")
        message_line = line_of(eagle, 'logger.info(f"Dynamic speculation disable: threshold=')

        # /health says every server is fine; the real decode proves otherwise.
        run = fleet.opspatch("diagnose", "--hosts", "sandbox", "--decode", "--json")
        assert run.code == 1, run.stderr
        doc = run.json()
        for name, host in by_host(doc).items():
            assert host["status"] == "healthy-but-crashing", host["findings"]
            assert host["server"]["health_status"] == 200 and not host["decode"]["ok"]
            assert file_of(host)["state"] == "pristine"
            (exception,) = host["exceptions"]
            assert (exception["type"], exception["message"], exception["count"]) == (
                "AttributeError", MESSAGE, 1,
            )  # fmt: skip
            assert [f["patch"] for f in exception["fixed_by"]] == ["eagle-init-guard"]
            analysis = exception["missing_attribute"]
            (assignment,) = analysis["assignments"]
            assert assignment["line"] == assigned_line
            assert "self.init_cuda_graphs()" in [s["text"] for s in assignment["risky_before"]]
            (skipping,) = analysis["skipping_subclasses"]
            assert (
                skipping.startswith("StandaloneWorkerV2 (")
                and "skips EAGLEWorkerV2.__init__" in skipping
            )
            progress = analysis["init_progress"]
            assert progress["summary"] == (
                f"EAGLEWorkerV2.__init__ stopped between line {capture_line} and line {message_line}"
            )
            assert "was swallowed by a caller" in analysis["likely_cause"]
            assert all(not c["present"] for c in analysis["checks"])
            assert wait_until(lambda n=name: fleet.pid(n) is None, 20)  # the decode crashed it
        summary = {s["text"]: s["hosts"] for s in doc["summary"]}
        assert summary[f"AttributeError: {MESSAGE}"] == names
        assert (
            summary["healthy but crashing: /health answered 200, but a real decode failed"] == names
        )

        text = fleet.opspatch("diagnose", "--hosts", "sandbox")
        assert text.code == 1
        assert f"== {names[0]}: healthy-but-crashing" in text.stdout
        assert f"stopped between line {capture_line} and line {message_line}" in text.stdout
        assert "fixed by: eagle-init-guard" in text.stdout
        assert f"[problem] AttributeError: {MESSAGE}: {', '.join(names)}" in text.stdout

        # The fix, then every host is patched by opspatch and clean.
        applied = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json"
        )
        assert applied.code == 0, applied.stdout + applied.stderr
        run_id = applied.json()["run_id"]
        after = fleet.opspatch("diagnose", "--hosts", "sandbox", "--decode", "--json")
        assert after.code == 0, after.stdout
        for host in after.json()["hosts"]:
            assert host["status"] == "clean", host["findings"]
            eagle_file = file_of(host)
            assert (eagle_file["state"], eagle_file["patch"], eagle_file["run_id"]) == (
                "patched-by-opspatch", "eagle-init-guard", run_id,
            )  # fmt: skip
            assert host["decode"]["ok"] and host["exceptions"] == []
        assert after.json()["status"] == {n: "clean" for n in names}

        # The postmortem: every step of the fix, per host, as a table.
        report = fleet.opspatch("ledger", "report", run_id)
        assert report.code == 0, report.stderr
        tables = markdown_tables(report.stdout)
        steps = next(t for t in tables if t[0][:3] == ["time (UTC)", "host", "step"])
        for host in applied.json()["hosts"]:  # every step the apply reported, per host
            expected = [step["step"] for step in host["steps"]]
            reported = [row[2] for row in steps[1:] if row[1] == host["host"]]
            # and the run's lease on the host: taken after the preflight, given back at the end
            assert [s for s in reported if s != "lease"] == expected
            assert reported.count("lease") == 2, reported
            assert reported[-1] == "lease" and reported.index("lease") == expected.index("plan") + 1
            assert {"backup", "swap", "restart", "ready", "smoke"} <= set(expected)
        changes = next(t for t in tables if "sha256 before" in t[0])
        assert sorted(row[1] for row in changes[1:]) == names
        assert "+        self.spec_disable_batch_threshold = 0" in report.stdout
        whole = fleet.opspatch("ledger", "report", "--since", "1h", "--json")
        assert [r["command"] for r in whole.json()["runs"]] == ["apply"]
    finally:
        fleet.close()


def test_a_host_running_other_code_than_its_files_and_a_getattr_in_a_base(tmp_path: Path) -> None:
    fleet = SandboxFleet(tmp_path, 1).up()
    try:
        (name,) = fleet.names
        site = fleet.file(name).parents[3]  # .../site-packages
        # A __getattr__ in the base class (raising the same AttributeError), in the build the
        # engine runs: restarted with it, then crashed by a decode.
        base = site / "sglang/srt/speculative/base_spec_worker.py"
        base.write_text(
            base.read_text().replace(
                "    @property\n    def target_worker",
                "    def __getattr__(self, name):\n"
                "        raise AttributeError(f\"'{type(self).__name__}' object has no attribute '{name}'\")\n\n"
                "    @property\n    def target_worker",
                1,
            )
        )
        assert fleet.opspatch("sandbox", "down").code == 0
        assert fleet.opspatch("sandbox", "up").code == 0
        assert fleet.generate(name) is None
        # Another copy of the package behind a .pth (shadowed), a pyc of other source that
        # Python would run without looking, and a file changed after the server started.
        other = fleet.host_dir(name) / "old-copy"
        shutil.copytree(site / "sglang", other / "sglang")
        (site / "zz-old-copy.pth").write_text(f"{other}\n")
        scheduler = site / "sglang/srt/managers/scheduler.py"
        pyc = py_compile.compile(
            str(scheduler), doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )  # fmt: skip
        assert Path(pyc).exists()
        assert fleet.opspatch("sandbox", "up").code == 0  # the crashed engine runs again
        started = time.time()
        time.sleep(3)  # past the start time's resolution: the edit is later than the start
        scheduler.write_text(scheduler.read_text() + "# tuned by hand\n")
        assert scheduler.stat().st_mtime > started + 2

        run = fleet.opspatch(
            "diagnose", "--hosts", "sandbox", "--module", "sglang.srt.managers.scheduler", "--json"
        )
        assert run.code == 1, run.stderr
        host = by_host(run.json())[name]
        found = kinds(host)
        assert {"other-copies", "stale-bytecode", "server-runs-old-code", "edited-outside"} <= found
        copies = file_of(host, "sglang.srt.managers.scheduler")["copies"]
        assert {c["path"] for c in copies if c["exists"]} >= {
            str(site / "sglang"),
            str(other / "sglang"),
        }
        stale = file_of(host, "sglang.srt.managers.scheduler")["stale_bytecode"]
        assert [b["path"] for b in stale] == [pyc]
        # The crash logged before this start (the restart's log window) is gone; the one
        # before it is read with --since, and the base's __getattr__ is the likelier cause.
        earlier = fleet.opspatch("diagnose", "--hosts", "sandbox", "--since", "1h", "--json")
        (exception,) = [
            e for e in by_host(earlier.json())[name]["exceptions"] if e["missing_attribute"]
        ]
        cause = exception["missing_attribute"]["likely_cause"]
        assert cause.startswith("likelier cause: __getattr__ is defined in BaseSpecWorker"), cause
    finally:
        fleet.close()


def test_a_sed_edit_over_ssh_is_found_adopted_and_rolled_back(tmp_path: Path) -> None:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    fleet = SandboxFleet(tmp_path, 2, ssh=True).up()
    try:
        name, reference = fleet.names  # the other host keeps the release's RECORD-verified file
        target = fleet.file(name)
        pristine = target.read_bytes()
        host = fleet.hosts[name]
        transport = open_transport(host)
        try:
            done = transport.run(Command(("sed", "-i", HOTFIX_SED, str(target))), timeout=60)
        finally:
            transport.close()
        assert done.exit_code == 0, done.stderr
        assert target.read_bytes() != pristine

        run = fleet.opspatch("diagnose", "--hosts", fleet.inventory, "--json")
        host_doc = by_host(run.json())[name]
        eagle = file_of(host_doc)
        assert eagle["state"] == "edited-outside", eagle
        assert "+        self.spec_disable_batch_threshold = 0\n" in eagle["diff"]
        assert "edited-outside" in kinds(host_doc)

        assert file_of(by_host(run.json())[reference])["state"] == "pristine"
        edited_host = f"{fleet.inventory}:{name}"
        adopted = fleet.opspatch(
            "adopt", "--hosts", edited_host, "--module", EAGLE, "--id", "hand-threshold", "--yes",
            "--json",
        )  # fmt: skip
        assert adopted.code == 0, adopted.stdout + adopted.stderr
        assert [(h["host"], h["outcome"]) for h in adopted.json()["hosts"]] == [(name, "staged")]
        assert adopted.json()["pristine_from"] == f"the RECORD-verified copy on {reference}"
        patch_file = fleet.workspace / "patches" / "hand-threshold.toml"
        assert 'kind = "diff"' in patch_file.read_text()
        check = fleet.opspatch("check", "hand-threshold")
        assert check.code == 0, check.stdout + check.stderr
        status = fleet.opspatch(
            "status", "--hosts", fleet.inventory, "--patch", "hand-threshold", "--json"
        )
        assert {s["host"]: s["state"] for s in status.json()["status"]} == {
            name: "staged", reference: "not-applied",  # its server still runs the earlier code
        }  # fmt: skip
        restarted = fleet.opspatch("restart", "--hosts", edited_host, "--yes", "--json")
        assert restarted.code == 0, restarted.stdout + restarted.stderr
        status = fleet.opspatch(
            "status", "--hosts", edited_host, "--patch", "hand-threshold", "--json"
        )
        assert [s["state"] for s in status.json()["status"]] == ["applied"]
        again = fleet.opspatch("diagnose", "--hosts", fleet.inventory, "--json")
        assert file_of(by_host(again.json())[name])["patch"] == "hand-threshold"

        back = fleet.opspatch(
            "rollback", "hand-threshold", "--hosts", edited_host, "--yes", "--json"
        )
        # the pristine file is the incident's code: the restore's smoke decode crashes it
        assert back.code == 1, back.stdout + back.stderr
        assert [h["outcome"] for h in back.json()["hosts"]] == ["restored-not-serving"]
        assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(pristine).digest()
    finally:
        fleet.close()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_an_editable_checkout_names_its_commit_and_adopts_a_git_diff(tmp_path: Path) -> None:
    fleet = SandboxFleet(tmp_path, 1, install="editable").up()
    try:
        (name,) = fleet.names
        checkout = fleet.checkout(name)
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # The local feature the incident's fleet ran under the fix, uncommitted, and a hand edit.
        feature = checkout / "python/sglang/srt/managers/tp_worker.py"
        feature.write_text(feature.read_text() + "# local feature: dynamic speculation disable\n")
        subprocess.run(["sed", "-i", HOTFIX_SED, str(fleet.file(name))], check=True)

        run = fleet.opspatch("diagnose", "--hosts", "sandbox", "--json")
        host = by_host(run.json())[name]
        eagle = file_of(host)
        assert (eagle["state"], eagle["install"]) == ("edited-outside", "editable")
        assert (
            eagle["checkout"]["head"] == head and eagle["diff_against"] == f"git HEAD {head[:12]}"
        )
        assert eagle["diff"].startswith(
            f"diff --git a/python/{EAGLE_RELPATH} b/python/{EAGLE_RELPATH}"
        )
        assert sorted(eagle["checkout"]["uncommitted"]) == [
            " M python/sglang/srt/managers/tp_worker.py", f" M python/{EAGLE_RELPATH}",
        ]  # fmt: skip
        text = fleet.opspatch("diagnose", "--hosts", "sandbox")
        assert f"checkout {checkout} at {head[:12]} (main)" in text.stdout
        assert "M python/sglang/srt/managers/tp_worker.py" in text.stdout

        adopted = fleet.opspatch(
            "adopt", "--hosts", "sandbox", "-m", EAGLE, "--id", "hand-edit", "--yes"
        )
        assert adopted.code == 0, adopted.stdout + adopted.stderr
        assert f"pristine from git HEAD {head[:12]}" in adopted.stdout
        pristine = tmp_path / "pristine.py"
        pristine.write_bytes(
            subprocess.run(
                ["git", "-C", str(checkout), "show", f"HEAD:python/{EAGLE_RELPATH}"],
                capture_output=True, check=True,
            ).stdout
        )  # fmt: skip
        mail = fleet.opspatch(
            "export", "hand-edit", "--file", str(pristine), "--format", "git", "--prefix", "python/"
        )
        assert mail.code == 0, mail.stderr
        clone = tmp_path / "clone"
        subprocess.run(["git", "clone", "-q", str(checkout), str(clone)], check=True)
        (tmp_path / "mail.patch").write_text(mail.stdout)
        am = subprocess.run(
            ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t", "am",
             str(tmp_path / "mail.patch")], capture_output=True, text=True,
        )  # fmt: skip
        assert am.returncode == 0, am.stdout + am.stderr
        assert (clone / "python" / EAGLE_RELPATH).read_bytes() == fleet.file(name).read_bytes()
    finally:
        fleet.close()
