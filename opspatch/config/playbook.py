"""Playbooks: the rollout policy and the verification procedure, as a typed model (pure).
Every key, annotated with its default: docs/formats.md, "Playbooks"."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError

from opspatch.config.files import read_toml
from opspatch.core.fileschema import (
    FileSchema,
    by_type,
    expects,
    problem,
    spec_error_from_validation,
)
from opspatch.core.pairedstats import fewest_pairs
from opspatch.core.policy import (
    MAX_JUDGE_REPEATS,
    MAX_JUDGE_WARMUP,
    MAX_SMOKE_TOKENS,
    MIN_JUDGE_PROMPTS,
    MIN_SMOKE_TOKENS,
    TIMEOUT_STEPS,
    BatchSize,
    JudgeSettings,
    LogSettings,
    Playbook,
    RotationSettings,
    SmokePrompt,
    SmokeSettings,
    StepTimeouts,
    TeamSettings,
)
from opspatch.core.tomlsource import TomlDocument, parse_toml
from opspatch.core.vocabulary import HaltAction, JudgeHosts, RestartPolicy

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


# ---------------------------------------------------------------------------------------------
# the file's schema (every key optional: a missing key takes the model's default)


def _usable_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise problem(f"{name!r} is not a usable playbook name", hint="use a-z, 0-9, -")
    return name


def _distinct_names(names: list[str]) -> list[str]:
    if any(not n.strip() for n in names):
        raise problem("host names must not be empty")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise problem(f"lists {', '.join(repeated)} more than once")
    return names


def _percent(text: str) -> Decimal | None:
    """The batch percentage `text` says (`"all"` is 100), or None when it says none."""
    if text.strip().lower() == "all":
        return Decimal(100)
    match = _PERCENT_RE.match(text)
    if match is None:
        return None
    try:
        percent = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        return None
    return percent if Decimal(0) < percent <= Decimal(100) else None


def _batch_text(text: str) -> str:
    if _percent(text) is None:
        raise problem(
            f"must be a host count, a percentage above 0% and at most 100%, or 'all'; got {text!r}",
            hint='for example batch = 4 or batch = "25%"',
        )
    return text


def _all(text: str) -> str:
    if text.strip().lower() != "all":
        raise problem(f"must be a number of hosts or 'all', got {text!r}")
    return text


def _regex(pattern: str) -> str:
    if not pattern:
        raise problem("an empty regular expression matches everything")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise problem(
            f"is not a valid regular expression: {exc.msg} at position {exc.pos}",
            hint="TOML literal strings ('...') keep backslashes as written",
        ) from None
    except (RecursionError, MemoryError, OverflowError):
        raise problem("is not a usable regular expression: it is nested too deeply") from None
    return pattern


def _prompt_text(text: str) -> str:
    if not text.strip():
        raise problem("a smoke prompt must not be empty")
    return text


Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Seconds = Annotated[
    float, expects("a number of seconds", int, float), Field(gt=0, allow_inf_nan=False)
]
Regex = Annotated[str, AfterValidator(_regex)]
PromptText = Annotated[str, AfterValidator(_prompt_text)]


class PromptTable(FileSchema):
    text: PromptText
    expect: Regex | None = None


if TYPE_CHECKING:  # what the unions below hold, for mypy; pydantic validates the real ones
    Canary = int | list[str]
    Batch = int | str
    MaxInFlight = int | str
    Prompt = str | PromptTable
else:
    Canary = by_type(
        "a number of hosts or a list of host names",
        int=Count,
        list=Annotated[list[str], AfterValidator(_distinct_names)],
    )
    Batch = by_type(
        "a host count, a percentage string or 'all'",
        int=Positive,
        str=Annotated[str, AfterValidator(_batch_text)],
    )
    MaxInFlight = by_type(
        "a number of hosts or 'all'", int=Positive, str=Annotated[str, AfterValidator(_all)]
    )
    Prompt = by_type(
        "a prompt string or a table { text, expect }", str=PromptText, dict=PromptTable
    )


class TimeoutsTable(FileSchema):
    lock: Seconds | None = None
    inspect: Seconds | None = None
    swap: Seconds | None = None
    restart: Seconds | None = None
    ready: Seconds | None = None
    smoke: Seconds | None = None
    restore: Seconds | None = None
    restore_ready: Seconds | None = None
    drain: Seconds | None = None
    admit: Seconds | None = None


def _true_false_or_required(value: object) -> object:
    if isinstance(value, bool) or value == "required":
        return value
    raise problem(f'must be true, false or "required", got {value!r}')


class SmokeTable(FileSchema):
    prompts: Annotated[list[Prompt], Field(min_length=1)] | None = None
    max_new_tokens: Annotated[int, Field(ge=MIN_SMOKE_TOKENS, le=MAX_SMOKE_TOKENS)] | None = None
    baseline: (
        Annotated[
            bool | Literal["required"],
            BeforeValidator(_true_false_or_required),
        ]
        | None
    ) = None
    require_spec_verify: bool | None = None


class RotationTable(FileSchema):
    max_unavailable: Batch | None = None
    fleet_down: bool | None = None


class TeamTable(FileSchema):
    lease_expiry: Seconds | None = None
    require_approval: bool | None = None
    allowed_signers: Annotated[str, Field(min_length=1)] | None = None


class LogTable(FileSchema):
    fail_patterns: list[Regex] | None = None
    ignore_patterns: list[Regex] | None = None


Fraction = Annotated[float, expects("a number", int, float), Field(ge=0, allow_inf_nan=False)]


class JudgeTable(FileSchema):
    prompts: Annotated[str, Field(min_length=1)] | None = None
    count: Annotated[int, Field(ge=MIN_JUDGE_PROMPTS)] | None = None
    max_new_tokens: Annotated[int, Field(ge=MIN_SMOKE_TOKENS, le=MAX_SMOKE_TOKENS)] | None = None
    top_k: Annotated[int, Field(ge=1, le=20)] | None = None
    hosts: Literal["canary", "all"] | None = None
    alpha: Annotated[Fraction, Field(gt=0, lt=0.5)] | None = None
    accept_drop: Annotated[Fraction, Field(gt=0, lt=1)] | None = None
    latency_rise: Annotated[Fraction, Field(gt=0)] | None = None
    latency_floor_ms: Fraction | None = None
    max_diverged: Annotated[Fraction, Field(le=1)] | None = None
    tie_margin: Fraction | None = None
    max_untied: Annotated[int, Field(ge=0)] | None = None
    warmup: Annotated[int, Field(ge=0, le=MAX_JUDGE_WARMUP)] | None = None
    repeats: Annotated[int, Field(ge=1, le=MAX_JUDGE_REPEATS)] | None = None
    timeout: Seconds | None = None


class PlaybookFile(FileSchema):
    """A playbook file as written (see the module docstring for each key)."""

    name: Annotated[str, AfterValidator(_usable_name)] | None = None
    description: str | None = None
    canary: Canary | None = None
    batch: Batch | None = None
    max_in_flight: MaxInFlight | None = None
    max_failures: Positive | None = None
    on_halt: Literal["stop", "rollback-run"] | None = None
    restart: Literal["always", "never"] | None = None
    timeouts: TimeoutsTable | None = None
    smoke: SmokeTable | None = None
    log: LogTable | None = None
    rotation: RotationTable | None = None
    team: TeamTable | None = None
    judge: JudgeTable | None = None


# ---------------------------------------------------------------------------------------------
# loading


def parse_playbook(text: str, path: str) -> Playbook:
    """Parse and check a playbook's TOML text; `path` names it in errors and gives its name.

    Raises:
        SpecError: malformed TOML, an unknown key, a value of the wrong type or range, an invalid
            regular expression, or a `name` that differs from the file name; the error names the
            file, the line and the field.
    """
    return to_playbook(parse_toml(text, path))


def load_playbook(path: Path) -> Playbook:
    """Read and check a playbook file (by name: `Workspace.load_playbook`).

    Raises:
        SpecError: the file cannot be read or is not a valid playbook (file:line, field).
    """
    return to_playbook(read_toml(path))


def to_playbook(document: TomlDocument) -> Playbook:
    """The one conversion of a playbook file into the core's model.

    Raises:
        SpecError: as `parse_playbook`.
    """
    try:
        written = PlaybookFile.model_validate(document.data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc, document, schema=PlaybookFile, data=document.data
        ) from None
    defaults = Playbook()
    stem = Path(document.path).stem if document.path.endswith(".toml") else None
    name = written.name or stem or defaults.name
    if stem is not None and name != stem:
        raise document.error(
            ("name",),
            f"name {name!r} differs from the file name {stem!r}",
            hint=f"a playbook is chosen by its file name; rename the file or set name = {stem!r}",
        )
    return Playbook(
        name=name,
        description=written.description or "",
        canary=_canary(written.canary, defaults.canary),
        batch=_batch(written.batch, defaults.batch),
        max_in_flight=defaults.max_in_flight
        if written.max_in_flight is None
        else (None if isinstance(written.max_in_flight, str) else written.max_in_flight),
        max_failures=written.max_failures or defaults.max_failures,
        on_halt=HaltAction(written.on_halt or defaults.on_halt),
        restart=RestartPolicy(written.restart or defaults.restart),
        timeouts=_timeouts(written.timeouts),
        smoke=_smoke(written.smoke),
        log=_log(written.log),
        rotation=_rotation(written.rotation),
        team=_team(written.team, document),
        judge=None if written.judge is None else _judge(written.judge, document),
        source=document.path,
    )


def _canary(
    written: int | list[str] | None, default: int | tuple[str, ...]
) -> int | tuple[str, ...]:
    if written is None:
        return default
    if isinstance(written, list):
        return tuple(written) if written else 0  # `canary = []` names no canary, like 0
    return written


def _batch(written: int | str | None, default: BatchSize) -> BatchSize:
    if written is None:
        return default
    if isinstance(written, int):
        return BatchSize(count=written)
    percent = _percent(written)
    assert percent is not None  # checked by the schema
    return BatchSize(percent=percent)


def _rotation(written: RotationTable | None) -> RotationSettings:
    defaults = RotationSettings()
    if written is None:
        return defaults
    return RotationSettings(
        max_unavailable=_batch(written.max_unavailable, defaults.max_unavailable),
        fleet_down=defaults.fleet_down if written.fleet_down is None else written.fleet_down,
    )


def _team(written: TeamTable | None, document: TomlDocument) -> TeamSettings:
    """The [team] table; `allowed_signers` resolved against the playbook's own folder."""
    defaults = TeamSettings()
    if written is None:
        return defaults
    if written.require_approval and written.allowed_signers is None:
        raise document.error(
            ("team", "require_approval"),
            "require_approval = true needs allowed_signers, the file the signatures are "
            "verified against",
            hint='add allowed_signers = "allowed_signers" (OpenSSH format, relative to this file)',
        )
    signers = None
    if written.allowed_signers is not None:
        signers = str(Path(document.path).resolve().parent / written.allowed_signers)
    return TeamSettings(
        lease_expiry=defaults.lease_expiry
        if written.lease_expiry is None
        else float(written.lease_expiry),
        require_approval=bool(written.require_approval),
        allowed_signers=signers,
    )


