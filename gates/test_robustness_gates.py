"""Claims: the sharded optimizer withstands the inputs users report breaking distributed Muons.

Each scenario draws its cases with hypothesis, with the settings of the session's reference
(``reference.Muon`` unless a candidate names another). A candidate passes a case by
computing what the reference computes (bitwise), or by refusing the input with an error that
names the parameter; a hang, an abort, any other error or a silent difference fails it
(``GateRunner.withstands``). Where the reference needs a convention for the input (a
gradient that only some ranks have), the case states it.

Each scenario has its negative control, a planted Muon that fails it the way users saw
(``negative_controls.ROBUSTNESS_CONTROLS``): hypothesis must find a case where it fails in
that way, and shrink it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gates.negative_controls import ROBUSTNESS_CONTROLS
from harness.algorithms import Algorithm
from harness.candidates import MISSING_GRADS
from harness.cases import Case, ParamSpec, matrix_shapes, settings_of
from harness.cases.case import DType
from harness.runner import robust_finding
from harness.session import gate_config

pytestmark = pytest.mark.gate

EXAMPLES = max(5, settings().max_examples // 10)

_SHAPES = matrix_shapes(max_side=24)
_DTYPES: st.SearchStrategy[DType] = st.sampled_from(["float32", "bfloat16"])


def _algorithm() -> Algorithm:
    """The session's reference: what the scenarios draw settings for and judge against."""
    return gate_config().algorithm


@st.composite
def _case(draw: st.DrawFn, params: list[ParamSpec], *, min_world: int = 1, steps: int = 2) -> Case:
    world = draw(st.integers(min(min_world, gate_config().nproc), gate_config().nproc))
    algorithm = _algorithm()
    return Case(
        params=tuple(params),
        seed=draw(st.integers(0, 2**16)),
        world_size=world,
        mesh=(world,),
        steps=draw(st.integers(1, steps)) if steps > 1 else 1,
        mode=draw(st.sampled_from(["all_ranks", "owner_split"])) if algorithm.orthogonalizes else None,
        settings=draw(settings_of(algorithm)),
        reference=algorithm.in_case,
    )


@st.composite
def _scenario(draw: st.DrawFn, name: str) -> Case:
    """One case of a scenario; each shrinks towards two ranks and small matrices."""
    if name == "rank-asymmetric-gradient":
        # A gradient on rank 0 only; the reference reads the missing pieces as zeros.
        params = [ParamSpec("w", draw(_SHAPES)), ParamSpec("lonely", draw(_SHAPES), grad="rank_asymmetric")]
        return draw(_case(params, min_world=2))
    if name == "step-without-any-gradient":
        # Every parameter has a gradient on steps 1 and 3 only: step 2 has none at all.
        params = [ParamSpec(f"w{i}", draw(_SHAPES), draw(_DTYPES), grad="every_other") for i in range(2)]
        return replace(draw(_case(params)), steps=3)
    if name == "muon-parameter-without-gradient":
        # It must stay exactly as it was, and so must its (absent) momentum, while others step.
        idle = ParamSpec("idle", draw(_SHAPES), draw(_DTYPES), grad="none")
        return draw(_case([ParamSpec("w", draw(_SHAPES)), idle]))
    if name == "empty-local-shards":
        # Fewer rows than ranks: some ranks hold no rows of the matrix at all.
        rows = draw(st.integers(1, max(1, gate_config().nproc - 1)))
        return draw(_case([ParamSpec("thin", (rows, draw(st.integers(1, 24))))], min_world=2))
    if name == "one-row-and-one-column":
        n = draw(st.integers(1, 24))
        return draw(_case([ParamSpec("row", (1, n)), ParamSpec("column", (draw(st.integers(1, 24)), 1))]))
    if name == "mixed-shapes-and-dtypes":
        dtypes = draw(st.lists(_DTYPES, min_size=2, max_size=4).filter(lambda d: len(set(d)) == 2))
        return draw(_case([ParamSpec(f"w{i}", draw(_SHAPES), d) for i, d in enumerate(dtypes)]))
    raise ValueError(f"no scenario {name!r}")


SCENARIOS = sorted(ROBUSTNESS_CONTROLS)
#: the scenarios whose point is a gradient missing on some step or some rank
_MISSING_GRADIENT = ("muon-parameter-without-gradient", "rank-asymmetric-gradient", "step-without-any-gradient")


@pytest.mark.parametrize("scenario", SCENARIOS)
@given(data=st.data())
@settings(max_examples=EXAMPLES)
def test_sharded_muon_withstands_what_breaks_distributed_muons(gate_runner: Any, scenario: str, data: Any) -> None:
    algorithm = _algorithm()
    if scenario == "rank-asymmetric-gradient" and (algorithm.elementwise or algorithm.factory is None):
        # Missing pieces read as zeros is a convention of an algorithm that needs the whole tensor;
        # an elementwise one steps each piece on its own, and without a reference there is none.
        why = f"{algorithm.title} is elementwise" if algorithm.factory else "no reference states its convention"
        pytest.skip(f"robust:{scenario}: a gradient on some ranks only has no single-device meaning here: {why}")
    if scenario == "mixed-shapes-and-dtypes":
        gate_runner.require(f"robust:{scenario}", {"bf16"}, "its claim is a group of float32 and bf16 matrices")
    if scenario in _MISSING_GRADIENT:
        gate_runner.require(f"robust:{scenario}", {MISSING_GRADS}, "its claim is a gradient missing")
    gate_runner.withstands(f"robust:{scenario}", data.draw(_scenario(scenario)))


@pytest.mark.judges("muongate's robustness gates, with planted failures (negative controls)", "muongate: gates")
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_robustness_gate_catches_its_planted_failure(gate_runner: Any, scenario: str) -> None:
    if gate_config().nproc < 2:
        pytest.skip("the planted failures need two ranks")
    planted, expected = ROBUSTNESS_CONTROLS[scenario]

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None)

    def caught(case: Case) -> str | None:
        kind, message = robust_finding(gate_runner.run(on(case)))
        return message if kind == expected else None

    gate_runner.catch(f"negative:robust:{scenario}", _scenario(scenario), caught, lambda c: on(c).describe())
