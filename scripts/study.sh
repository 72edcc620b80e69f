#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default study on the bundled corpus; prints the report path last.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m lm_ablate.study "$@"
