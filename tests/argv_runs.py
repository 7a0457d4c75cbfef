"""Several command lines of one program in a single Python process: what each printed and its exit status.

Each start of a process that imports the toolkit pays the imports again (torch and transformers alone take seconds of
CPU). Checks of what a command line answers (an argument refused in one line, a help text) do not need a process of
their own each: :func:`run_argvs` starts one process that calls the program once per command line, its stdout and
stderr captured apart for each, and ``SystemExit`` (argparse's ``exit 2``, ``sys.exit("error: ...")``) read as the
status the process would have exited with. A check about the process itself (its environment, how the shell passes
bytes) still starts its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The child: reads ``[[target, argv], ...]`` on stdin, writes ``[[status, stdout, stderr], ...]`` as JSON on the
#: real stdout. ``target`` is ``module:function`` (called with the argv list, returning the status), a script's path
#: (run as ``__main__`` with ``sys.argv`` set, as ``python script.py ...`` runs it) or ``-c`` (``argv[0]`` is the
#: program's text, run in a namespace of its own as ``python -c`` runs it).
_CHILD = r"""
import contextlib, importlib, io, json, os, runpy, sys, traceback

def status_of(exc):
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # sys.exit("message"): the interpreter prints it and exits 1
    return 1

results = []
for target, argv in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if target == "-c":  # a program's text, as `python -c CODE` runs it: a fresh __main__ namespace
                sys.argv = ["-c"]
                exec(compile(argv[0], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
                status = 0
            elif target.endswith(".py"):
                sys.argv = [target, *argv]
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python script.py` puts it first
                try:
                    runpy.run_path(target, run_name="__main__")
                finally:
                    del sys.path[0]
                status = 0
            else:
                module, name = target.split(":")
                status = int(getattr(importlib.import_module(module), name)(argv) or 0)
        except SystemExit as exc:
            status = status_of(exc)
        except BaseException:
            traceback.print_exc()  # as the interpreter would, so that "Traceback" shows in stderr
            status = 1
    results.append([status, out.getvalue(), err.getvalue()])
sys.__stdout__.write("\n" + MARK + json.dumps(results))  # after anything a library wrote to the descriptor itself
"""

#: What precedes the results on the child's stdout.
MARK = "argv_runs results: "


@dataclass(frozen=True)
class Outcome:
    """What one command line did: exit status, stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str


def run_argvs(target: str | Path, argvs: list[list[str]], *, cwd: Path, env: dict[str, str], timeout: float = 600) -> list[Outcome]:
    """Run each argv of ``argvs`` through ``target`` (``"module:function"`` or a script's path) in one new process with
    ``env`` and ``cwd``; one :class:`Outcome` per argv, in order."""
    return run_commands([(target, argv) for argv in argvs], cwd=cwd, env=env, timeout=timeout)


def run_commands(runs: list[tuple[str | Path, list[str]]], *, cwd: Path, env: dict[str, str], timeout: float = 600) -> list[Outcome]:
    """:func:`run_argvs` for command lines of several programs: ``runs`` is (target, argv) pairs, run in order."""
    proc = subprocess.run(
        [sys.executable, "-c", f"MARK = {MARK!r}\n" + _CHILD],
        input=json.dumps([[str(target), [str(a) for a in argv]] for target, argv in runs]),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [Outcome(*r) for r in json.loads(proc.stdout.rsplit(MARK, 1)[1])]


def run_codes(codes: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 600) -> list[Outcome]:
    """Each program text of ``codes`` as ``python -c`` runs it (a ``__main__`` namespace of its own, nothing shared
    but the process and its imports), all in one new process; one :class:`Outcome` per text, in order."""
    return run_commands([("-c", [code]) for code in codes], cwd=cwd, env=env, timeout=timeout)
