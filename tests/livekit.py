"""The live path's fast helpers: a scripted live engine behind the `live` operation of the
scripted hosts (`LiveEngine` for a host's ranks, `UnitEngine` for a unit's), a scripted site for
`live enable`, and the in-process plugin's `take` on modules made from source."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opspatch.core.host import Host
from opspatch.core.policy import BatchSize, Playbook
from opspatch.hosts.liveplugin import fixes
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet.liveapply import live_former
from opspatch.runs.report import RunReport
from tests.scriptedkit import FakeHost, Fleet, Units, finding_its_server

former = live_former  # the real live form of the patch's change


def checked(
    fix: dict[str, Any],
    *,
    loaded: bool,
    held: dict[str, list[str]] | None = None,
    found: dict[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """A process's answer to the preflight's `check` of `fix`'s takes, as the plugin gives it:
    the module `loaded` or not, the definitions other fixes hold (`held`: fix -> names), and
    what the test makes it find (`found`: captured, objects, frames)."""
    answers = []
    for take in fix["fixes"]:
        entry: dict[str, Any] = {"fix_id": take["fix_id"], "module": take["module"]}
        entry["loaded"] = loaded
        if loaded:
            names = {d["name"] for d in take["definitions"]}
            entry["held"] = [
                {"name": n, "fix_id": other}
                for other, held_names in (held or {}).items()
                if other != take["fix_id"]
                for n in held_names
                if n in names
            ]
            entry.update({"captured": [], "objects": [], "frames": [], **(found or {})})
        answers.append(entry)
    return answers


@dataclass
class LiveEngine:
    """The engine's processes as their sockets answer: what each scheduler rank holds, a rank
    told to refuse a take, and what every rank's `check` finds (`found`)."""

    held: dict[int, dict[str, list[str]]] = field(default_factory=lambda: {0: {}, 1: {}})
    refusing_rank: int | None = None
    listening: bool = True
    asked: list[str] = field(default_factory=list)
    found: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    loaded: bool = True
    """Whether the ranks imported the module (main and the detokenizer never do)."""

    def answer(self, args: dict[str, Any]) -> dict[str, Any]:
        fix = args["fix"]
        self.asked.append(fix["op"])
        if not self.listening:
            return {"server_pid": 4242, "folder": None, "missing": "nobody listens", "answers": []}
        answers = [self._direct("main", 100, fix), self._direct("detokenizer", 101, fix)]
        if fix["op"] in ("list", "check"):
            answers += [self._socket(rank, self._rank(rank, fix)) for rank in (0, 1)]
        else:
            ranks = [self._rank(rank, fix) for rank in (0, 1)]
            entry = {**ranks[0], "ok": all(r["ok"] for r in ranks), "ranks": ranks}
            answers.append(self._socket(0, entry))
        return {"server_pid": 4242, "folder": "/tmp/x/4242", "missing": None, "answers": answers}

    @staticmethod
    def _socket(rank: int, reply: dict[str, Any]) -> dict[str, Any]:
        return {"socket": f"scheduler-tp{rank}.sock", "reply": reply, "error": None}

    @staticmethod
    def _direct(role: str, pid: int, fix: dict[str, Any]) -> dict[str, Any]:
        process = {"role": role, "rank": None, "pid": pid}
        if fix["op"] == "take":
            reply = {
                "ok": False,
                "took": [],
                "refused": {"code": "module-not-loaded", "message": "not imported here"},
            }
        elif fix["op"] == "check":
            reply = {"ok": True, "took": [], "checks": checked(fix, loaded=False)}
        else:
            reply = {"ok": True, "took": []}
        return {"socket": f"{role}.sock", "reply": {**reply, "process": process}, "error": None}

    def _rank(self, rank: int, fix: dict[str, Any]) -> dict[str, Any]:
        process = {"role": "scheduler", "rank": rank, "pid": 200 + rank}
        held = self.held[rank]
        if fix["op"] == "check":
            answer = checked(fix, loaded=self.loaded, held=held, found=self.found)
            return {"ok": True, "took": [], "checks": answer, "process": process}
        if fix["op"] == "take":
            if rank == self.refusing_rank:
                refused = {"code": "take-failed", "message": "AttributeError: boom"}
                return {"ok": False, "took": [], "refused": refused, "process": process}
            names = [d["name"] for d in fix["definitions"]]
            held[fix["fix_id"]] = names
            took = [{"fix_id": fix["fix_id"], "name": n} for n in names]
            return {"ok": True, "took": took, "process": process}
        if fix["op"] == "revert":
            held.pop(fix["fix_id"], None)
        took = [{"fix_id": f, "name": n} for f, names in held.items() for n in names]
        return {"ok": True, "took": took, "process": process}


