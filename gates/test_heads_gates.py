"""Claims: Newton–Schulz on row blocks (``reference.Muon``'s ``ns_heads``, heads of equal size, and
``ns_split``, blocks of given sizes; each block orthogonalized on its own, with its own shape's lr
scale) is computed bit for bit on FSDP2 and on every layout family, with block boundaries on and
off the shards' (``row_block_cases``). A candidate is judged on it where it declares the ``heads``
feature; the family declares the claim (``CLAIMS``).

Negative controls (``negative_controls.HEAD_CONTROLS``): the rows a rank holds split into the
whole matrix's head count; one factor for every row of a piece across its heads (a power of two,
which only a head split between two pieces shows, under ``eps_form="clamp"`` and norms above
``eps``, which its search draws); one block's lr scale for every row of a piece that spans
unequal blocks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given

from gates.negative_controls import HEAD_CONTROLS, BlockScaleBeforeNormNorMuon
from harness.algorithms import MUON, Algorithm
from harness.cases import Case, row_block_cases
from harness.runner.ran import differed
from harness.session import drawn, gate_config
from reference import NorMuon

pytestmark = pytest.mark.gate

NORMUON = Algorithm.of(NorMuon)


def _blocks_of(session: Any) -> Any:
    """Row-block cases of the session's family where it claims them (Muon, NorMuon), else Muon's,
    which the gate then skips by its claim."""
    family = session.algorithm if "heads" in session.algorithm.claims else MUON
    return row_block_cases(max_world=session.nproc, algorithm=family)


@given(case=drawn(_blocks_of))
def test_newton_schulz_on_heads_and_row_blocks_matches_reference_bitwise_on_every_layout(
    gate_runner: Any, case: Case
) -> None:
    gate_runner.algorithm_claim("heads", "Newton–Schulz on each row block of a matrix (ns_heads, ns_split)")
    gate_runner.require("heads", {"heads"}, "its claim is Newton–Schulz on row blocks (ns_heads, ns_split)")
    gate_runner.check("heads", case)


def _scale_free(case: Case) -> Case:
    """``eps_form="clamp"`` and gradients of their own size: Newton–Schulz divides by a head's norm
    alone wherever that norm is above ``eps`` (a gradient scaled by 1e-8 is not), so a head scaled
    by a power of two as a whole comes out the same."""
    params = tuple(p._replace(grad_scale=1.0) for p in case.params)
    return replace(case, params=params, settings=(*case.settings, ("eps_form", "clamp")))


@pytest.mark.judges("muongate's per-head gate, with planted bugs (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(HEAD_CONTROLS))
def test_heads_gate_catches_negative_control(gate_runner: Any, control: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("a head split by a shard needs two ranks")
    planted = HEAD_CONTROLS[control]

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None)

    gate_runner.catch(
        f"negative:heads:{control}",
        row_block_cases(max_world=gate_config().nproc).map(_scale_free),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )


@pytest.mark.judges("muongate's per-head gate, with planted bugs (negative controls)", "muongate: gates")
def test_heads_gate_catches_normuon_block_lr_scales_cancelled_by_its_normalization(gate_runner: Any) -> None:
    """NorMuon on row blocks (microsoft/dion's ``split_sizes``): each block's lr scale applied
    before the normalization, which cancels it, is caught against ``reference.NorMuon``, under
    an lr scale that follows a block's rows (``match_rms_adamw``)."""

    def on(case: Case) -> Case:
        settings = tuple(kv for kv in case.settings if kv[0] != "adjust_lr_fn")
        return replace(
            case,
            candidate=BlockScaleBeforeNormNorMuon,
            mode=None,
            settings=(*settings, ("adjust_lr_fn", "match_rms_adamw")),
        )

    gate_runner.catch(
        "negative:heads:BlockScaleBeforeNormNorMuon",
        row_block_cases(max_world=gate_config().nproc, algorithm=NORMUON),
        lambda case: differed(gate_runner.run(on(case))),
        lambda case: on(case).describe(),
    )
