"""The GPU check's baseline, vLLM's Triton paged decode, comes from vLLM's own installed files:
found without importing vllm, loaded with its few vLLM imports stubbed, or from a carried folder.
Runs without a GPU (Triton defines its kernels without one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from triton_baseline import OP_FILES, OPS_DIR_ENV, find_ops_dir, load_unified_attention  # noqa: E402

pytestmark = pytest.mark.needs_vllm


def test_the_repository_holds_no_copy_of_vllms_files():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not [p for p in tracked.splitlines() if Path(p).name in OP_FILES]


def test_the_installed_packages_files_are_found_and_load_with_stubbed_imports():
    folder = find_ops_dir()
    assert folder.parts[-3:] == ("v1", "attention", "ops")
    modules_before = set(sys.modules)
    fn, where = load_unified_attention("files")
    assert callable(fn) and fn.__name__ == "unified_attention"
    assert str(folder) in where
    # The stubs were for the load only: no stand-in `vllm` module is left for anything else.
    leftover = {m for m in set(sys.modules) - modules_before if m == "vllm" or m.startswith("vllm.")}
    assert not leftover


def test_a_carried_folder_is_used_where_no_vllm_is_installed(tmp_path, monkeypatch):
    for name in OP_FILES:
        shutil.copy(find_ops_dir() / name, tmp_path / name)
    monkeypatch.setenv(OPS_DIR_ENV, str(tmp_path))
    assert find_ops_dir() == tmp_path
    fn, where = load_unified_attention("files")
    assert fn.__name__ == "unified_attention" and str(tmp_path) in where


def test_a_folder_without_the_files_says_how_to_bring_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="carry_vllm_ops.sh"):
        find_ops_dir(tmp_path)
