#!/usr/bin/env bash
# The test command (README): lint, types, the import layering, then the whole suite.
# `--fast`, the inner loop: ruff, the import layering and the fast tier only (the tests marked
# pure or scripted, which start no process; mypy is left to the whole run, ~15 s even warm).
# Other arguments go to pytest. The tiers: docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tools this runs come with the dev extra (the demo installs only the sandbox's): installed
# into the first python3 on PATH when one is missing, as scripts/demo.sh installs opspatch.
if ! python3 -c 'import sys, importlib.util as u; sys.exit(any(u.find_spec(m) is None for m in
        ("opspatch", "torch", "pytest", "pytest_timeout", "hypothesis", "mypy", "ruff",
         "importlinter", "psycopg", "supervisor", "xdist")))' 2>/dev/null; then
    echo "installing the test tools into $(command -v python3): python3 -m pip install torch==2.13.0 -e '.[sandbox,dev]'" >&2
    python3 -m pip install --quiet --disable-pip-version-check torch==2.13.0 -e '.[sandbox,dev]'
fi

# The SGLang wheels the tests read as data, fetched here and not by the tests (a fast-tier test
# that started pip would break its tier); already cached: nothing is fetched. Offline, the tests
# that read them skip, naming this step (tests/sglang_wheels.py).
python3 -m tests.sglang_wheels

if [ "${1:-}" = "--fast" ]; then
    shift
    python3 -m ruff check opspatch tests bench
    lint-imports --no-cache  # the layering contract in .importlinter
    exec python3 -m pytest -q -m "(pure or scripted) and not slow and not network" "$@"
fi
python3 -m ruff check opspatch tests bench
python3 -m mypy
lint-imports --no-cache  # the layering contract in .importlinter
# Two workers (OPSPATCH_TEST_WORKERS; 0: this process), each file's tests on one, the real-engine,
# podman and root tests one at a time (tests/tiers.py: SERIAL); then the tests that judge latencies
# (`alone`) with nothing beside them. The slowest named at the end of each, so that CI's log shows
# where its minutes went. Exit 5 (nothing selected, e.g. one file named) is not a failure.
status=0
python3 -m pytest -q --durations=25 -n "${OPSPATCH_TEST_WORKERS:-2}" --dist loadgroup \
    -m "not alone" "$@" || { code=$?; [ "$code" -eq 5 ] || status=$code; }
python3 -m pytest -q --durations=10 -m alone "$@" || { code=$?; [ "$code" -eq 5 ] || status=$code; }
exit "$status"
