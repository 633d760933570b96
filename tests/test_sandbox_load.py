"""`opspatch sandbox load` (issue 31, item 14): a URL that is not one is one message (on stdout
too with --json), never a traceback; `--seconds` alone bounds the load (no hidden request
count ends it early), and the report says which limit ended it. The load goes to a real stand-in
engine (its `/health` and `/generate` are what the load asks a router for)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.errors import InputError
from opspatch.sandbox.dist import STANDIN_FIXED_IN
from opspatch.sandbox.install import install_standin
from opspatch.sandbox.load import EndedBy, load_url, run_load
from tests.clirunner import opspatch
from tests.standin import EngineProcess, make_host, running_engine

pytestmark = pytest.mark.process


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:30000", "ftp://h/", "http://h:port"])
def test_a_url_that_is_not_a_router_url_is_one_message_and_exit_2_also_with_json(
    tmp_path: Path, url: str
) -> None:
    run = opspatch("sandbox", "load", "--url", url, "--json",
                   env={"OPSPATCH_STATE_DIR": str(tmp_path)})  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "ValueError" not in run.stderr, run.stderr
    error = json.loads(run.stdout)["error"]
    assert error["message"] == f"--url {url!r} is not a router URL; nothing was sent"
    assert "http://HOST:PORT" in error["hint"]


def test_a_router_url_loses_its_trailing_slash() -> None:
    assert load_url("http://127.0.0.1:30000/") == "http://127.0.0.1:30000"
    with pytest.raises(InputError):
        load_url("http:///generate")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    host = make_host(tmp_path_factory.mktemp("load-engine"))
    install_standin(host.site_packages, STANDIN_FIXED_IN)  # a release whose decode does not crash
    with running_engine(host) as process:
        yield process


@pytest.mark.engine
def test_seconds_alone_bound_the_load_and_the_report_says_so(engine: EngineProcess) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    run = opspatch("sandbox", "load", "--url", url, "--seconds", "1.5", "--concurrency", "2",
                   "--json")  # fmt: skip

    assert run.code == 0, run.stdout + run.stderr
    report = run.json()
    assert report["ended_by"] == "seconds", report
    assert report["limits"] == {"seconds": 1.5, "requests": None}
    assert report["seconds"] >= 1.5
    assert report["sent"] == report["succeeded"] > 0, report


@pytest.mark.engine
def test_a_request_count_that_ends_the_load_first_is_named(engine: EngineProcess) -> None:
    url = f"http://127.0.0.1:{engine.port}/"
    run = opspatch("sandbox", "load", "--url", url, "--requests", "3", "--seconds", "600")

    assert run.code == 0, run.stdout + run.stderr
    assert run.stdout.startswith("3 sent in "), run.stdout
    assert "ended by --requests 3 (all sent)" in run.stdout, run.stdout
    report = run_load(url, requests=2, seconds=600, concurrency=1)
    assert (report.ended_by, report.sent) == (EndedBy.REQUESTS, 2)
