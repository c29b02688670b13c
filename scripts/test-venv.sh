#!/usr/bin/env bash
# The Python of the server tests: a venv made from Debian's python3 (so that it sees the
# Debian packages python3-selenium), with the official `openai` client pinned from PyPI.
# Idempotent; prints the venv's python on stdout.
set -euo pipefail
OPENAI_VERSION=2.8.0
venv="${KVLAB_CACHE:-$HOME/.cache/kvlab}/test-venv"
py=/usr/bin/python3
[ -x "$py" ] || { echo "[test-venv] $py is missing: install Debian's python3 (scripts/deps.sh --tests)" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ] || [ "$("$venv/bin/python" -c 'import sys; print(sys.base_prefix)')" != "/usr" ]; then
  rm -rf "$venv"
  echo "[test-venv] creating $venv" >&2
  "$py" -m venv --system-site-packages "$venv" >&2
fi
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "[test-venv] pip install openai==$OPENAI_VERSION" >&2
  PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" >&2
fi
"$venv/bin/python" -c "import selenium" 2>/dev/null || { echo "[test-venv] selenium missing (python3-selenium)" >&2; exit 1; }
echo "$venv/bin/python"
