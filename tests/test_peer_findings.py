"""Claims about what the gates found in other teams' optimizers: each finding's standalone
reproducer (only torch and the package, no muongate) still shows it. When a package fixes
one, its test fails, and the README's line about it must change."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FINDINGS = Path(__file__).resolve().parents[1] / "examples" / "findings"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ""}  # the package and torch, never muongate
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, check=False, env=env)


def test_muon_fsdp2_single_device_path_raises_name_error() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _run(str(FINDINGS / "muon_fsdp2_single_device.py"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "NameError: name 'muon_update' is not defined" in run.stdout


def test_muon_fsdp2_step_on_unevenly_sharded_rows_breaks_the_gather() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    script = str(FINDINGS / "muon_fsdp2_uneven_shards.py")
    run = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 1: weight (3, 4), local rows 1" in run.stdout, run.stdout[-2000:]
    assert "Received data size doesn't match expected size" in run.stdout + run.stderr, run.stderr[-2000:]


def test_muon_fsdp2_moves_a_parameter_that_has_no_gradient() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    script = str(FINDINGS / "muon_fsdp2_moves_without_gradient.py")
    run = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", script)
    assert run.returncode != 0, run.stdout[-2000:]
    moved = re.search(r"largest change of a weight without a gradient: (\S+)", run.stdout)
    assert moved is not None and float(moved[1]) > 0, run.stdout[-2000:]


def test_muon_fsdp2_fails_on_a_mesh_that_is_a_slice_of_the_world() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    script = str(FINDINGS / "muon_fsdp2_submesh_rank.py")
    run = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 1 (mesh [1]): step failed: ValueError: Argument ``gather_list`` must be specified" in run.stdout
