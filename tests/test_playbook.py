"""Playbooks: the shipped files, loading errors at file:line, the rollout plan, the halt rule."""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from opspatch.config.lookup import Workspace
from opspatch.config.playbook import load_playbook, parse_playbook
from opspatch.core.policy import (
    DEFAULT_FAIL_PATTERNS,
    DEFAULT_IGNORE_PATTERNS,
    BatchSize,
    Playbook,
    SmokePrompt,
    plan_batches,
    plan_rollout,
)
from opspatch.errors import InputError, SpecError

pytestmark = pytest.mark.pure

REPO_PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"


def shipped(name: str) -> Playbook:
    """A playbook shipped with opspatch, loaded by path."""
    return load_playbook(REPO_PLAYBOOKS / f"{name}.toml")


def playbook(text: str, path: str = "playbooks/test.toml") -> Playbook:
    return parse_playbook(textwrap.dedent(text), path)


def spec_error(text: str, path: str = "playbooks/test.toml") -> SpecError:
    with pytest.raises(SpecError) as caught:
        playbook(text, path)
    return caught.value


# ---------------------------------------------------------------------------------------------
# the shipped playbooks


def test_default_playbook_is_one_canary_then_quarters_halting_on_the_first_failure() -> None:
    book = shipped("default")
    assert book.name == "default"
    assert book.canary == 1
    assert book.batch == BatchSize(percent=Decimal(25))
    assert book.max_failures == 1
    assert book.on_halt == "stop"
    assert book.smoke.max_new_tokens >= 8
    assert book.smoke.require_spec_verify is True
    assert book.log.fail_patterns == DEFAULT_FAIL_PATTERNS
    assert book.log.ignore_patterns == DEFAULT_IGNORE_PATTERNS
    assert book.source == str(REPO_PLAYBOOKS / "default.toml")


def test_default_playbook_file_writes_out_the_model_defaults() -> None:
    # Leaving a key out of any playbook means what default.toml says.
    book = shipped("default")
    assert book == Playbook(name="default", description=book.description)


def test_incident_playbook_has_no_canary_everything_in_flight_and_halts_on_the_second() -> None:
    book = shipped("incident")
    assert book.canary == 0
    assert book.max_in_flight is None
    assert book.max_failures == 2
    hosts = [f"gpu-{i:02}" for i in range(12)]
    assert plan_batches(book, hosts) == [hosts]
    assert plan_rollout(book, hosts).batches[0].in_flight == 12
    assert book.halt_reason({"gpu-00": "rolled-back"}) is None
    assert book.halt_reason({"gpu-00": "rolled-back", "gpu-01": "failed"}) is not None


def test_rotation_reads_a_count_or_a_percentage_and_the_incident_playbook_says_the_fleet_is_down(
    tmp_path: Path,
) -> None:
    path = tmp_path / "careful.toml"
    path.write_text('[rotation]\nmax_unavailable = "10%"\n[timeouts]\ndrain = 5\n')
    book = Workspace(tmp_path, tmp_path).load_playbook(str(path))
    assert book.rotation.max_unavailable.hosts_per_batch(100) == 10
    assert book.rotation.fleet_down is False
    assert book.timeouts.drain == 5
    incident = shipped("incident")
    assert incident.rotation.fleet_down is True
    assert incident.rotation.max_unavailable.hosts_per_batch(7) == 7


def test_a_rotation_capacity_that_is_not_a_count_or_percentage_names_its_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "careful.toml"
    path.write_text('[rotation]\nmax_unavailable = "most"\n')
    with pytest.raises(SpecError) as caught:
        Workspace(tmp_path, tmp_path).load_playbook(str(path))
    assert "careful.toml:2" in caught.value.render()
    assert "rotation.max_unavailable" in caught.value.render()


@pytest.mark.parametrize("name", ["default", "incident"])
def test_shipped_playbooks_round_trip_through_json(name: str) -> None:
    book = shipped(name)
    document = book.to_json()
    assert document["name"] == name
    assert set(document["timeouts"]) == {
        "lock",
        "inspect",
        "swap",
        "restart",
        "ready",
        "smoke",
        "restore",
        "restore_ready",
        "drain",
        "admit",
    }


