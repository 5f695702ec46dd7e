"""Loaded (through PYTHONPATH) into a dry run under test: any attempt to start
a process fails loudly and is written to $NOPROC_LOG."""
import os
import subprocess

_log = os.environ.get("NOPROC_LOG")


def _refuse(what, argv):
    if _log:
        with open(_log, "a") as f:
            f.write(f"{what}: {argv!r}\n")
    raise RuntimeError(f"a dry run started a process: {argv!r}")


class _NoPopen(subprocess.Popen):
    def __init__(self, args, *a, **kw):
        _refuse("Popen", args)


subprocess.Popen = _NoPopen
for _name in ("execv", "execve", "execvp", "execvpe", "posix_spawn", "posix_spawnp", "system", "fork"):
    if hasattr(os, _name):
        setattr(os, _name, lambda *a, _n=_name, **k: _refuse(_n, a))
