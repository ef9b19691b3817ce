"""A filesystem of a test's own that it can fill (the `small_disk` fixture mounts one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_small_disk(folder: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs at `folder` (mounting needs root, else the test is skipped): room for the
    store's file and its write-ahead log (checkpointed at 4 MiB) once what fills it is deleted."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path) -> Path:
    """Writes a file until the filesystem is full; returns it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # no space left
    finally:
        os.close(fd)
    return filler
