"""Claims: every gate hands a candidate factory every keyword of its reference's defaults,
overridden by the case's settings, and makes them in one place (``candidate_keywords``).

A candidate written to the contract ("settings: every keyword of the reference") may read any
of them; a gate that hands it fewer fails it with a ``KeyError`` of muongate's own making."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support import repo_env, run_python

import reference
from harness.cases.case import Case, ParamSpec
from harness.models.moe import MoECase
from harness.models.transformer import TransformerCase
from harness.tasks.common import candidate_keywords
from harness.tasks.layouts import build_model
from harness.tasks.sides import candidate_side
from harness.tasks.training import candidate_optimizer

#: every setting of ``reference.Muon`` a candidate is handed (``use_muon`` is each group's own key)
MUON_KEYWORDS = set(reference.Muon.DEFAULTS) - {"use_muon"}


class _Handed(Exception):
    """Carries the keywords a factory was called with out of the task that called it."""

    def __init__(self, keywords: dict[str, Any]) -> None:
        super().__init__(sorted(keywords))
        self.keywords = keywords


def _recorder(param_groups: Any, **settings: Any) -> torch.optim.Optimizer:
    raise _Handed(settings)


def _handed(call: Any) -> dict[str, Any]:
    with pytest.raises(_Handed) as handed:
        call()
    return handed.value.keywords


def test_candidate_keywords_are_every_reference_default_under_the_cases_settings() -> None:
    case = Case((ParamSpec("w0", (4, 4)),), settings=(("lr", 0.05), ("ns_dtype", "float32")), reference=reference.Muon)
    keywords = candidate_keywords(case)
    assert set(keywords) == MUON_KEYWORDS
    assert keywords["lr"] == 0.05 and keywords["ns_dtype"] is torch.float32
    assert keywords["momentum"] == reference.Muon.DEFAULTS["momentum"]
    adamw = Case((ParamSpec("w0", (4, 4)),), settings=(("eps_form", "inside"),), reference=reference.AdamW)
    assert candidate_keywords(adamw) == {**reference.AdamW.DEFAULTS, "eps_form": "inside"}


@pytest.mark.parametrize(
    "spec",
    [MoECase("one empty", "per_expert", "fixed", ((1, 3),)), TransformerCase("dense", steps=1)],
    ids=["moe", "transformer"],
)
def test_training_and_moe_tasks_hand_a_muon_candidate_every_keyword_of_its_reference(spec: Any) -> None:
    """The training, twins and MoE gates, and ``python -m harness.train``, all build their
    candidate through ``candidate_optimizer``."""
    from dataclasses import replace

    keywords = _handed(lambda: candidate_optimizer(replace(spec, candidate=_recorder), spec.build()))
    assert set(keywords) == MUON_KEYWORDS, sorted(MUON_KEYWORDS - set(keywords))
    assert keywords == candidate_keywords(spec)


def test_optimizer_tasks_hand_a_candidate_the_same_keywords_as_the_training_tasks() -> None:
    """The optimizer, checkpoint, layout, reshard, robustness and Muon-only gates (a ``--kernel``
    inside a candidate's step included) build their candidate through ``candidate_side``; it adds
    only what ``ShardedMuon``'s contract adds (``mode``). The kernel task calls a kernel, not a
    factory, and an engine's factory has a contract of its own (``harness.engines``)."""
    case = Case(
        (ParamSpec("w0", (4, 4)),), settings=(("weight_decay", 0.1),), candidate=_recorder, reference=reference.Muon
    )
    tensors = [torch.zeros(4, 4)]
    keywords = _handed(lambda: candidate_side(case, build_model(case, tensors, None)))
    assert keywords == {**candidate_keywords(case), "mode": "all_ranks"}


STRICT = '''
import reference
from distributed_impl import ShardedMuon
from harness.candidates import Candidate

EXPECTED = set(reference.Muon.DEFAULTS) - {"use_muon"}


@Candidate()
def strict_muon(param_groups, **settings):
    """Written to the contract: it reads every keyword of the reference, and refuses fewer."""
    missing = sorted(EXPECTED - set(settings))
    if missing:
        raise KeyError(f"strict_muon was handed no {missing}")
    return ShardedMuon(param_groups, **{k: settings[k] for k in EXPECTED}, mode=settings.get("mode", "all_ranks"))
'''


@pytest.mark.slow
def test_a_candidate_that_reads_every_reference_keyword_passes_the_training_twins_and_moe_gates(
    tmp_path: Path,
) -> None:
    (tmp_path / "strict.py").write_text(STRICT)
    selected = (
        "training_matches_single_process_reference_at_every_step and dense] "
        "or training_twins_agree_bitwise_at_every_world_size and 2] "
        "or fixed_moe_trains_like_single_process_reference_bitwise and one-empty and layer "
        "or several_steps"
    )
    result = run_python(
        "-m", "pytest", "--pyargs", "gates", "-m", "gate", "--nproc", "2", "-q", "-p", "no:cacheprovider",
        "-p", "no:randomly", "--hypothesis-profile", "dev", "--hypothesis-seed", "0",
        "--gate-report", str(tmp_path / "report"), "-k", selected, "--impl", "strict:strict_muon",
        cwd=tmp_path, env=repo_env(tmp_path), timeout=900,
    )  # fmt: skip
    assert "KeyError" not in result.stdout, result.stdout[-4000:]
    assert result.returncode == 0, result.stdout[-4000:]
    assert "4 passed" in result.stdout, result.stdout[-4000:]
