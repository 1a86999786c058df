"""The folder of an export bundle and the files in it, made so that only their user can read
them and nobody can redirect them.

Shared by whoever writes a bundle: the daemon writes a host's export (db/export.py), the CLI
checks the folder it names before asking, and gathers other hosts' bundles and the index of an
export across hosts into folders of its own.

A folder someone else owns or may write to is refused before anything is written; every file is
created new at 0600 and never through a symbolic link.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, TextIO

from llmconsole.paths import UnsafeDirectory, check_private_dir


class ExportError(Exception):
    """The bundle could not be written safely; the message says why."""


_FOLDER_FIX = "export into a new directory of yours (llmconsole creates it 0700)"


def check_out_dir(out: Path) -> None:
    """Refuse (ExportError) `out` as a bundle's folder unless it is missing, or an empty real
    directory of this user's that nobody else may write to. Writes nothing."""
    try:
        check_private_dir(out, _FOLDER_FIX)  # a link there is not followed, even to create
    except UnsafeDirectory as e:
        raise ExportError(f"refusing to export there: {e}") from None
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty; export into a new directory")


def prepare_out_dir(out: Path) -> Path:
    """`out` made ready for a bundle: created 0700 if missing, else refused (ExportError, nothing
    written) unless it is an empty real directory of this user's that nobody else may write to."""
    check_out_dir(out)
    try:
        try:
            out.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            pass
        check_private_dir(out, _FOLDER_FIX)  # whoever created it, it must be ours now
    except UnsafeDirectory as e:
        raise ExportError(f"refusing to export there: {e}") from None
    return out


def _open_new(path: Path) -> int:
    """A new file of the bundle, 0600. O_EXCL|O_NOFOLLOW: whatever is already at that name (a
    symbolic link planted there, say) is never followed nor overwritten: ExportError instead."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        raise ExportError(
            f"{path} appeared while the bundle was being written; it was left as it is and not followed"
        ) from None


def create_file(path: Path) -> TextIO:
    """A new text file of the bundle (see _open_new)."""
    return os.fdopen(_open_new(path), "w", encoding="utf-8", newline="")


def create_binary_file(path: Path) -> BinaryIO:
    """A new binary file of the bundle (see _open_new)."""
    return os.fdopen(_open_new(path), "wb")


def make_folder(path: Path) -> None:
    """A new folder of the bundle (0700); one already there is refused as create_file does."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise ExportError(f"{path} appeared while the bundle was being written; it was left as it is") from None
