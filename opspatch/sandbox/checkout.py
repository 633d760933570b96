"""The editable install shape: the engine as a git checkout installed with `pip install -e`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.core.wheelrecord import record_line
from opspatch.errors import HostError, InputError
from opspatch.sandbox.dist import (
    DIST_NAME,
    INSTALLER_NAME,
    check_version,
    dist_info_dir,
    metadata_text,
    refuse_controller_site_packages,
    replace_installed,
    standin_files,
    wheel_text,
)

PURGE = remedy_text(Command.SANDBOX_DOWN, purge=True)
"""The command that removes the sandbox, for hints."""

CHECKOUT_NAME = "sglang"
"""The checkout's folder in a host's folder, as `git clone` names SGLang's repository."""

PROJECT_SUBDIR = "python"
"""Where SGLang keeps its Python project (`pyproject.toml` and the `sglang` package)."""

GIT_BRANCH = "main"
GIT_USER_NAME = "opspatch sandbox"
GIT_USER_EMAIL = "sandbox@opspatch.invalid"
GIT_DATE = "2025-11-01T00:00:00+00:00"
GIT_TIMEOUT = 60.0

_GITIGNORE = """\
# As SGLang's repository ignores them: what running and building the package leaves behind.
__pycache__/
*.py[cod]
*.egg-info/
build/
dist/
"""

_README = """\
# sglang (opspatch sandbox stand-in)

The stand-in SGLang engine of the opspatch sandbox, laid out as SGLang's repository lays out its
package (`python/sglang/...`) and installed with the shape `pip install -e python` gives.
Written by `opspatch sandbox up --install editable`; `opspatch sandbox down --purge` removes it.
"""


def checkout_dir(host_dir: Path) -> Path:
    """The host's git checkout of the engine: `<host>/sglang`."""
    return host_dir / CHECKOUT_NAME


def project_dir(checkout: Path) -> Path:
    """The checkout's Python project, the folder `pip install -e` is given: `<checkout>/python`."""
    return checkout / PROJECT_SUBDIR


def pth_name(version: str) -> str:
    """The `.pth` file setuptools names after the distribution: `__editable__.sglang-<v>.pth`."""
    return f"__editable__.{DIST_NAME}-{version}.pth"


def pyproject_text(version: str) -> str:
    """`python/pyproject.toml`: the distribution `sglang` at `version`, built by setuptools
    with package discovery, as SGLang's own."""
    return (
        "# The stand-in SGLang engine of the opspatch sandbox; `pip install -e python` from the\n"
        "# checkout's root installs it as SGLang is installed from a source checkout.\n"
        "[build-system]\n"
        'requires = ["setuptools>=61.0", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n'
        "\n"
        "[project]\n"
        f'name = "{DIST_NAME}"\n'
        f'version = "{version}"\n'
        'description = "Stand-in SGLang engine of the opspatch sandbox (tiny CPU model)"\n'
        'requires-python = ">=3.10"\n'
        'dependencies = ["torch"]\n'
        "\n"
        "[tool.setuptools.packages.find]\n"
        f'include = ["{DIST_NAME}*"]\n'
    )


def checkout_files(version: str) -> dict[str, bytes]:
    """Every file the checkout's commit holds, keyed by its path in the repository."""
    files = {
        ".gitignore": _GITIGNORE.encode("utf-8"),
        "README.md": _README.encode("utf-8"),
        f"{PROJECT_SUBDIR}/pyproject.toml": pyproject_text(version).encode("utf-8"),
    }
    for relative, data in standin_files(version).items():
        files[f"{PROJECT_SUBDIR}/{relative}"] = data
    return files


def editable_files(checkout: Path, version: str) -> dict[str, bytes]:
    """The files an editable install puts in site-packages, keyed by their path there: the
    `.pth` naming the checkout's project folder and the dist-info, RECORD listing exactly these.
    """
    check_version(version)
    project = project_dir(checkout).resolve()
    dist_info = dist_info_dir(version)
    direct_url = {"dir_info": {"editable": True}, "url": project.as_uri()}
    files: dict[str, bytes] = {
        pth_name(version): f"{project}\n".encode(),
        f"{dist_info}/METADATA": metadata_text(version).encode("utf-8"),
        f"{dist_info}/WHEEL": wheel_text().encode("ascii"),
        f"{dist_info}/top_level.txt": f"{DIST_NAME}\n".encode("ascii"),
        f"{dist_info}/direct_url.json": json.dumps(direct_url, sort_keys=True).encode("utf-8"),
        f"{dist_info}/INSTALLER": f"{INSTALLER_NAME}\n".encode("ascii"),
        f"{dist_info}/REQUESTED": b"",
    }
    rows = [record_line(path, data) for path, data in files.items()]
    rows.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(sorted(rows)) + "\n").encode("utf-8")
    return files


# ---------------------------------------------------------------------------------------------
# effects: git, and the install itself


def require_git() -> str:
    """The `git` executable.

    Raises:
        InputError: git is not installed.
    """
    git = shutil.which("git")
    if git is None:
        raise InputError(
            "`--install editable` needs git, which is not installed; nothing was changed",
            hint="apt-get install git (or run "
            f"`{remedy_text(Command.SANDBOX_UP, install='wheel')}`)",
        )
    return git


