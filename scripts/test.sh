#!/usr/bin/env bash
# The test command (README): lint, types, the import layering, then the whole suite.
# `--fast`, the inner loop: ruff, the import layering and the fast tier only (the tests marked
# pure or scripted, which start no process; mypy is left to the whole run, ~15 s even warm).
# Other arguments go to pytest. The tiers: docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
    shift
    python3 -m ruff check opspatch tests bench
    lint-imports --no-cache  # the layering contract in .importlinter
    exec python3 -m pytest -q -m "(pure or scripted) and not slow and not network" "$@"
fi
python3 -m ruff check opspatch tests bench
python3 -m mypy
lint-imports --no-cache  # the layering contract in .importlinter
python3 -m pytest -q "$@"
