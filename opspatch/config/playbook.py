"""Playbooks: the rollout policy and the verification procedure, as a typed model (pure).

A playbook file `playbooks/<name>.toml` says how a patch reaches a fleet and how each host is
proven healthy afterwards. Every key is optional; a missing key takes the value shown here (the
same values `playbooks/default.toml` writes out).

```toml
name = "default"          # must match the file name (a playbook is referred to by file name)
description = "..."
canary = 1                # hosts patched first, alone: a count (0 = none) or a list of names
batch = "25%"             # then batches: a host count, or a percentage of all selected hosts
                          # (rounded up, at least one host), or "all"
max_in_flight = 8         # most hosts worked on at once inside a batch; "all" = the whole batch
max_failures = 1          # failed hosts that halt the rollout (1 = halt on the first failure)
on_halt = "stop"          # "stop": leave patched hosts patched; "rollback-run": roll back every
                          # host this run changed

[timeouts]                # seconds per step, per host
lock = 30                 # take the host's lock
inspect = 120             # facts, resolve the module, read the file, baseline decode
swap = 60                 # backup, validate on the host, atomic swap, bytecode purge
restart = 180             # the restart command itself
ready = 1200              # until /health answers (real models load for minutes)
smoke = 180               # all smoke prompts together, plus the log scan
restore = 120             # put the pre-image back (its restart uses `restart` above)
restore_ready = 1800      # until /health answers after a restore: its own deadline, long, so a
                          # `ready` shortened to catch a start-up hang never turns a slow but
                          # healthy restore into needs-attention

[smoke]
prompts = ["The capital of France is", { text = "def square(x):", expect = "return" }]
max_new_tokens = 16       # at least 8, so the speculative draft/verify path really runs
baseline = false          # compare with a greedy decode taken on the unpatched server before the
                          # swap, when the patch declares it preserves output. Off by default:
                          # on a host hit by the bug being fixed, that decode is what crashes it.
                          # Best effort when on: a failed pre-patch decode gives no baseline
                          # (the smoke says so); that alone never fails a host
require_spec_verify = true  # a host running speculative decoding must report spec_verify_ct > 0

[log]                     # regular expressions; a match in the log written since the restart
fail_patterns = ['Scheduler hit an exception', 'Traceback \\(most recent call last\\)']
```

`expect` is a Python regular expression searched for (`re.search`) in the generated text, so a
plain word matches as a substring; escape `.`, `(` and friends to match them literally. Both
`expect` and `fail_patterns` are compiled when the playbook is loaded, so a bad expression is an
error at `file:line` before anything is touched.

The fleet policy is pure too: `plan_rollout(playbook, hosts)` turns a host selection into
batches (canaries first), and `Playbook.halt_reason(outcomes, canaries=...)` says whether the
rollout must stop. Errors in files are `SpecError`s naming the file, the line and the field.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from opspatch.core.policy import (
    MAX_SMOKE_TOKENS,
    MIN_SMOKE_TOKENS,
    ON_HALT_CHOICES,
    TIMEOUT_STEPS,
    BatchSize,
    LogSettings,
    Playbook,
    SmokePrompt,
    SmokeSettings,
    StepTimeouts,
)
from opspatch.core.tomlsource import FieldPath, TomlDocument, parse_toml, read_toml
from opspatch.errors import InputError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


# ---------------------------------------------------------------------------------------------
# loading


def parse_playbook(text: str, path: str) -> Playbook:
    """Parse and check a playbook's TOML text; `path` names it in errors and gives its name.

    Raises:
        SpecError: malformed TOML, an unknown key, a value of the wrong type or range, an invalid
            regular expression, or a `name` that differs from the file name; the error names the
            file, the line and the field.
    """
    return _build(parse_toml(text, path))


def load_playbook(name_or_path: str | Path, search_dirs: Sequence[Path]) -> Playbook:
    """Load a playbook by name (first `<dir>/<name>.toml` in `search_dirs`) or by path.

    A `Path`, or a string ending in `.toml` or containing a path separator, is a path; anything
    else is a name.

    Raises:
        InputError: no playbook of that name in `search_dirs` (near names are suggested).
        SpecError: the file cannot be read or is not a valid playbook (file:line, field).
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text:
        return _build(read_toml(Path(name_or_path).expanduser()))
    for directory in search_dirs:
        candidate = directory / f"{text}.toml"
        if candidate.is_file():
            return _build(read_toml(candidate))
    available = sorted(list_playbooks(search_dirs))
    near = difflib.get_close_matches(text, available, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(near)}?" if near else None
    if hint is None:
        hint = f"available: {', '.join(available)}" if available else "no playbooks found"
    searched = ", ".join(str(d) for d in search_dirs) or "nowhere (no search directories)"
    raise InputError(f"no playbook named {text!r} (looked in {searched})", hint=hint)


