"""Where an imported module's code comes from, read on the host without changing anything."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import marshal
import os
import re
import shutil
import site
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.fsutil import b64, sha256_hex

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import Result

GIT_TIMEOUT = 20.0
MAX_GIT_DIFF = 200_000
MAX_STATUS_LINES = 200
_PYC_FLAG_HASH = 0b01
_PYC_FLAG_CHECK_SOURCE = 0b10


# ---------------------------------------------------------------------------------------------
# the distribution and the other copies of the package


def distribution_info(top: str) -> Result | None:
    """The installed distribution named like the top-level package: name, version, where its
    metadata lives, and whether it is an editable install (`direct_url.json`)."""
    import json
    from importlib import metadata

    for name in dict.fromkeys((top, top.replace("_", "-"))):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        direct_url: Any = None
        raw = dist.read_text("direct_url.json")
        if raw:
            try:
                direct_url = json.loads(raw)
            except ValueError:
                direct_url = None
        editable = isinstance(direct_url, dict) and bool(
            (direct_url.get("dir_info") or {}).get("editable")
        )
        return {
            "name": dist.metadata["Name"],
            "version": dist.version,
            "metadata_path": str(getattr(dist, "_path", "")) or None,
            "editable": editable,
            "url": direct_url.get("url") if isinstance(direct_url, dict) else None,
        }
    return None


def _site_dirs() -> list[str]:
    found: list[str] = []
    with contextlib.suppress(AttributeError):  # an old virtualenv's site module lacks them
        found += list(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        found.append(site.getusersitepackages())
    found += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return [d for d in dict.fromkeys(os.path.realpath(p) for p in found) if os.path.isdir(d)]


def _package_at(entry: str, top: str) -> str | None:
    """The regular package (or module file) `top` that a path entry holds, if any. A folder
    without `__init__.py` is only a namespace portion: a regular package later on the path
    wins over it, so it is not a copy."""
    folder = os.path.join(entry, top)
    if os.path.isfile(os.path.join(folder, "__init__.py")):
        return os.path.realpath(folder)
    if os.path.isfile(folder + ".py"):
        return os.path.realpath(folder + ".py")
    return None


def _pth_paths(pth: str) -> list[str]:
    base = os.path.dirname(pth)
    try:
        with open(pth, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return [
        os.path.normpath(os.path.join(base, line.strip()))
        for line in lines
        if line.strip() and not line.startswith(("#", "import ", "import\t"))
    ]


def _finder_mapping(path: str) -> dict[str, str]:
    """The `MAPPING` of a setuptools editable finder (`__editable___<name>_finder.py`)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MAPPING" for t in stmt.targets
        ):
            try:
                value = ast.literal_eval(stmt.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


def installed_copies(top: str, imported: str) -> list[Result]:
    """Every copy of package `top` this interpreter could import, and what points at it.

    `imported` is the real path of the file actually imported; the copy holding it says
    `imported: true`. Kinds: `sys.path` (a path entry holds the package: site-packages, the
    working folder, a .pth line), `egg-link` (a develop install's link file), `pth` (a .pth line
    naming a folder that holds it), `editable-finder` (setuptools' import hook). A link or .pth
    line whose folder no longer exists is listed as `stale` (`exists: false`).
    """
    copies: dict[str, Result] = {}

    def add(path: str, kind: str, via: str, exists: bool = True) -> None:
        key = f"{path}|{kind}|{via}"
        if key in copies:
            return
        holds = exists and (imported == path or imported.startswith(path.rstrip("/") + "/"))
        copies[key] = {
            "path": path,
            "kind": kind,
            "via": via,
            "exists": exists,
            "imported": holds,
        }

    seen_paths: set[str] = set()
    for entry in sys.path:
        entry = entry or os.getcwd()  # "" is the working folder
        if not os.path.isdir(entry):
            continue
        found = _package_at(entry, top)
        if found is not None and found not in seen_paths:
            seen_paths.add(found)
            add(found, "sys.path", entry)
    name_pattern = re.compile(r"(^|[^a-z0-9])" + re.escape(top.lower().replace("_", "-")), re.I)
    for folder in _site_dirs():
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in entries:
            path = os.path.join(folder, name)
            if name.endswith(".egg-link"):
                targets = _pth_paths(path)[:1]
                for target in targets:
                    held = _package_at(target, top)
                    if held is not None:
                        add(held, "egg-link", path)
                    elif not os.path.isdir(target) and name_pattern.search(name.replace("_", "-")):
                        add(target, "egg-link", path, exists=False)
            elif name.endswith(".pth"):
                for target in _pth_paths(path):
                    held = _package_at(target, top)
                    if held is not None:
                        add(held, "pth", path)
                    elif not os.path.exists(target) and name_pattern.search(name.replace("_", "-")):
                        add(target, "pth", path, exists=False)
            elif name.startswith("__editable__") and name.endswith("_finder.py"):
                for package, target in _finder_mapping(path).items():
                    if package == top:
                        add(
                            os.path.realpath(target),
                            "editable-finder",
                            path,
                            os.path.exists(target),
                        )
    return list(copies.values())


def installed_distributions(top: str) -> list[Result]:
    """Every `*.dist-info` / `*.egg-info` of the distribution in the site folders (more than
    one means more than one install of it)."""
    wanted = top.lower().replace("-", "_")
    found: list[Result] = []
    for folder in _site_dirs():
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in entries:
            for suffix in (".dist-info", ".egg-info"):
                if not name.endswith(suffix):
                    continue
                stem = name[: -len(suffix)]
                dist, _, version = stem.partition("-")
                if dist.lower().replace("-", "_").replace(".", "_") == wanted:
                    found.append({"path": os.path.join(folder, name), "version": version or None})
    return found


# ---------------------------------------------------------------------------------------------
# the git checkout


def find_checkout(path: str) -> str | None:
    """The root of the git work tree holding `path` (a folder with `.git`), if any."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _git(root: str, *args: str) -> tuple[int, bytes, str]:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    argv = ["git", "-c", f"safe.directory={root}", "-c", "core.quotePath=false", "-C", root]
    try:
        done = subprocess.run(
            argv + list(args),
            capture_output=True,
            timeout=GIT_TIMEOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, b"", str(exc)
    return done.returncode, done.stdout, done.stderr.decode("utf-8", "replace").strip()


def checkout_state(realpath: str, content: bytes) -> Result | None:
    """For a file of a git checkout: the commit, the file as HEAD has it (the pristine text of an
    editable install), its uncommitted change (`git diff HEAD`), and every uncommitted change in
    the checkout (`git status`). None when the file is in no checkout, or is not tracked by the
    work tree it sits in."""
    root = find_checkout(realpath)
    if root is None:
        return None
    state: Result = {"root": root, "relpath": os.path.relpath(realpath, root), "error": None}
    if shutil.which("git") is None:
        state["error"] = "git is not installed on the host"
        return state
    code, out, said = _git(root, "log", "-1", "--format=%H%x00%an <%ae>%x00%cI%x00%s")
    if code != 0:
        state["error"] = f"git log: {said or 'failed'}"
        return state
    head, author, date, subject = (out.decode("utf-8", "replace").strip().split("\0") + [""] * 4)[
        :4
    ]
    state.update(head=head, author=author, date=date, subject=subject)
    code, out, _ = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    state["branch"] = out.decode().strip() if code == 0 else None
    relpath = state["relpath"].replace(os.sep, "/")
    code, blob, said = _git(root, "show", f"HEAD:{relpath}")
    if code != 0:
        # Not a file of this checkout: a wheel installed into a virtual environment that happens
        # to live inside some git work tree (ignored or untracked there) is not a checkout
        # install, and that tree's own changes say nothing about the engine.
        return None
    state["head_sha256"] = sha256_hex(blob)
    state["head_content_b64"] = b64(blob) if blob != content else None
    state["tracked"] = True
    code, out, _ = _git(root, "diff", "--no-color", "--no-ext-diff", "HEAD", "--", relpath)
    state["diff"] = out[:MAX_GIT_DIFF].decode("utf-8", "replace") if code == 0 else None
    code, out, _ = _git(root, "status", "--porcelain=v1", "--untracked-files=no")
    lines = out.decode("utf-8", "replace").splitlines() if code == 0 else []
    state["uncommitted"] = lines[:MAX_STATUS_LINES]
    state["uncommitted_count"] = len(lines)
    return state


# ---------------------------------------------------------------------------------------------
# cached bytecode


def _optimization(name: str) -> int:
    found = re.search(r"\.opt-(\d+)\.pyc$", name)
    return int(found.group(1)) if found else 0


def judge_pyc(pyc: bytes, name: str, source: bytes, source_stat: os.stat_result) -> Result:
    """One cached bytecode file of this interpreter, judged against the source it caches.

    `runs_old_code` is the finding that matters: a timestamp pyc whose recorded mtime and size
    match the source but whose code differs (the source changed within the same second, keeping
    its size), or an unchecked hash-based pyc whose hash is not the source's (Python runs it
    without looking at the source). A pyc Python will recompile is `outdated`, not harmful.
    """
    verdict: Result = {"kind": "timestamp", "verdict": "fresh", "runs_old_code": False}
    if len(pyc) < 16 or pyc[:4] != importlib.util.MAGIC_NUMBER:
        verdict.update(kind="unknown", verdict="not this interpreter's (ignored on import)")
        return verdict
    flags = int.from_bytes(pyc[4:8], "little")
    if flags & _PYC_FLAG_HASH:
        checked = bool(flags & _PYC_FLAG_CHECK_SOURCE)
        verdict["kind"] = "hash-checked" if checked else "hash-unchecked"
        if pyc[8:16] != importlib.util.source_hash(source):
            if checked:
                verdict["verdict"] = "outdated (its source hash differs: recompiled on import)"
            else:
                verdict.update(
                    verdict="STALE: an unchecked hash-based pyc of other source; Python runs it "
                    "without looking at the source",
                    runs_old_code=True,
                )
        return verdict
    mtime = int.from_bytes(pyc[8:12], "little")
    size = int.from_bytes(pyc[12:16], "little")
    if (mtime, size) != (int(source_stat.st_mtime) & 0xFFFFFFFF, source_stat.st_size & 0xFFFFFFFF):
        verdict["verdict"] = "outdated (mtime or size differ: recompiled on import)"
        return verdict
    try:
        cached = marshal.loads(pyc[16:])
        compiled = compile(source, name, "exec", dont_inherit=True, optimize=_optimization(name))
    except (ValueError, EOFError, TypeError, SyntaxError) as exc:
        verdict["verdict"] = f"unreadable ({type(exc).__name__})"
        return verdict
    if cached != compiled:
        verdict.update(
            verdict="STALE: it matches the source's mtime and size but holds other code; the "
            "next import runs the old code",
            runs_old_code=True,
        )
    return verdict


def bytecode_state(paths: list[str], source: bytes) -> list[Result]:
    """Every pyc cached for the source file (as imported and as its real path), judged."""
    found: list[Result] = []
    seen: set[str] = set()
    for path in dict.fromkeys(os.path.abspath(p) for p in paths):
        try:
            cached = importlib.util.cache_from_source(path)
            stat_info = os.stat(path)
        except (NotImplementedError, ValueError, OSError):
            continue
        folder = os.path.dirname(cached)
        stem = os.path.basename(path)[:-3] if path.endswith(".py") else os.path.basename(path)
        tag = sys.implementation.cache_tag
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        pattern = re.compile(re.escape(stem) + r"\.([A-Za-z0-9_-]+)(\.opt-[0-9]+)?\.pyc\Z")
        for entry in entries:
            match = pattern.match(entry)
            pyc_path = os.path.join(folder, entry)
            if match is None or pyc_path in seen:
                continue
            seen.add(pyc_path)
            if match.group(1) != tag:
                found.append(
                    {"path": pyc_path, "kind": "other", "verdict": f"for {match.group(1)} "
                     "(another interpreter; ignored by this one)", "runs_old_code": False}
                )  # fmt: skip
                continue
            try:
                with open(pyc_path, "rb") as handle:
                    data = handle.read()
            except OSError as exc:
                found.append(
                    {"path": pyc_path, "kind": "unknown",
                     "verdict": f"unreadable: {exc.strerror}", "runs_old_code": False}
                )  # fmt: skip
                continue
            found.append(dict(judge_pyc(data, pyc_path, source, stat_info), path=pyc_path))
    return found
