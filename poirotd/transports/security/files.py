"""Noticing that files were replaced, for material re-read without a restart (certificates that
cert-manager renews, the access file an operator edits)."""

from __future__ import annotations

import os
from pathlib import Path

# (device, inode, mtime in ns, size) of each file, None for one that is missing. A Kubernetes
# secret volume swaps a symlink to a new folder: stat follows it, and the inode changes.
Stamp = tuple[tuple[int, int, int, int] | None, ...]


def stamp(paths: tuple[Path, ...]) -> Stamp:
    return tuple(_stat(path) for path in paths)


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
