#!/usr/bin/env bash
# The test command (README): lint, types, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check opspatch tests bench
python3 -m mypy
python3 -m pytest -q "$@"