# ---------------------------------------------------------------------------------------------
# loading by name and path


def test_load_by_name_takes_the_workspace_first_then_the_shipped_ones(tmp_path: Path) -> None:
    mine = tmp_path / "workspace"
    (mine / "playbooks").mkdir(parents=True)
    (mine / "playbooks" / "default.toml").write_text('name = "default"\nmax_failures = 3\n')
    workspace = Workspace(mine, tmp_path / "state")
    assert workspace.load_playbook("default").max_failures == 3
    assert workspace.load_playbook("incident").max_failures == 2
    assert workspace.load_playbook("incident").source == str(REPO_PLAYBOOKS / "incident.toml")


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "careful.toml"
    path.write_text("canary = 2\n")
    assert Workspace(tmp_path, tmp_path).load_playbook(str(path)).canary == 2
    assert load_playbook(path).name == "careful"


def test_unknown_name_suggests_near_names(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no playbook named 'incidnet'") as caught:
        Workspace(tmp_path, tmp_path).load_playbook("incidnet")
    assert caught.value.hint is not None and "incident" in caught.value.hint


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.toml: no such file"):
        Workspace(tmp_path, tmp_path).load_playbook(str(tmp_path / "nope.toml"))
    with pytest.raises(SpecError, match="file not found"):
        load_playbook(tmp_path / "nope.toml")


def test_an_empty_playbook_takes_every_default() -> None:
    book = playbook("", "playbooks/empty.toml")
    assert book == Playbook(name="empty")


# ---------------------------------------------------------------------------------------------
# errors name the file, the line and the field


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        ("canary = 1\nbatchh = 2\n", 2, "batchh", "unknown key 'batchh'"),
        ("canary = true\n", 1, "canary", "number of hosts or a list"),
        ("canary = -1\n", 1, "canary", "at least 0"),
        ('canary = ["gpu-01", 7]\n', 1, "canary[1]", "must be a string"),
        ('canary = ["gpu-01", "gpu-01"]\n', 1, "canary", "more than once"),
        ('batch = "0%"\n', 1, "batch", "percentage"),
        ('batch = "150%"\n', 1, "batch", "percentage"),
        ('batch = "quarter"\n', 1, "batch", "percentage"),
        ("batch = 0\n", 1, "batch", "at least 1"),
        ("batch = 2.5\n", 1, "batch", "host count"),
        ('max_in_flight = "many"\n', 1, "max_in_flight", "'all'"),
        ("max_in_flight = 0\n", 1, "max_in_flight", "at least 1"),
        ("max_failures = 0\n", 1, "max_failures", "at least 1"),
        ('on_halt = "rollback"\n', 1, "on_halt", "must be one of"),
        ('name = "other"\n', 1, "name", "differs from the file name"),
        ("\n[timeouts]\nready = 0\n", 3, "timeouts.ready", "more than 0"),
        ('\n[timeouts]\nsmoke = "fast"\n', 3, "timeouts.smoke", "number of seconds"),
        ("\n[timeouts]\nreboot = 5\n", 3, "timeouts.reboot", "unknown key"),
        ("timeouts = 5\n", 1, "timeouts", "must be a table"),
        ("\n[smoke]\nmax_new_tokens = 4\n", 3, "smoke.max_new_tokens", "at least 8"),
        ("\n[smoke]\nprompts = []\n", 3, "smoke.prompts", "non-empty"),
        ('\n[smoke]\nprompts = ["   "]\n', 3, "smoke.prompts[0]", "must not be empty"),
        ('\n[smoke]\nbaseline = "yes"\n', 3, "smoke.baseline", 'true, false or "required"'),
        (
            '\n[smoke]\nprompts = [{ text = "hi", expect = "(unclosed" }]\n',
            3,
            "smoke.prompts[0].expect",
            "not a valid regular expression",
        ),
        (
            '[smoke]\nmax_new_tokens = 16\n\n[[smoke.prompts]]\ntext = "a"\n\n'
            '[[smoke.prompts]]\ntext = "b"\nexpect = "[z-a]"\n',
            9,
            "smoke.prompts[1].expect",
            "not a valid regular expression",
        ),
        ('\n[smoke]\nprompts = [{ txt = "hi" }]\n', 3, "smoke.prompts[0].txt", "unknown key"),
        ("\n\n[log]\nfail_patterns = ['Traceback (']\n", 4, "log.fail_patterns[0]", "regular"),
        ("\n[log]\nfail_patterns = 'Traceback'\n", 3, "log.fail_patterns", "must be a list"),
        ("\n[log]\nignore_patterns = ['gc (']\n", 3, "log.ignore_patterns[0]", "regular"),
        ("canary = 1\nbatch = = 2\n", 2, "", "malformed TOML"),
    ],
)
def test_errors_name_the_file_line_and_field(
    text: str, line: int, field: str, problem: str
) -> None:
    error = spec_error(text)
    assert error.location.file == "playbooks/test.toml"
    assert error.location.line == line
    assert error.location.field == field
    assert problem in error.problem
    assert str(error).startswith(f"playbooks/test.toml:{line}")


