"""The program a sandboxed Python worker runs first: read one request on stdin, lock down, run it.

The sandbox's interpreter starts as ``python -I -c <loader>`` (``agentgym.sandbox.backends.LOADER``),
which reads this file's source from fd 0 and runs it: the command line, readable by the sandboxed
code, then holds no source of the framework. So this file uses the standard library only and must
run unchanged on every Python the sandbox may use.

Wire format on fd 0 (written by the host: the bootstrap when the worker is spawned, the request
later, see ``agentgym.sandbox.backends.BOOTSTRAP_FRAME`` and ``encode_request``)::

    <8-digit length><this file's source><JSON header>\\n<code bytes><stdin bytes>

The header holds ``code_bytes``, ``stdin_bytes``, ``scratch`` (the working directory),
``rlimits`` (``[[name, soft, hard], ...]``), and ``uid``/``gid`` (``null``: keep the current ids).
The worker waits for the request *before* applying limits, so a warm (pre-spawned) worker can serve
any limits. Then: rlimits are set, privileges dropped, stdin is replaced by the request's bytes,
and the code runs as ``__main__`` in this very process (no second interpreter start-up).
"""

import json
import os
import resource
import sys
import types

_MAX_HEADER_BYTES = 65536
_PROTOCOL_ERROR = 70  # EX_SOFTWARE: the host sent a malformed request


def _read_exact(count):
    chunks = []
    while count > 0:
        chunk = os.read(0, min(count, 1 << 20))
        if not chunk:
            os._exit(_PROTOCOL_ERROR)
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _read_header():
    line = bytearray()
    while True:
        byte = os.read(0, 1)  # byte by byte: nothing past the header may be buffered away from fd 0
        if not byte:
            os._exit(_PROTOCOL_ERROR)
        if byte == b"\n":
            return json.loads(bytes(line))
        line += byte
        if len(line) > _MAX_HEADER_BYTES:
            os._exit(_PROTOCOL_ERROR)


def main():
    header = _read_header()
    code = _read_exact(header["code_bytes"]).decode("utf-8")
    stdin = _read_exact(header["stdin_bytes"])
    scratch = header["scratch"]
    # Limits and the uid first, so that everything below, files included, is the sandbox user's.
    for name, soft, hard in header["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if header.get("uid") is not None:
        os.setgroups([])
        os.setgid(header["gid"])
        os.setuid(header["uid"])  # from root: drops every capability too
    os.chdir(scratch)
    # The program's stdin: an unlinked file holding the request's bytes (a pipe could fill up).
    stdin_path = os.path.join(scratch, ".stdin")
    with open(stdin_path, "wb") as handle:
        handle.write(stdin)
    fd = os.open(stdin_path, os.O_RDONLY)
    os.unlink(stdin_path)
    os.dup2(fd, 0)
    os.close(fd)
    main_path = os.path.join(scratch, "main.py")
    with open(main_path, "w", encoding="utf-8") as handle:  # for tracebacks and multiprocessing
        handle.write(code)
    module = types.ModuleType("__main__")
    module.__file__ = main_path
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    sys.argv = [main_path]
    sys.path[0:0] = [scratch]
    compiled = compile(code, main_path, "exec")
    try:
        exec(compiled, module.__dict__)  # noqa: S102 - running the code is this file's job
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - print it as Python would, without this file's frame
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.stderr.flush()
        sys.exit(1)


if __name__ == "__main__":
    main()
