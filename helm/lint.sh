#!/usr/bin/env bash
# Lints and renders the gangway chart (helm/gangway) with Helm's own code: installs helm-sdkpy
# (Helm built as a library, with Python bindings) and PyYAML with pip when they are missing,
# then runs helm/lint.py. Arguments go to lint.py (e.g. --show default).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import helm_sdkpy, yaml' >/dev/null 2>&1; then
  pip_install() {
    # helm-sdkpy declares Python >= 3.12 but runs on 3.11 as well.
    PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check \
      --ignore-requires-python "$@" 'helm-sdkpy==0.1.32' 'PyYAML>=6'
  }
  # An externally managed Python (PEP 668) takes the packages into the user's site instead.
  pip_install || pip_install --user --break-system-packages
fi
exec "$PY" helm/lint.py "$@"