def test_an_unknown_key_suggests_the_near_one() -> None:
    error = spec_error("max_failure = 2\n")
    assert error.hint is not None and "max_failures" in error.hint


def test_an_unknown_on_halt_suggests_the_near_choice() -> None:
    error = spec_error('on_halt = "rollback_run"\n')
    assert error.hint is not None and "rollback-run" in error.hint


# ---------------------------------------------------------------------------------------------
# values


def test_prompts_may_be_strings_tables_or_arrays_of_tables() -> None:
    book = playbook(
        """
        [smoke]
        prompts = ["plain", { text = "def square(x):", expect = "return" }]
        """
    )
    assert book.smoke.prompts == (
        SmokePrompt("plain"),
        SmokePrompt("def square(x):", "return"),
    )
    tables = playbook(
        """
        [[smoke.prompts]]
        text = "The capital of France is"
        expect = 'Paris\\b'
        """
    )
    assert tables.smoke.prompts == (SmokePrompt("The capital of France is", r"Paris\b"),)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('"25%"', BatchSize(percent=Decimal(25))),
        ('" 12.5 %"', BatchSize(percent=Decimal("12.5"))),
        ('"all"', BatchSize(percent=Decimal(100))),
        ('"100%"', BatchSize(percent=Decimal(100))),
        ("3", BatchSize(count=3)),
    ],
)
def test_batch_sizes(written: str, expected: BatchSize) -> None:
    assert playbook(f"batch = {written}\n").batch == expected


def test_max_in_flight_all_means_the_whole_batch() -> None:
    book = playbook('max_in_flight = "all"\n')
    assert book.max_in_flight is None
    assert book.in_flight(40) == 40
    assert playbook("max_in_flight = 3\n").in_flight(40) == 3
    assert playbook("max_in_flight = 3\n").in_flight(2) == 2


def test_an_empty_canary_list_means_no_canary() -> None:
    assert playbook("canary = []\n").canary == 0


# ---------------------------------------------------------------------------------------------
# planning (table-driven)

HOSTS = tuple(f"h{i}" for i in range(1, 11))  # h1..h10