def serving(fake: FakeHost, engine: LiveEngine) -> None:
    """`fake`'s `live` answered by `engine`, and its inspections by path finding its running
    server too (`finding_its_server`)."""
    fake.fault = finding_its_server(
        fake, lambda op, args: engine.answer(args) if op == "live" else None
    )


def live_host(fake: FakeHost, *, live: bool = True) -> Host:
    return replace(fake.host(), live=live)


def apply_live(fleet: Fleet, engine: LiveEngine, chosen: Any = former, **kw: Any) -> RunReport:
    for fake in fleet.hosts:
        fake.fault = lambda op, args: engine.answer(args) if op == "live" else None
    return apply_to_hosts(
        fleet.patch,
        [live_host(h, **kw) for h in fleet.hosts],
        Playbook(canary=0, batch=BatchSize(count=10), max_failures=1),
        factory=fleet.factory,
        ledger=fleet.ledger,
        live=chosen,
    )


def steps(report: RunReport) -> list[str]:
    (outcome,) = report.hosts
    return [str(s.step) for s in outcome.steps]


NODE_RANKS = {"h1": (0, 1), "h2": (2, 3)}


@dataclass
class UnitEngine:
    """The unit's processes as their sockets answer: what each rank holds (by fix), each
    node's copy of the file (a rank takes only its own), and the faults a test sets."""

    paths: dict[str, str]
    held: dict[int, dict[str, list[dict[str, Any]]]] = field(
        default_factory=lambda: {rank: {} for rank in range(4)}
    )
    refusing_rank: int | None = None
    refusing_revert: int | None = None
    forgetting_rank: int | None = None
    """A rank that answers its take ok but whose `list` then shows nothing (a fix lost)."""
    keeping_rank: int | None = None
    """A rank that answers its revert ok but whose `list` still shows the fix (a claimed revert)."""
    deaf: set[str] = field(default_factory=set)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def answer(self, node: str, args: dict[str, Any]) -> dict[str, Any]:
        fix = args["fix"]
        self.asked.append((node, fix["op"]))
        if node in self.deaf:
            return {"server_pid": 7, "folder": None, "missing": "nobody listens", "answers": []}
        answers = [self._direct(node, "main", fix)]
        if node == "h1":
            answers.append(self._direct(node, "detokenizer", fix))
        if fix["op"] in ("list", "check"):
            answers += [self._socket(r, self._rank(r, fix)) for r in NODE_RANKS[node]]
        elif node == "h1":  # the entry rank answers for every rank of every node
            ranks = [self._rank(r, fix) for r in range(4)]
            entry = {**ranks[0], "ok": all(r["ok"] for r in ranks), "ranks": ranks}
            answers.append(self._socket(0, entry))
        return {"server_pid": 7, "folder": "/tmp/x/7", "missing": None, "answers": answers}

    @staticmethod
    def _socket(rank: int, reply: dict[str, Any]) -> dict[str, Any]:
        return {"socket": f"scheduler-tp{rank}.sock", "reply": reply, "error": None}

    @staticmethod
    def _direct(node: str, role: str, fix: dict[str, Any]) -> dict[str, Any]:
        process = {"role": role, "rank": None, "pid": 100 if node == "h1" else 110}
        reply: dict[str, Any] = {"ok": True, "took": []}
        if fix["op"] == "check":
            reply["checks"] = checked(fix, loaded=False)
        if fix["op"] == "take":
            refused = {"code": "module-not-loaded", "message": "not imported here"}
            reply = {"ok": False, "took": [], "refused": refused}
        return {"socket": f"{role}.sock", "reply": {**reply, "process": process}, "error": None}

    def _rank(self, rank: int, fix: dict[str, Any]) -> dict[str, Any]:
        process = {"role": "scheduler", "rank": rank, "pid": 200 + rank}
        held = self.held[rank]
        node = next(n for n, ranks in NODE_RANKS.items() if rank in ranks)
        if fix["op"] == "check":
            mine = {f: [e["name"] for e in entries] for f, entries in held.items()}
            answer = checked(fix, loaded=True, held=mine)
            return {"ok": True, "took": [], "checks": answer, "process": process}
        if fix["op"] == "take":
            refused = None
            if rank == self.refusing_rank:
                refused = {"code": "take-failed", "message": "AttributeError: boom"}
            elif self.paths[node] not in (fix["path"], *fix.get("paths", ())):
                refused = {"code": "path-mismatch", "message": "loaded from another file"}
            if refused is not None:
                return {"ok": False, "took": [], "refused": refused, "process": process}
            entries = [
                {"fix_id": fix["fix_id"], "sha256": fix["sha256"], "name": d["name"],
                 "kind": d["kind"], "code_sha256": f"code-{rank}"}
                for d in fix["definitions"]
            ]  # fmt: skip
            held[fix["fix_id"]] = [] if rank == self.forgetting_rank else entries
            return {"ok": True, "took": entries, "process": process}
        if fix["op"] == "revert":
            if rank == self.refusing_revert:
                refused = {"code": "changed-since", "message": "changed since"}
                return {"ok": False, "took": [], "refused": refused, "process": process}
            if rank == self.keeping_rank:  # says it holds nothing; its `list` says otherwise
                return {"ok": True, "took": [], "process": process}
            held.pop(fix["fix_id"], None)
        took = [entry for entries in held.values() for entry in entries]
        return {"ok": True, "took": took, "process": process}

    def holding(self) -> dict[int, set[str]]:
        return {rank: {f for f, e in fixes.items() if e} for rank, fixes in self.held.items()}


