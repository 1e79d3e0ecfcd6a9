"""Claims about what an algorithm family declares: its capabilities are fields the reference
class writes down (``CLAIMS``), never a check of which class it subclasses, so a new family that
orthogonalizes without being a ``reference.Muon`` gets the Newton–Schulz claims, and a family
that declares none gets none."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

import reference
from harness.algorithms import MUON, Algorithm


class _Normalized(torch.optim.Optimizer):
    """A family of its own, not a subclass of ``reference.Muon``, that orthogonalizes."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"lr": 0.02}
    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {"lr": (0.02,)}
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {}
    PARAM_NDIMS: ClassVar[tuple[int, ...]] = (2,)
    STATE: ClassVar[tuple[str, ...]] = ()
    CLAIMS: ClassVar[frozenset[str]] = frozenset({"newton_schulz"})


class _Renamed(reference.Muon):
    """A subclass that changes nothing the gates read."""


def test_muon_declares_its_claims_and_the_adam_family_none() -> None:
    assert MUON.orthogonalizes and {"hybrid_groups", "oracle_spectrum", "tier:causes"} <= MUON.claims
    for family in (reference.AdamW, reference.LowBitAdamW, reference.Adafactor):
        declared = Algorithm.of(family)
        assert not declared.claims and not declared.orthogonalizes, family


def test_a_family_that_declares_newton_schulz_orthogonalizes_without_subclassing_muon() -> None:
    declared = Algorithm.of(_Normalized)
    assert declared.orthogonalizes and declared.claims == {"newton_schulz"}
    assert not declared.hybrid, "no use_muon setting: no AdamW groups beside it"


def test_a_subclass_inherits_its_parents_claims() -> None:
    assert Algorithm.of(_Renamed).claims == MUON.claims


def test_the_engine_contracts_optimizers_are_the_names_the_registered_families_declare() -> None:
    from harness.algorithms import engine_family
    from harness.engines import OPTIMIZERS

    assert {"muon", "adamw"} == OPTIMIZERS
    assert engine_family("muon").factory is reference.Muon
    assert engine_family("adamw").factory is reference.AdamW, "LowBitAdamW, its subclass, takes no name of its own"


def test_each_family_declares_the_causes_muongate_calibrates_for_its_arithmetic_and_every_family_has_signed_zero() -> (
    None
):
    assert set(MUON.causes) == {*reference.MUON_CAUSES, "signed_zero"}
    assert Algorithm.of(_Renamed).causes == MUON.causes, "a subclass inherits its parent's"
    for family in (reference.AdamW, reference.LowBitAdamW, reference.Adafactor, reference.NorMuon, _Normalized):
        assert set(Algorithm.of(family).causes) == {"signed_zero"}, family
    assert MUON.unknown_causes({"plain_quintic", "signed_zero"}) is None
    assert Algorithm.of(reference.NorMuon).unknown_causes({"plain_quintic"}) == (
        "differences ['plain_quintic'] are not causes of reference.NorMuon; its causes are ['signed_zero']"
    )
