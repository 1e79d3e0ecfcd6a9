"""Claims: every parameter steps with the algorithm its group declares (the routing audit):
a matrix of a ``use_muon`` group holds Muon's state after its steps, on every rank, and a
parameter of an AdamW group AdamW's, by the reference's ``ROUTES``
(``harness.tasks.routing``). Decided by what each parameter's first step did, set against each
route's first step of the same inputs, and by the candidate's own state where the step cannot
tell, so a matrix sent to AdamW is named as such whatever its state is called or the
candidate's single-device self says. The report
lists the audit of a transformer's kinds of parameters (``Routing``).

Negative controls (``negative_controls.ROUTING_CONTROLS``): parameters routed by their
flattened view, as code that routes FSDP1's flat parameters does, so every matrix steps with
AdamW; and a silent fallback to AdamW that keeps Muon's state names, which only what its steps
did shows (the audit decides by the first step's update, ``harness.tasks.routing``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.negative_controls import ROUTING_CONTROLS
from harness.algorithms import MUON
from harness.cases import Case, ParamSpec, cases, layout_cases, session_cases
from harness.runner.routing import judge_routes
from harness.session import GateConfig, drawn, gate_config

pytestmark = pytest.mark.gate


def _audited(config: GateConfig) -> None:
    algorithm = config.algorithm
    if not algorithm.routes:
        pytest.skip(f"routing: {algorithm.title} declares no ROUTES, the state that shows what stepped a parameter")


def _routing_cases(config: GateConfig) -> st.SearchStrategy[Case]:
    laid_out = layout_cases(max_world=config.nproc, min_world=min(2, config.nproc), algorithm=config.algorithm)
    return st.one_of(session_cases(config, max_world=config.nproc, max_steps=2), laid_out)


@given(case=drawn(_routing_cases))
def test_every_parameter_steps_with_the_algorithm_its_group_declares(gate_runner: Any, case: Case) -> None:
    _audited(gate_config())
    gate_runner.route("routing", case)


def transformer_parameters(hybrid: bool) -> tuple[ParamSpec, ...]:
    """A small transformer's kinds of parameters, as Muon recipes split them: the embedding and
    the output head, the norms and the biases to AdamW; attention (K and V narrower, GQA), the
    MLP, a one-row projection (empty on every rank but the first) and an expert stack to Muon."""
    matrices = [("q_proj", (8, 8)), ("k_proj", (4, 8)), ("v_proj", (4, 8)), ("o_proj", (8, 8)), ("up_proj", (16, 8)),
                ("down_proj", (8, 16)), ("router", (1, 8)), ("experts", (2, 4, 8))]  # fmt: skip
    others = [("embed", (32, 8)), ("norm", (8,)), ("up_bias", (16,)), ("lm_head", (32, 8))]
    muon = [ParamSpec(name, shape) for name, shape in matrices]
    return (*muon, *(ParamSpec(name, shape, use_muon=not hybrid) for name, shape in others))


def test_routing_audit_lists_which_algorithm_stepped_each_parameter(gate_runner: Any) -> None:
    config = gate_config()
    _audited(config)
    algorithm = config.algorithm
    world = min(config.nproc, 4)
    case = Case(transformer_parameters(algorithm.hybrid), seed=1, world_size=world, mesh=(world,), steps=2,
                mode="all_ranks" if algorithm.orthogonalizes else None, reference=algorithm.in_case)  # fmt: skip
    gate_runner.route("routing:transformer", case, table=True)


@pytest.mark.judges("muongate's routing audit, with planted silent fallbacks (negative controls)", "muongate: gates")
@pytest.mark.parametrize("control", sorted(ROUTING_CONTROLS))
def test_routing_audit_catches_a_silent_fallback(gate_runner: Any, control: str) -> None:
    """``FlattenedRoutingMuon`` keeps AdamW's state names; ``NamedFallbackMuon`` keeps Muon's,
    so only what its steps did shows it; both are caught against themselves on one device
    (``--against self``) too, where the update is what they share with their twin."""
    planted = ROUTING_CONTROLS[control]

    def on(case: Case) -> Case:
        return replace(case, candidate=planted, mode=None, self_reference=True)

    def caught(case: Case) -> str | None:
        _, status, message = judge_routes(gate_runner.run(on(case), task="routing").routes)
        return message if status == "failed" else None

    gate_runner.catch(
        f"negative:routing:{control}",
        cases(max_world=gate_config().nproc, max_steps=2, algorithm=MUON),
        caught,
        lambda case: on(case).describe(),
    )