def live_unit(units: Units, **faults: Any) -> UnitEngine:
    engine = UnitEngine({n: str(units.fakes[n].file) for n in ("h1", "h2")}, **faults)
    for name in ("h1", "h2"):
        units.fakes[name].fault = lambda op, args, node=name: (
            engine.answer(node, args) if op == "live" else None
        )
    return engine


PLAYBOOK = Playbook(canary=0, batch=BatchSize(count=10), max_failures=1)


def site_of(fleet: Fleet) -> Path:
    return fleet.hosts[0].root / "engine-site"


def scripted_site(
    fleet: Fleet, *, framework: bool = True, filtered: str | None = None
) -> list[str]:
    """Every host's `live_site` answers its own temporary site-packages; returns the ops asked."""
    asked: list[str] = []
    for fake in fleet.hosts:
        site = fake.root / "engine-site"
        site.mkdir(exist_ok=True)
        (site / "other_package.py").write_text("x = 1\n")  # not ours: never touched

        def answer(op: str, args: dict[str, Any], site: Path = site) -> dict[str, Any] | None:
            asked.append(op)
            if op != "live_site":
                return None
            installed = [
                {"dist_info": d.name, "record": (d / "RECORD").read_text()}
                for d in sorted(site.glob("opspatch_live-*.dist-info"))
            ]
            return {
                "purelib": str(site),
                "sglang_dir": str(site / "sglang"),
                "plugin_framework": framework,
                "installed": installed,
                "filtered": filtered,
            }

        fake.fault = answer
    return asked


def run(fleet: Fleet, command: Any, *, live: bool = True) -> RunReport:
    hosts = [replace(h.host(), live=live) for h in fleet.hosts]
    return command(ledger=fleet.ledger, hosts=hosts, factory=fleet.factory, playbook=PLAYBOOK)


def files_under(site: Path) -> set[str]:
    return {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}


@pytest.fixture
def module_from(tmp_path: Path) -> Iterator[Callable[[str, str], ModuleType]]:
    """Import source as a fresh module under a unique name; removed from sys.modules after."""
    made: list[str] = []

    def make(name: str, source: str) -> ModuleType:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        made.append(name)
        spec.loader.exec_module(module)
        return module

    yield make
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def nothing_held() -> Iterator[None]:
    yield
    for fix_id in [entry["fix_id"] for entry in fixes.list()["took"]]:
        fixes.revert(fix_id)


def post_image(where: ModuleType | Path, source: str) -> tuple[str, str]:
    """Write `source` over the module's own file (as a run swaps the post-image in), or at a
    path; the path and its sha256."""
    path = Path(str(where.__file__)) if isinstance(where, ModuleType) else where
    path.write_text(textwrap.dedent(source))
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def take(
    module: str, path: str, sha: str, *definitions: tuple[str, str], fix_id: str = "fix-1"
) -> dict[str, Any]:
    return fixes.take(
        {
            "op": "take",
            "fix_id": fix_id,
            "module": module,
            "path": path,
            "sha256": sha,
            "definitions": [{"name": n, "kind": k} for n, k in definitions],
        }
    )