def _timeouts(written: TimeoutsTable | None) -> StepTimeouts:
    defaults = StepTimeouts()
    if written is None:
        return defaults
    chosen = {step: getattr(written, step) for step in TIMEOUT_STEPS}
    return StepTimeouts(
        **{step: getattr(defaults, step) if v is None else float(v) for step, v in chosen.items()}
    )


def _log(written: LogTable | None) -> LogSettings:
    defaults = LogSettings()
    if written is None:
        return defaults
    return LogSettings(
        fail_patterns=defaults.fail_patterns
        if written.fail_patterns is None
        else tuple(written.fail_patterns),
        ignore_patterns=defaults.ignore_patterns
        if written.ignore_patterns is None
        else tuple(written.ignore_patterns),
    )


def _smoke(written: SmokeTable | None) -> SmokeSettings:
    defaults = SmokeSettings()
    if written is None:
        return defaults
    prompts = defaults.prompts
    if written.prompts is not None:
        prompts = tuple(
            SmokePrompt(p) if isinstance(p, str) else SmokePrompt(p.text, p.expect)
            for p in written.prompts
        )
    return SmokeSettings(
        prompts=prompts,
        max_new_tokens=defaults.max_new_tokens
        if written.max_new_tokens is None
        else written.max_new_tokens,
        baseline=defaults.baseline if written.baseline is None else written.baseline,
        require_spec_verify=defaults.require_spec_verify
        if written.require_spec_verify is None
        else written.require_spec_verify,
    )


