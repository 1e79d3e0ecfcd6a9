"""Claims about ``harness.candidates.Candidate``, the one declaration a candidate makes: a bad
field is refused when it is made, naming the field and the fix; it is what ``--impl`` reads;
the ``muongate_*`` attributes it replaces are still read, with a warning naming it; and no
example or adapter declares itself the old way."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import reference
from harness.candidates import Candidate, Impl, declaration_of
from tests.support import REPO

BAD_FIELDS = [
    ({"features": {"adamw", "fp8"}}, "Candidate features: unknown ['fp8']; choose from ["),
    ({"features": "bf16"}, "Candidate features='bf16': a set of names, e.g. features={'bf16'}"),
    ({"layouts": {"2d"}}, "Candidate layouts: unknown ['2d']"),
    ({"tiers": {"loose"}}, "Candidate tiers: unknown ['loose']"),
    ({"devices": set()}, "Candidate devices: unknown []; choose from ['cpu', 'cuda']"),
    ({"max_world": 0}, "Candidate max_world=0: a whole number of ranks ≥ 1, or None for any"),
    ({"min_ns_steps": -1}, "Candidate min_ns_steps=-1: a whole number ≥ 0"),
    ({"shard": "fully"}, "Candidate shard='fully': a function, e.g. shard=my_shard"),
    (
        {"piece": lambda name, p: ()},
        "Candidate piece=…: names the pieces of a shard=… function's layout; declare shard too",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS, ids=[next(iter(f)) for f, _ in BAD_FIELDS])
def test_a_bad_field_is_refused_when_declared_naming_the_field_and_the_fix(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        Candidate(**fields)
    assert str(e.value).startswith(message), str(e.value)


def adamw(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    import torch

    return torch.optim.AdamW(param_groups, lr=settings["lr"])


def test_impl_reads_what_the_candidate_declares() -> None:
    Candidate(reference=reference.AdamW, conventions={"state_dtype": "param"}, layouts={"hsdp"}, max_world=4)(adamw)
    impl = Impl.load(f"{__name__}:adamw")
    assert impl.algorithm.spec == "reference:AdamW"
    assert impl.declares_reference
    assert dict(impl.conventions) == {"state_dtype": "param"}
    assert impl.layouts == {"hsdp"} and impl.max_world == 4 and not impl.inexpressible


def legacy(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    raise AssertionError("never called here")


legacy.muongate_features = {"bf16"}  # type: ignore[attr-defined]
legacy.muongate_max_world = 2  # type: ignore[attr-defined]


def vibes(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    raise AssertionError("never called here")


def test_a_second_different_declaration_of_one_factory_is_refused_and_a_subclass_declares_its_own() -> None:
    """A second ``Candidate(...)(factory)`` would reset every field it does not name (an adapter
    in this repository lost its conventions so); the same declaration again is harmless."""

    def factory(param_groups: Any, **settings: Any) -> Any: ...

    Candidate(features={"adamw"}, package="theirs")(factory)
    Candidate(features={"adamw"}, package="theirs")(factory)
    with pytest.raises(ValueError, match=r"declared already.*dataclasses\.replace\(declaration_of\("):
        Candidate(default_group=True)(factory)
    assert declaration_of(factory).package == "theirs"

    @Candidate(features={"adamw"})
    class Theirs:
        pass

    @Candidate(features={"bf16"})
    class Subclass(Theirs):
        pass

    assert declaration_of(Subclass).features == frozenset({"bf16"})


def test_unknown_differences_are_refused_when_the_candidate_is_loaded() -> None:
    Candidate(differences={"vibes"})(vibes)
    with pytest.raises(
        ValueError,
        match=r"--impl .*:vibes: Candidate differences \['vibes'\] are not causes of reference.Muon; its causes are \['bf16",
    ):
        Impl.load(f"{__name__}:vibes")


def typo(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    raise AssertionError("never called here")


def typo_of_adamw(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    raise AssertionError("never called here")


def on_purpose(param_groups: list[dict[str, Any]], **settings: Any) -> Any:
    raise AssertionError("never called here")


def test_a_typo_in_a_convention_name_is_refused_when_loaded_naming_the_setting_it_is_near() -> None:
    """Left to the gates, it skipped every one of them and the session ended NOT JUDGED."""
    Candidate(conventions={"momentun_form": "ema", "ns_step": 3})(typo)
    with pytest.raises(ValueError) as e:
        Impl.load(f"{__name__}:typo")
    assert str(e.value) == (
        f"--impl {__name__}:typo: Candidate conventions: unknown keys 'momentun_form' (did you mean "
        "'momentum_form'?), 'ns_step' (did you mean 'ns_steps'?)"
    )
    # near the settings of the reference it declares
    Candidate(reference=reference.AdamW, conventions={"weight_decay_frm": "l2"})(typo_of_adamw)
    with pytest.raises(ValueError, match=r"unknown keys 'weight_decay_frm' \(did you mean 'weight_decay_form'\?\)"):
        Impl.load(f"{__name__}:typo_of_adamw")


def test_a_convention_no_reference_expresses_declared_on_purpose_loads_and_is_named_by_every_gate() -> None:
    """An adapter names its package's own arithmetic so (optimuon's ``cautious_weight_decay``),
    for ``--reference none``, or to have every gate say what the reference cannot express."""
    Candidate(conventions={"cautious_weight_decay": True, "momentum_form": "ema"})(on_purpose)
    impl = Impl.load(f"{__name__}:on_purpose")
    assert impl.inexpressible == ("unknown keys ['cautious_weight_decay']",)


def test_the_old_attributes_are_read_with_a_warning_naming_the_replacement() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"declare one harness\.candidates\.Candidate\(features=…, max_world=…\)"
    ):
        declared = declaration_of(legacy)
    assert declared.features == {"bf16"} and declared.max_world == 2


def test_no_candidate_of_this_repository_declares_itself_with_the_old_attributes() -> None:
    fields = {f"muongate_{name}" for name in Candidate.__dataclass_fields__}
    old = []
    # Newton–Schulz kernels (--kernel, *kernel.py) keep FN.muongate_conventions: their own contract
    # (harness/candidates/kernel.py), not a candidate's.
    files = [*Path(REPO, "examples").rglob("*.py"), *Path(REPO, "gates").rglob("*.py")]
    for path in sorted(p for p in files if not p.stem.endswith("kernel")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in fields:
                old.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert not old, old