def _git_env(home: Path) -> dict[str, str]:
    """The environment git runs in: no inherited `GIT_*` setting, no system or user config (so
    no hook, signing key or template of whoever runs `up` takes part), a fixed date."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.pop("XDG_CONFIG_HOME", None)
    env.update(
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_DATE=GIT_DATE,
        GIT_COMMITTER_DATE=GIT_DATE,
        LC_ALL="C",
    )
    return env


def _git(git: str, repo: Path, *args: str, host: str) -> None:
    try:
        done = subprocess.run(
            [git, "-C", str(repo), *args],
            env=_git_env(repo),
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostError(
            f"git {args[0]} failed: {exc}", host=host, step="sandbox-checkout"
        ) from None
    if done.returncode != 0:
        raise HostError(
            f"git {args[0]} exited {done.returncode}: {(done.stderr or done.stdout).strip()}",
            host=host,
            step="sandbox-checkout",
        )


def _commit(git: str, repo: Path, version: str, why: str, *, host: str) -> None:
    """Commit everything staged as the sandbox's fixed author, `why` in the message's body."""
    _git(
        git,
        repo,
        "-c",
        f"user.name={GIT_USER_NAME}",
        "-c",
        f"user.email={GIT_USER_EMAIL}",
        "commit",
        "--quiet",
        "--no-verify",
        "--no-gpg-sign",
        "--message",
        f"sglang {version}: the opspatch sandbox's stand-in engine\n\n{why}\n",
        host=host,
    )


def make_checkout(host_dir: Path, version: str) -> Path:
    """Give the host its git checkout of the engine (kept as it is when it exists: a checkout
    with local changes or commits stays so); returns `<host>/sglang`.

    The repository is built and committed in a temporary folder beside it and renamed into
    place, so a failure part-way leaves nothing under the final name.

    Raises:
        InputError: git is not installed.
        HostError: `<host>/sglang` exists but is not a git checkout, or a git command failed.
    """
    checkout = checkout_dir(host_dir)
    if (checkout / ".git").is_dir():
        return checkout
    if checkout.exists() or checkout.is_symlink():
        raise HostError(
            f"{checkout} is in the way of the host's git checkout (it is not one)",
            host=host_dir.name,
            step="sandbox-checkout",
            hint=f"{PURGE}, then up again",
        )
    git = require_git()
    host_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".opspatch-checkout-", dir=host_dir))
    try:
        for relative, data in checkout_files(version).items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        staging.chmod(0o755)
        host = host_dir.name
        _git(git, staging, "init", "--quiet", "--template=", host=host)
        _git(git, staging, "symbolic-ref", "HEAD", f"refs/heads/{GIT_BRANCH}", host=host)
        _git(git, staging, "add", "--all", host=host)
        _commit(
            git,
            staging,
            version,
            "Laid out as SGLang's repository (python/sglang/...), installed editable.",
            host=host,
        )
        os.replace(staging, checkout)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return checkout


def release_checkout(host_dir: Path, version: str) -> Path:
    """Put the host's checkout at release `version`, as `git checkout` of that release would:
    every file of the release's tree back as it ships (local edits gone), committed as the next
    commit when `version` differs from what HEAD holds (fixed author and date: every host gets
    the same commit); returns `<host>/sglang`. A checkout already at `version` and clean is
    left as it is.

    Raises:
        InputError: git is not installed.
        HostError: `<host>/sglang` is not a git checkout, or a git command failed.
    """
    checkout = checkout_dir(host_dir)
    if not (checkout / ".git").is_dir():
        raise HostError(
            f"{checkout} is not the host's git checkout",
            host=host_dir.name,
            step="sandbox-checkout",
            hint=f"{PURGE}, then up --install editable again",
        )
    git = require_git()
    files = checkout_files(version)
    for relative, data in files.items():
        target = checkout / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)
    host = host_dir.name
    _git(git, checkout, "add", "--", *files, host=host)
    changed = subprocess.run(
        [git, "-C", str(checkout), "diff", "--cached", "--quiet"],
        env=_git_env(checkout),
        capture_output=True,
        timeout=GIT_TIMEOUT,
        check=False,
    )
    if changed.returncode != 0:
        _commit(
            git,
            checkout,
            version,
            "The release as `opspatch sandbox reinstall` put it in place.",
            host=host,
        )
    return checkout


def install_editable(host_dir: Path, site_packages: Path, version: str) -> Path:
    """Install the stand-in into `site_packages` as `pip install -e <host>/sglang/python` does,
    making the checkout first if it is missing; returns the checkout's `sglang` package folder.

    Replaces an existing `sglang` (either shape) in `site_packages`, as a reinstall with pip
    would; the files are staged beside and renamed into place.

    Raises:
        InputError: a malformed version, `site_packages` is the controller's own, or no git.
        HostError: the checkout cannot be made.
    """
    check_version(version)
    site_packages = site_packages.resolve()
    refuse_controller_site_packages(site_packages)
    checkout = make_checkout(host_dir, version)
    site_packages.mkdir(parents=True, exist_ok=True)
    files = editable_files(checkout, version)
    replace_installed(site_packages, files, staging_prefix=".opspatch-editable-")
    return project_dir(checkout) / DIST_NAME
