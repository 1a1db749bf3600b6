"""Run a check script in a subprocess on forced CPU devices and read its ``RESULT <json>`` line.

XLA reads ``XLA_FLAGS`` once, when jax is first imported, so a test that needs K host
devices runs its check in a new Python process (``tests/shard_check.py``, or a test file
run as a script). The script prints one line ``RESULT <json>`` with what it measured; the
test asserts on it here, with the end of the output shown when the run failed.

    proc = subproc.start(["tests/shard_check.py", "4"], devices=4)   # returns at once
    ...                                                           # other tests meanwhile
    res = subproc.result(proc)                                    # exit 0 and the JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import NamedTuple

TAIL = 4000  # characters of output shown when a run fails


class Finished(NamedTuple):
    """A finished run: exit status, the last ``RESULT`` JSON (``None`` if none was printed), all output."""

    returncode: int
    result: dict | None
    text: str


def env(devices: int | None = None, base: dict | None = None) -> dict:
    """``base`` (default ``os.environ``) with ``JAX_PLATFORMS=cpu`` and, for ``devices``, that many
    forced host devices (``--xla_force_host_platform_device_count=devices`` in ``XLA_FLAGS``, the
    base's other XLA flags kept)."""
    out = dict(os.environ if base is None else base)
    out["JAX_PLATFORMS"] = "cpu"
    if devices is not None:
        out["XLA_FLAGS"] = with_device_count(out.get("XLA_FLAGS", ""), devices)
    return out


def with_device_count(flags: str, devices: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the forced host device count set to ``devices``."""
    keep = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(keep + [f"--xla_force_host_platform_device_count={int(devices)}"])


def start(args, devices: int | None = None, *, launcher=(), base_env: dict | None = None) -> subprocess.Popen:
    """Start ``[*launcher, python, *args]`` with :func:`env` ``(devices, base_env)``; stdout and
    stderr together in one pipe. Returns at once: collect with :func:`finish` or :func:`result`."""
    argv = [*map(str, launcher), sys.executable, *map(str, args)]
    return subprocess.Popen(argv, env=env(devices, base_env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, timeout: float = 600) -> Finished:
    """Wait for ``proc`` (killed after ``timeout`` seconds) and parse its last ``RESULT <json>`` line."""
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        text += f"\n[killed after {timeout:g} s]"
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    return Finished(proc.returncode, json.loads(lines[-1][len("RESULT "):]) if lines else None, text)


def result(proc: subprocess.Popen, timeout: float = 600) -> dict:
    """:func:`finish`, asserting exit status 0 and a ``RESULT`` line; returns the parsed JSON."""
    rc, res, text = finish(proc, timeout)
    what = "" if res is not None else ", no RESULT line"
    assert rc == 0 and res is not None, f"{' '.join(proc.args)}: exit {rc}{what}\n{text[-TAIL:]}"
    return res


def stop(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs (a fixture's teardown after a failed or interrupted session)."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
