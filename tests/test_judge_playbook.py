"""A playbook's `[judge]`: absent means no judge; present, its keys with their defaults, its
prompt file read at load time, and every bad value one error at file:line naming the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opspatch.config.playbook import load_playbook, parse_playbook
from opspatch.core.judgeprompts import DEFAULT_JUDGE_PROMPTS
from opspatch.core.policy import JudgeSettings
from opspatch.core.vocabulary import JudgeHosts
from opspatch.errors import SpecError

pytestmark = pytest.mark.pure


def written(folder: Path, text: str, name: str = "judged") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_no_judge_table_is_no_judge() -> None:
    assert parse_playbook("canary = 1\n", "playbooks/plain.toml").judge is None


def test_an_empty_judge_table_is_the_defaults_with_the_shipped_prompts() -> None:
    judge = parse_playbook("[judge]\n", "playbooks/judged.toml").judge
    assert judge == JudgeSettings()
    assert judge.prompts == DEFAULT_JUDGE_PROMPTS and judge.prompt_source == "built-in"
    assert len(judge.chosen) == 24 and judge.hosts == JudgeHosts.CANARY


def test_every_key_is_taken_and_the_prompt_file_is_read_relative_to_the_playbook(
    tmp_path: Path,
) -> None:
    (tmp_path / "prompts.txt").write_text(
        "# the judge's prompts\n\n" + "".join(f"prompt number {i}\n" for i in range(10)),
        encoding="utf-8",
    )
    path = written(
        tmp_path,
        """
        [judge]
        prompts = "prompts.txt"
        count = 9
        max_new_tokens = 32
        top_k = 3
        hosts = "all"
        alpha = 0.05
        accept_drop = 0.1
        latency_rise = 1
        latency_floor_ms = 2
        max_diverged = 0
        tie_margin = 0.25
        max_untied = 2
        warmup = 0
        timeout = 60
        """,
    )
    judge = load_playbook(path).judge
    assert judge is not None
    assert judge.prompts == tuple(f"prompt number {i}" for i in range(10))
    assert judge.prompt_source == str(tmp_path / "prompts.txt")
    assert judge.chosen == judge.prompts[:9]
    assert (judge.max_new_tokens, judge.top_k, judge.hosts) == (32, 3, JudgeHosts.ALL)
    assert (judge.alpha, judge.accept_drop, judge.latency_rise) == (0.05, 0.1, 1.0)
    assert (judge.latency_floor_ms, judge.max_diverged, judge.timeout) == (2.0, 0.0, 60.0)
    assert isinstance(judge.timeout, float)
    assert (judge.tie_margin, judge.max_untied, judge.warmup) == (0.25, 2, 0)
    assert isinstance(judge.tie_margin, float)


@pytest.mark.parametrize(
    ("table", "line", "field", "words"),
    [
        ('hosts = "some"', 3, "judge.hosts", "canary"),
        ("count = 4", 3, "judge.count", "must be at least 9, got 4"),
        ("count = 9\nalpha = 0.001", 4, "judge.alpha", "no change is significant on fewer than 15"),
        ("alpha = 0.7", 3, "judge.alpha", "must be less than 0.5, got 0.7"),
        ('accept_drop = "5%"', 3, "judge.accept_drop", "must be a number"),
        ("top_k = 0", 3, "judge.top_k", "must be at least 1"),
        ("max_new_tokens = 2", 3, "judge.max_new_tokens", "must be at least 8"),
        ("latency_floor_ms = -1", 3, "judge.latency_floor_ms", "must be at least 0"),
        ("tie_margin = -0.5", 3, "judge.tie_margin", "must be at least 0"),
        ('tie_margin = "0.5"', 3, "judge.tie_margin", "must be a number"),
        ("max_untied = -1", 3, "judge.max_untied", "must be at least 0"),
        ("max_untied = 0.5", 3, "judge.max_untied", "must be a whole number"),
        ("warmup = 100", 3, "judge.warmup", "must be at most 64"),
        ("samples = 3", 3, "judge.samples", "unknown key"),
    ],
)
def test_a_bad_judge_value_is_one_error_at_its_line_naming_the_field(
    table: str, line: int, field: str, words: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_playbook(f"canary = 1\n[judge]\n{table}\n", "playbooks/judged.toml")
    text = str(caught.value)
    assert f"playbooks/judged.toml:{line}" in text, text
    assert field in text and words in text, text


def test_a_missing_prompt_file_is_an_error_at_the_prompts_line(tmp_path: Path) -> None:
    path = written(tmp_path, '[judge]\nprompts = "nowhere.txt"\n')
    with pytest.raises(SpecError) as caught:
        load_playbook(path)
    text = str(caught.value)
    assert f"{path}:2" in text and "judge.prompts" in text, text
    assert "cannot read the judge's prompt file" in text and "nowhere.txt" in text, text


def test_too_few_prompts_for_the_count_is_an_error_saying_how_many(tmp_path: Path) -> None:
    (tmp_path / "few.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    path = written(tmp_path, '[judge]\nprompts = "few.txt"\n')
    with pytest.raises(SpecError) as caught:
        load_playbook(path)
    assert "has 3 prompts; the judge needs at least 9" in str(caught.value)
    (tmp_path / "ten.txt").write_text("".join(f"p{i}\n" for i in range(10)), encoding="utf-8")
    path = written(tmp_path, '[judge]\nprompts = "ten.txt"\ncount = 12\n')
    with pytest.raises(SpecError) as caught:
        load_playbook(path)
    text = str(caught.value)
    assert f"{path}:3" in text and "decodes 12 prompts but" in text and "has 10" in text, text
