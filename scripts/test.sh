#!/usr/bin/env bash
# The test command (README): lint, types, the import layering, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check opspatch tests bench
python3 -m mypy
lint-imports --no-cache  # the layering contract in .importlinter
python3 -m pytest -q "$@"
