"""Run a function in a forked child of a clean server process, to survive aborts."""

import multiprocessing
import traceback

_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["onnxgrad_sklearn", "_isolated"])
    return _CONTEXT


def _child(queue, fn, args):
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # reported to the parent, type and message
        queue.put(("raised", (type(exc).__name__, str(exc), traceback.format_exc())))


def run_isolated(fn, *args, timeout=120):
    """Return ``(exitcode, status, payload)`` of ``fn(*args)`` run in a child process.

    A negative exit code means the child was killed by a signal (an abort).
    """
    ctx = _context()
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, fn, args))
    proc.start()
    try:
        status, payload = queue.get(timeout=timeout)
    except Exception:
        status, payload = "no result", None
    proc.join(timeout)
    return proc.exitcode, status, payload