def list_playbooks(search_dirs: Sequence[Path]) -> dict[str, Path]:
    """Every playbook name found in `search_dirs`, with its file (earlier directories win)."""
    found: dict[str, Path] = {}
    for directory in search_dirs:
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


# ---------------------------------------------------------------------------------------------
# checking values; every problem is reported at the key's line


_TOP_KEYS = (
    "name",
    "description",
    "canary",
    "batch",
    "max_in_flight",
    "max_failures",
    "on_halt",
    "timeouts",
    "smoke",
    "log",
)
_SMOKE_KEYS = ("prompts", "max_new_tokens", "baseline", "require_spec_verify")
_PROMPT_KEYS = ("text", "expect")
_LOG_KEYS = ("fail_patterns",)


def _build(doc: TomlDocument) -> Playbook:
    data = doc.data
    _check_keys(doc, (), data, _TOP_KEYS)
    defaults = Playbook()
    stem = Path(doc.path).stem if doc.path.endswith(".toml") else None

    name = _string(doc, ("name",), data.get("name", stem or defaults.name))
    if not _NAME_RE.match(name):
        raise doc.error(
            ("name",), f"{name!r} is not a usable playbook name", hint="use a-z, 0-9, -"
        )
    if stem is not None and name != stem:
        raise doc.error(
            ("name",),
            f"name {name!r} differs from the file name {stem!r}",
            hint=f"a playbook is chosen by its file name; rename the file or set name = {stem!r}",
        )
    on_halt = _string(doc, ("on_halt",), data.get("on_halt", defaults.on_halt))
    if on_halt not in ON_HALT_CHOICES:
        raise doc.error(
            ("on_halt",),
            f"must be one of {', '.join(repr(c) for c in ON_HALT_CHOICES)}, got {on_halt!r}",
            hint=_did_you_mean(on_halt, ON_HALT_CHOICES),
        )
    return Playbook(
        name=name,
        description=_string(doc, ("description",), data.get("description", "")),
        canary=_canary(doc, data.get("canary", defaults.canary)),
        batch=_batch(doc, data.get("batch", defaults.batch.to_json())),
        max_in_flight=_max_in_flight(doc, data.get("max_in_flight", defaults.max_in_flight)),
        max_failures=_count(
            doc, ("max_failures",), data.get("max_failures", defaults.max_failures), minimum=1
        ),
        on_halt=on_halt,
        timeouts=_timeouts(doc, data.get("timeouts", {})),
        smoke=_smoke(doc, data.get("smoke", {})),
        log=_log(doc, data.get("log", {})),
        source=doc.path,
    )


def _check_keys(
    doc: TomlDocument, where: FieldPath, table: Mapping[str, Any], known: Sequence[str]
) -> None:
    for key in table:
        if key not in known:
            raise doc.error(
                (*where, key),
                f"unknown key {key!r}",
                hint=_did_you_mean(key, known) or f"known keys here: {', '.join(known)}",
            )


def _did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    near = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(n) for n in near)}?" if near else None


