"""Claims about ``--impl``: another team's optimizer runs through the installed gates from
a directory outside this repository, a broken one is caught with a shrunk case, a
convention the reference cannot express is reported rather than compared, and a bad
spec is a usage error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_impl import ShardedMuon

REPO = Path(__file__).resolve().parents[1]
UNEXPRESSIBLE = """
import torch
from distributed_impl import ShardedMuon

def cautious(param_groups, **settings):
    return ShardedMuon(param_groups, **settings)

cautious.muongate_conventions = {"cautious_mask": True}


def half(param_groups, **settings):
    return ShardedMuon(param_groups, **settings)

half.muongate_conventions = {"ns_dtype": torch.float16}
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "gates", "-m", "gate", "--nproc", "2", "-q",
         "-p", "no:cacheprovider", "--gate-report", str(tmp_path / "report"), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_torch_optim_muon_adapter_passes_from_outside_the_repository(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "torch_muon.py", tmp_path / "their_muon.py")
    result = _run(tmp_path, "-k", "one_sharded or several_steps", "--impl", "their_muon:torch_muon")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 passed" in result.stdout


def test_broken_optimizer_fails_with_a_shrunk_case(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "broken_muon.py", tmp_path / "their_muon.py")
    result = _run(tmp_path, "-k", "several_steps", "--impl", "their_muon:broken_muon")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "several_steps: 1 of 2 comparisons with reference.Muon failed" in result.stdout, result.stdout[-3000:]
    # Shrunk: one small matrix. (The exact minimal case depends on hypothesis's version.)
    shrunk = re.search(r"minimal case: w0\[(\d+), (\d+)\] \w+ · world \d · (\d) steps?", result.stdout)
    assert shrunk is not None, result.stdout[-3000:]
    rows, cols, steps = (int(g) for g in shrunk.groups())
    assert steps <= 2 and rows <= 48 and cols <= 48


def test_a_candidate_declaring_the_gram_partial_tier_is_judged_in_it_and_a_wrong_one_fails(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "gram_partial_muon.py", tmp_path / "their_muon.py")
    k = ["-k", "declaring_the_gram_partial", "--hypothesis-profile", "dev"]
    right = _run(tmp_path, *k, "--impl", "their_muon:gram_partial_muon")
    assert right.returncode == 0 and "1 passed" in right.stdout, right.stdout[-3000:]
    wrong = _run(tmp_path, *k, "--impl", "their_muon:gram_partial_local_gram_muon")
    assert wrong.returncode == 1, wrong.stdout[-3000:]
    found = re.search(r"w0\.update step 0 rank 0 \[gram_partial_(bf16|fp32)\]: max\|diff\|", wrong.stdout)
    assert found, wrong.stdout[-3000:]
    assert "candidate their_muon:gram_partial_local_gram_muon" in wrong.stdout


def test_convention_the_reference_cannot_express_is_reported_not_compared(tmp_path: Path) -> None:
    (tmp_path / "their_muon.py").write_text(UNEXPRESSIBLE)
    result = _run(tmp_path, "-k", "one_sharded", "--impl", "their_muon:cautious", "-rs")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "conventions the reference cannot express: unknown keys ['cautious_mask']" in result.stdout
    # A value the reference refuses is the same: skipped, naming it, never compared.
    result = _run(tmp_path, "-k", "one_sharded", "--impl", "their_muon:half", "-rs")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "cannot express: ns_dtype=torch.float16 must be torch.bfloat16 or torch.float32" in result.stdout


def test_bad_impl_spec_is_a_usage_error(tmp_path: Path) -> None:
    result = _run(tmp_path, "--impl", "no_such_module:factory")
    assert result.returncode == 4
    assert "--impl no_such_module:factory" in result.stderr and "MODULE:FACTORY" in result.stderr


def test_training_specs_take_the_plugin_on_its_conventions_or_skip_saying_why():
    from harness.candidates import FEATURES, Impl, UnsupportedConvention
    from harness.models.moe import MoECase
    from harness.models.transformer import TransformerCase

    impl = Impl("my:muon", ShardedMuon, (("eps_form", "clamp"),), None, FEATURES)
    adapted = impl.adapt_training(TransformerCase("x"))
    assert adapted.candidate is ShardedMuon and dict(adapted.settings)["eps_form"] == "clamp"
    with pytest.raises(UnsupportedConvention, match="world sizes up to 1"):
        Impl("my:muon", ShardedMuon, max_world=1).adapt_training(TransformerCase("x"))
    with pytest.raises(UnsupportedConvention, match="experts"):
        Impl("my:muon", ShardedMuon, features=frozenset({"adamw"})).adapt_training(MoECase("x", "stacked", "fixed", ()))
