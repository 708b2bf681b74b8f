#!/usr/bin/env bash
# Set up a virtual environment and run the demo or the tests.
#   ./dev.sh demo    install (with matplotlib), then train an MLP on the diabetes data
#   ./dev.sh test    install with the test extras, then lint and run the tests
#   ./dev.sh docs    install with the test extras, then build docs/_build/html (warnings fail)
# PYTHON selects the interpreter (3.10 to 3.12), VENV the environment folder.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

setup() {
    local extras="$1"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e ".${extras}"
}

case "${1:-}" in
    demo)
        setup "[plot]"
        shift
        exec "$VENV/bin/python" -m onnxgrad_sklearn.demo "$@"
        ;;
    test)
        setup "[test]"
        shift
        "$VENV/bin/python" -m ruff check onnxgrad_sklearn tests benchmarks
        "$VENV/bin/python" -m ruff format --check onnxgrad_sklearn tests benchmarks
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    docs)
        setup "[test]"
        exec "$VENV/bin/python" -m sphinx -W --keep-going -b html docs docs/_build/html
        ;;
    *)
        echo "usage: ./dev.sh demo|test|docs [args]" >&2
        exit 2
        ;;
esac