def _table(doc: TomlDocument, where: FieldPath, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise doc.error(where, f"must be a table, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), "a " + type(value).__name__
    )
    return f"{kind} ({value!r})" if not isinstance(value, (dict, list)) else kind


def _string(doc: TomlDocument, where: FieldPath, value: Any) -> str:
    if not isinstance(value, str):
        raise doc.error(where, f"must be a string, got {_shown(value)}")
    return value


def _boolean(doc: TomlDocument, where: FieldPath, value: Any) -> bool:
    if not isinstance(value, bool):
        raise doc.error(where, f"must be true or false, got {_shown(value)}")
    return value


def _count(
    doc: TomlDocument, where: FieldPath, value: Any, *, minimum: int, maximum: int | None = None
) -> int:
    # bool is an int in Python; `canary = true` must not quietly mean one canary.
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(where, f"must be a whole number, got {_shown(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" + (f" and at most {maximum}" if maximum is not None else "")
        raise doc.error(where, f"must be {bound}, got {value}")
    return value


def _canary(doc: TomlDocument, value: Any) -> int | tuple[str, ...]:
    where: FieldPath = ("canary",)
    if isinstance(value, list):
        if not value:
            return 0  # `canary = []` names no canary, like `canary = 0`
        names = tuple(_string(doc, (*where, i), v) for i, v in enumerate(value))
        if any(not n.strip() for n in names):
            raise doc.error(where, "host names must not be empty")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise doc.error(where, f"lists {', '.join(repeated)} more than once")
        return names
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(
            where, f"must be a number of hosts or a list of host names, got {_shown(value)}"
        )
    return _count(doc, where, value, minimum=0)


def _batch(doc: TomlDocument, value: Any) -> BatchSize:
    where: FieldPath = ("batch",)
    if isinstance(value, str):
        if value.strip().lower() == "all":
            return BatchSize(percent=Decimal(100))
        match = _PERCENT_RE.match(value)
        percent = None
        if match:
            try:
                percent = Decimal(match.group(1))
            except InvalidOperation:  # pragma: no cover - the regex admits only decimals
                percent = None
        if percent is None or not Decimal(0) < percent <= Decimal(100):
            raise doc.error(
                where,
                f"must be a host count, a percentage above 0% and at most 100%, or 'all'; "
                f"got {value!r}",
                hint='for example batch = 4 or batch = "25%"',
            )
        return BatchSize(percent=percent)
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(
            where, f"must be a host count, a percentage string or 'all', got {_shown(value)}"
        )
    return BatchSize(count=_count(doc, where, value, minimum=1))


def _max_in_flight(doc: TomlDocument, value: Any) -> int | None:
    where: FieldPath = ("max_in_flight",)
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, str):
        raise doc.error(where, f"must be a number of hosts or 'all', got {value!r}")
    return _count(doc, where, value, minimum=1)


def _seconds(doc: TomlDocument, where: FieldPath, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise doc.error(where, f"must be a number of seconds, got {_shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise doc.error(where, f"must be more than 0 seconds, got {value}")
    return float(value)


def _timeouts(doc: TomlDocument, value: Any) -> StepTimeouts:
    where: FieldPath = ("timeouts",)
    table = _table(doc, where, value)
    _check_keys(doc, where, table, TIMEOUT_STEPS)
    defaults = StepTimeouts()
    return StepTimeouts(
        **{
            step: _seconds(doc, (*where, step), table[step])
            if step in table
            else getattr(defaults, step)
            for step in TIMEOUT_STEPS
        }
    )


def _regex(doc: TomlDocument, where: FieldPath, value: Any) -> str:
    pattern = _string(doc, where, value)
    if not pattern:
        raise doc.error(where, "an empty regular expression matches everything")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise doc.error(
            where,
            f"is not a valid regular expression: {exc.msg} at position {exc.pos}",
            hint="TOML literal strings ('...') keep backslashes as written",
        ) from None
    return pattern


def _prompt(doc: TomlDocument, where: FieldPath, value: Any) -> SmokePrompt:
    if isinstance(value, str):
        text, expect = value, None
    elif isinstance(value, dict):
        _check_keys(doc, where, value, _PROMPT_KEYS)
        if "text" not in value:
            raise doc.error(where, "a prompt table needs `text`")
        text = _string(doc, (*where, "text"), value["text"])
        expect = _regex(doc, (*where, "expect"), value["expect"]) if "expect" in value else None
    else:
        raise doc.error(
            where, f"must be a prompt string or a table {{ text, expect }}, got {_shown(value)}"
        )
    if not text.strip():
        raise doc.error(where, "a smoke prompt must not be empty")
    return SmokePrompt(text, expect)


def _smoke(doc: TomlDocument, value: Any) -> SmokeSettings:
    where: FieldPath = ("smoke",)
    table = _table(doc, where, value)
    _check_keys(doc, where, table, _SMOKE_KEYS)
    defaults = SmokeSettings()
    prompts = defaults.prompts
    if "prompts" in table:
        raw = table["prompts"]
        if not isinstance(raw, list) or not raw:
            raise doc.error((*where, "prompts"), "must be a non-empty list of prompts")
        prompts = tuple(_prompt(doc, (*where, "prompts", i), p) for i, p in enumerate(raw))
    return SmokeSettings(
        prompts=prompts,
        max_new_tokens=_count(
            doc,
            (*where, "max_new_tokens"),
            table.get("max_new_tokens", defaults.max_new_tokens),
            minimum=MIN_SMOKE_TOKENS,
            maximum=MAX_SMOKE_TOKENS,
        ),
        baseline=_boolean(doc, (*where, "baseline"), table.get("baseline", defaults.baseline)),
        require_spec_verify=_boolean(
            doc,
            (*where, "require_spec_verify"),
            table.get("require_spec_verify", defaults.require_spec_verify),
        ),
    )


def _log(doc: TomlDocument, value: Any) -> LogSettings:
    where: FieldPath = ("log",)
    table = _table(doc, where, value)
    _check_keys(doc, where, table, _LOG_KEYS)
    if "fail_patterns" not in table:
        return LogSettings()
    raw = table["fail_patterns"]
    if not isinstance(raw, list):
        raise doc.error((*where, "fail_patterns"), f"must be a list, got {_shown(raw)}")
    return LogSettings(
        tuple(_regex(doc, (*where, "fail_patterns", i), p) for i, p in enumerate(raw))
    )
