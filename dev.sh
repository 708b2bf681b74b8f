#!/usr/bin/env bash
# Set up a virtual environment and run the demo or the tests.
#   ./dev.sh demo    install (with matplotlib), then train an MLP on the diabetes data
#   ./dev.sh test    install with the test extras, lint and run the tests on PYTHON (.venv,
#                    both backends), then the standard-backend suite on Python 3.13 with
#                    plain onnxruntime (.venv313; SKIP313=1 skips it); the tests marked
#                    slow (subprocesses, the docs build, the benchmark scripts) are left out
#   ./dev.sh test-all  the same with the slow tests (what CI runs)
#   ./dev.sh docs    install with the test extras, then build docs/_build/html (warnings fail)
# PYTHON selects the interpreter (3.10 to 3.12 for the training build), VENV the folder;
# PYTHON313 the second interpreter (default: pyenv's 3.13.0), VENV313 its folder.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
VENV313="${VENV313:-.venv313}"
# Tests run again on 3.13: the ones that train (heavy ones - docs, notebooks, benchmark,
# CLI - run once, on PYTHON).
TESTS313="tests/test_backends.py tests/test_golden_gradients.py tests/test_gradients.py
 tests/test_trajectory.py tests/test_engine.py tests/test_ortgrad.py tests/test_training_graph.py
 tests/test_regressor.py tests/test_classifier.py tests/test_reliability.py
 tests/test_callbacks.py tests/test_library_callbacks.py tests/test_artifacts.py
 tests/test_sklearn_parity.py
 tests/test_cold_import.py tests/test_shared_sessions.py tests/test_fit.py tests/test_data.py
 tests/test_optim.py tests/test_config.py tests/test_checkpoint_files.py
 tests/test_onnx_template.py tests/test_training_mode.py"

setup() {
    local venv="$1" python="$2" extras="$3"
    if [ ! -x "$venv/bin/python" ]; then
        $python -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".${extras}"
}

python313() {
    if [ -n "${PYTHON313:-}" ]; then
        echo "$PYTHON313"
    else
        echo "env PYENV_VERSION=3.13.0 python3.13"
    fi
}

case "${1:-}" in
    demo)
        setup "$VENV" "$PYTHON" "[plot]"
        shift
        exec "$VENV/bin/python" -m onnxgrad_sklearn.demo "$@"
        ;;
    test|test-all)
        # ./dev.sh test leaves the tests marked slow out (pyproject.toml's markers)
        select=(-m "not slow")
        if [ "$1" = "test-all" ]; then
            select=()
        fi
        setup "$VENV" "$PYTHON" "[test]"
        shift
        "$VENV/bin/python" -m ruff check onnxgrad_sklearn tests benchmarks examples
        "$VENV/bin/python" -m ruff format --check onnxgrad_sklearn tests benchmarks examples
        "$VENV/bin/lint-imports" --no-cache   # the layers in pyproject.toml
        "$VENV/bin/python" -m pytest ${select[@]+"${select[@]}"} "$@"
        if [ "${SKIP313:-0}" != "1" ] && ! $(python313) --version >/dev/null 2>&1; then
            # CI has it (pyenv's 3.13.0); elsewhere the second suite needs it installed
            if [ "${CI:-}" = "true" ]; then
                echo "Python 3.13 not found ($(python313)): set PYTHON313" >&2
                exit 1
            fi
            echo "== Python 3.13 not found ($(python313)): the standard-backend suite on" \
                "plain onnxruntime is skipped (set PYTHON313 to run it) =="
            SKIP313=1
        fi
        if [ "${SKIP313:-0}" != "1" ]; then
            echo "== Python 3.13, plain onnxruntime (standard backend) =="
            setup "$VENV313" "$(python313)" "[test313]"
            # shellcheck disable=SC2086
            "$VENV313/bin/python" -m pytest $TESTS313 ${select[@]+"${select[@]}"} "$@"
        fi
        ;;
    docs)
        setup "$VENV" "$PYTHON" "[test]"
        exec "$VENV/bin/python" -m sphinx -W --keep-going -b html docs docs/_build/html
        ;;
    *)
        echo "usage: ./dev.sh demo|test|test-all|docs [args]" >&2
        exit 2
        ;;
esac