def _judge(written: JudgeTable, document: TomlDocument) -> JudgeSettings:
    """The [judge] table; its prompt file read now (relative to the playbook's own folder), so
    a missing file or too few prompts is an error at its line before any host is touched."""
    defaults = JudgeSettings()
    prompts, source = defaults.prompts, defaults.prompt_source
    if written.prompts is not None:
        path = Path(document.path).resolve().parent / written.prompts
        prompts, source = _prompt_file(path, document), str(path)
    count = written.count if written.count is not None else min(defaults.count, len(prompts))
    if count > len(prompts) or count < MIN_JUDGE_PROMPTS:
        at = ("judge", "count") if written.count is not None else ("judge", "prompts")
        raise document.error(
            at,
            f"the judge decodes {count} prompts but {source} has {len(prompts)}"
            if count > len(prompts)
            else f"{source} has {len(prompts)} prompts; the judge needs at least "
            f"{MIN_JUDGE_PROMPTS} to tell a change from noise",
            hint=f"add prompts to the file, or set count to at most {len(prompts)}",
        )
    alpha = float(written.alpha) if written.alpha is not None else defaults.alpha
    if count < (needed := fewest_pairs(alpha)):
        raise document.error(
            ("judge", "alpha") if written.alpha is not None else ("judge", "count"),
            f"the judge decodes {count} prompts; at alpha {alpha:g} no change is significant "
            f"on fewer than {needed}",
            hint=f"set count to at least {needed}, or a larger alpha",
        )
    chosen = {key: getattr(written, key) for key in JUDGE_NUMBERS}
    return JudgeSettings(
        prompts=prompts,
        prompt_source=source,
        count=count,
        hosts=JudgeHosts(written.hosts or defaults.hosts),
        **{key: _as_default(getattr(defaults, key), value) for key, value in chosen.items()},
    )


JUDGE_NUMBERS = (
    "max_new_tokens",
    "top_k",
    "alpha",
    "accept_drop",
    "latency_rise",
    "latency_floor_ms",
    "max_diverged",
    "tie_margin",
    "max_untied",
    "warmup",
    "repeats",
    "timeout",
)
"""The [judge] keys taken as written, or the default when absent."""


def _as_default(default: Any, written: Any) -> Any:
    """A number as written, of the default's type (`timeout = 600` is 600.0); the default when
    absent."""
    if written is None:
        return default
    return float(written) if isinstance(default, float) else written


def _prompt_file(path: Path, document: TomlDocument) -> tuple[str, ...]:
    """The prompts of a judge's prompt file: one a line, blank and `#` lines skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise document.error(
            ("judge", "prompts"),
            f"cannot read the judge's prompt file {path}: {getattr(exc, 'strerror', None) or exc}",
            hint="the path is relative to the playbook; one prompt a line",
        ) from None
    lines = (line.rstrip("\r\n") for line in text.splitlines())
    return tuple(line for line in lines if line.strip() and not line.lstrip().startswith("#"))
