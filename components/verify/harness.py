"""The code that runs inside the two sandboxes of a `tests` task (its source is main.py there).

Standard library only, read by the sandbox's own interpreter; the parent (``relay.py``) adds the
call to ``serve`` or ``run_tests``. Frames are as in ``protocol.py``: a 4-byte big-endian length,
then the UTF-8 ``repr`` of a tuple. The two private pipes' descriptors come from ``sys.argv`` (the
one to read, then the one to write; the sandbox keeps the numbers the parent passed).

- ``serve`` (the candidate's sandbox): runs the program, says ``("ready",)``, then answers each
  ``("call", name, args, kwargs)`` with ``("return", value)`` or ``("raise", type name, message)``.
  Everything here runs beside the program and is the program's to change: the parent trusts
  nothing it writes, only the literal it can read from it.
- ``run_tests`` (the tests' sandbox, which never holds the program): the task's helpers and tests,
  with each of the program's functions a ``Candidate`` that relays calls to the parent; at the
  end ``("done",)``, or ``("refused", reason)`` where the tests did what two sandboxes cannot carry.
"""

import ast
import builtins
import os
import sys


def _write(fd, text):
    data = text.encode("utf-8")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _read(fd):
    """The next frame's text, or None when the parent closed the pipe."""
    def exact(n):
        out = b""
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    header = exact(4)
    body = header and exact(int.from_bytes(header, "big"))
    return None if body is None else body.decode("utf-8")


def _descriptors():
    """(the pipe it reads, the pipe it writes), as the parent passed them."""
    return int(sys.argv[1]), int(sys.argv[2])


def serve(program):
    """The candidate's side: run ``program`` as __main__, then answer calls until the parent closes."""
    calls, replies = _descriptors()
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(program, "program.py", "exec"), namespace)
    _write(replies, repr(("ready",)))
    while (frame := _read(calls)) is not None:
        _, name, args, kwargs = ast.literal_eval(frame)
        function = namespace.get(name)
        try:
            if not callable(function):
                raise NameError(f"name {name!r} is not defined by the program")
            reply = repr(("return", function(*args, **kwargs)))
        except Exception as e:  # the test sees the exception (an expected ValueError, a crash)
            reply = repr(("raise", type(e).__name__, str(e)[:500]))
        _write(replies, reply)


class Refused(BaseException):
    """The tests did what cannot cross to another process (read an attribute of the candidate);
    a BaseException, so that a test's ``except Exception`` does not swallow it."""


class CandidateError(Exception):
    """The candidate raised an exception that is not one of Python's built-in ones."""


def run_tests(helpers, tests, names):
    """The tests' side: ``helpers`` (the task's own code the tests may call), then ``tests`` with
    each name in ``names`` (name → the program's function it stands for) a relaying ``Candidate``."""
    replies, calls = _descriptors()

    class Candidate:
        __slots__ = ("_function",)

        def __init__(self, function):
            self._function = function

        def __call__(self, *args, **kwargs):
            try:
                call = repr(("call", self._function, args, kwargs))
            except Exception as e:
                raise Refused(f"the tests pass {self._function} a value without a repr ({type(e).__name__})")
            _write(calls, call)
            reply = ast.literal_eval(_read(replies))
            if reply[0] == "return":
                return reply[1]
            error = getattr(builtins, reply[1], None)
            if isinstance(error, type) and issubclass(error, Exception) and not issubclass(error, Warning):
                raise error(reply[2])
            raise CandidateError(f"{reply[1]}: {reply[2]}")

        def __getattr__(self, attribute):
            raise Refused(f"the tests read {self._function}.{attribute}: the program's objects stay in its sandbox")

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(helpers, "helpers.py", "exec"), namespace)
    namespace.update({name: Candidate(function) for name, function in names.items()})
    try:
        exec(compile(tests, "tests.py", "exec"), namespace)
    except Refused as e:
        _write(calls, repr(("refused", str(e))))
        return
    _write(calls, repr(("done",)))
