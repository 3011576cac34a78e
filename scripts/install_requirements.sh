#!/usr/bin/env bash
# Install a requirements file into the project's virtualenv, quietly: one line says what is being
# installed, pip's whole output goes to a log file, and only a failure prints it (its tail, less
# the machine's pip-config warnings that fill most of it) and exits non-zero.
# With PROJECT_DIR, the project there is then installed editable without dependencies (they are
# the requirements file's pins): the `trainhub` command-line client's console script.
set -euo pipefail

usage="usage: install_requirements.sh VENV_PYTHON REQUIREMENTS_FILE LOG_FILE [PROJECT_DIR]"
python="${1:?$usage}"
requirements="${2:?$usage}"
log="${3:?$usage}"
project="${4:-}"

fail() {
    echo "pip: $1 failed; the end of its output (in full: $log):" >&2
    # A find-links / extra-index folder that lacks a package warns once per package: noise here.
    grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -n 60 >&2
    exit 1
}

echo "pip: installing $requirements into $(dirname "$(dirname "$python")") (minutes on first use; log: $log)"
if ! "$python" -m pip install --disable-pip-version-check --no-input -r "$requirements" \
    >"$log" 2>&1; then
    fail "installing $requirements"
fi
if [[ -n "$project" ]]; then
    echo "pip: installing $project editable (the trainhub command)"
    if ! "$python" -m pip install --disable-pip-version-check --no-input --no-deps -e "$project" \
        >>"$log" 2>&1; then
        fail "installing $project editable"
    fi
    # setuptools leaves its build metadata in the checkout; the install keeps its own copy.
    rm -rf "$project"/*.egg-info
fi
