#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -n 2 -q "$@"
