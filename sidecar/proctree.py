"""The processes under a job's ranks, read from ``/proc``.

A rank is the process that attached (invariant I3), but GPU memory can sit one level down: vLLM's and
SGLang's servers run their engine in child processes (vLLM V1's ``EngineCore``, SGLang's scheduler),
which hold the KV cache and the weights on the GPU. The sidecar's memory check therefore reads the ranks
*and* their descendants, each against the per-process limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def parent_pids(proc: str = "/proc") -> dict[int, int]:
    """pid -> parent pid of every process visible in `proc` (empty where there is no procfs)."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        # raw os calls, one read of the head: the walk runs at every release, on nodes with thousands of
        # processes (a buffered file object per process cost about 2.5x as much)
        try:
            fd = os.open(f"{proc}/{name}/stat", os.O_RDONLY)
        except OSError:  # exited while we listed
            continue
        try:
            stat = os.read(fd, 256)  # "pid (comm) state ppid": comm is at most 16 bytes, all well inside
        except OSError:
            continue
        finally:
            os.close(fd)
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 2 and fields[1].isdigit():
            out[int(name)] = int(fields[1])
    return out


def with_descendants(roots: Iterable[int], proc: str = "/proc") -> dict[int, int]:
    """Each of `roots` and every live process below one of them, mapped to the root it descends from.

    A root maps to itself and is kept even if it is gone (its reading then says 0). The walk follows
    parent links as they are now: a child re-parented to init after its rank died is no longer counted,
    which is right, since the rank's sidecar no longer answers for it.
    """
    owner = {r: r for r in roots}
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_pids(proc).items():
        children.setdefault(ppid, []).append(pid)
    stack = list(owner)
    while stack:
        parent = stack.pop()
        for child in children.get(parent, ()):
            if child not in owner:
                owner[child] = owner[parent]
                stack.append(child)
    return owner


__all__ = ["parent_pids", "with_descendants"]
