"""An export is the user's alone: its folder must be theirs and closed to others, its files are
created new at 0600, and nothing at a file's name (a planted symbolic link) is ever followed."""

from __future__ import annotations

import os
import stat

import pytest

from llmconsole.db import Store
from llmconsole.db import export as export_mod
from llmconsole.db.export import ExportError, export_bundle

OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another uid needs root")


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data" / "llmconsole.db")
    yield s
    s.close()


@needs_root
def test_a_folder_of_another_user_is_refused_and_nothing_is_written(store, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir(mode=0o700)
    os.chown(out, OTHER_UID, -1)
    with pytest.raises(ExportError, match=f"belongs to uid {OTHER_UID}, not to you"):
        export_bundle(store, out)
    assert list(out.iterdir()) == []


def test_a_folder_others_may_write_is_refused_and_nothing_is_written(store, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(ExportError, match="writable by others"):
        export_bundle(store, out)
    assert list(out.iterdir()) == []


def test_a_symbolic_link_as_the_folder_is_not_followed(store, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ExportError, match="symbolic link"):
        export_bundle(store, tmp_path / "link")
    assert list(real.iterdir()) == []


def test_every_file_and_folder_of_the_bundle_is_private(store, tmp_path):
    out = tmp_path / "bundle"
    result = export_bundle(store, out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for rel in result.files:
        assert stat.S_IMODE((out / rel).stat().st_mode) == 0o600, rel
    for folder in ("plots",):
        assert stat.S_IMODE((out / folder).stat().st_mode) == 0o700


def test_a_link_planted_at_a_file_name_is_not_followed(store, tmp_path, monkeypatch):
    """Whatever appears at a file's name once the folder was checked stops the export; the file
    the link points at is left as it was."""
    out = tmp_path / "bundle"
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    victim.chmod(0o644)
    collect = export_mod.collect

    def collect_then_plant(*args, **kwargs):
        (out / "actions.jsonl").symlink_to(victim)
        return collect(*args, **kwargs)

    monkeypatch.setattr(export_mod, "collect", collect_then_plant)
    with pytest.raises(ExportError, match="actions.jsonl appeared"):
        export_bundle(store, out)
    assert victim.read_text() == "untouched\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644


@needs_root
def test_the_cli_refuses_a_folder_of_another_user_with_the_reason(cli, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir(mode=0o700)
    os.chown(out, OTHER_UID, -1)
    Store.open(cli.home / "llmconsole.db").close()  # something recorded to export
    r = cli("export", "--out", str(out), check=False)
    assert r.returncode == 2, r.stderr
    assert f"belongs to uid {OTHER_UID}" in r.stderr and "export into a new directory of yours" in r.stderr
    assert list(out.iterdir()) == []