@pytest.mark.parametrize(
    ("settings", "hosts", "batches"),
    [
        # no hosts at all
        ({}, (), []),
        # one host: it is the canary
        ({}, ("h1",), [["h1"]]),
        # default: one canary, then 25% of 10 = 2.5 -> 3 per batch
        ({}, HOSTS, [["h1"], ["h2", "h3", "h4"], ["h5", "h6", "h7"], ["h8", "h9", "h10"]]),
        # 25% of 3 rounds up to 1
        ({}, HOSTS[:3], [["h1"], ["h2"], ["h3"]]),
        # 25% of 5 rounds up to 2 (the canary counts towards the selection)
        ({}, HOSTS[:5], [["h1"], ["h2", "h3"], ["h4", "h5"]]),
        # no canary, fixed batch of 4
        ({"canary": 0, "batch": BatchSize(count=4)}, HOSTS, [list(HOSTS[:4]), list(HOSTS[4:8]), ["h9", "h10"]]),
        # canary count larger than the selection: every host is a canary
        ({"canary": 5}, HOSTS[:3], [["h1", "h2", "h3"]]),
        # two canaries in one batch, then everything else at once
        ({"canary": 2, "batch": BatchSize(percent=Decimal(100))}, HOSTS[:6], [["h1", "h2"], ["h3", "h4", "h5", "h6"]]),
        # named canaries go first in the playbook's order, wherever they are in the selection
        ({"canary": ("h7", "h3"), "batch": BatchSize(count=5)}, HOSTS[:8], [["h7", "h3"], ["h1", "h2", "h4", "h5", "h6"], ["h8"]]),
        # a named canary that is not selected is left out
        ({"canary": ("h9", "h2")}, HOSTS[:4], [["h2"], ["h1"], ["h3"], ["h4"]]),
        # no named canary is selected: no canary batch
        ({"canary": ("gpu-99",), "batch": BatchSize(count=2)}, HOSTS[:3], [["h1", "h2"], ["h3"]]),
        # a batch larger than what is left
        ({"batch": BatchSize(count=50)}, HOSTS[:4], [["h1"], ["h2", "h3", "h4"]]),
        # 12.5% of 10 = 1.25 -> 2
        ({"canary": 0, "batch": BatchSize(percent=Decimal("12.5"))}, HOSTS, [["h1", "h2"], ["h3", "h4"], ["h5", "h6"], ["h7", "h8"], ["h9", "h10"]]),
        # 12.5% of 6 = 0.75 -> 1
        ({"canary": 0, "batch": BatchSize(percent=Decimal("12.5"))}, HOSTS[:3], [["h1"], ["h2"], ["h3"]]),
    ],
)  # fmt: skip
def test_plan_batches(
    settings: dict[str, object], hosts: tuple[str, ...], batches: list[list[str]]
) -> None:
    book = Playbook(**settings)  # type: ignore[arg-type]
    planned = plan_batches(book, hosts)
    assert planned == batches
    # Every selected host is planned exactly once; nothing else is.
    assert sorted(h for batch in planned for h in batch) == sorted(hosts)


def test_plan_marks_canaries_and_caps_hosts_in_flight() -> None:
    plan = plan_rollout(Playbook(canary=2, batch=BatchSize(count=5), max_in_flight=3), HOSTS)
    assert [b.canary for b in plan.batches] == [True, False, False]
    assert [b.in_flight for b in plan.batches] == [2, 3, 3]
    assert plan.canaries == ("h1", "h2")
    assert plan.to_json()["batches"][0] == {"hosts": ["h1", "h2"], "canary": True, "in_flight": 2}


def test_plan_explains_surprises_in_notes() -> None:
    assert "every host is a canary" in plan_rollout(Playbook(canary=4), ["a", "b"]).notes[0]
    notes = plan_rollout(Playbook(canary=("gpu-99",)), ["a", "b"]).notes
    assert any("gpu-99" in n and "not selected" in n for n in notes)
    assert any("no canary" in n for n in notes)
    assert plan_rollout(Playbook(), []).notes == ("no hosts are selected",)


def test_a_host_selected_twice_is_a_bug_upstream() -> None:
    with pytest.raises(ValueError, match="h1"):
        plan_batches(Playbook(), ["h1", "h2", "h1"])


# ---------------------------------------------------------------------------------------------
# halting


@pytest.mark.parametrize(
    ("max_failures", "outcomes", "canaries", "halts", "says"),
    [
        (1, {}, (), False, ""),
        (1, {"h1": "applied", "h2": "already-applied", "h3": "skipped"}, (), False, ""),
        (1, {"h1": "applied", "h2": "rolled-back"}, (), True, "max_failures = 1"),
        (2, {"h2": "failed"}, (), False, ""),
        (2, {"h2": "failed", "h3": "rolled-back"}, (), True, "2 hosts failed"),
        (5, {"h1": "rolled-back"}, ("h1",), True, "canary h1 failed"),
        (5, {"h4": "needs-attention"}, (), True, "h4 needs attention"),
    ],
)
def test_halt_reason(
    max_failures: int,
    outcomes: dict[str, str],
    canaries: tuple[str, ...],
    halts: bool,
    says: str,
) -> None:
    reason = Playbook(max_failures=max_failures).halt_reason(outcomes, canaries=canaries)
    assert (reason is not None) is halts
    if halts:
        assert reason is not None and says in reason
