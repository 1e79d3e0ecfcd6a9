"""Which algorithm stepped each parameter, as the candidate's own state shows it (the routing audit).

After an optimizer case's steps, each rank reads the state its candidate keeps for each case
parameter it holds and names the route (the reference's ``ROUTES``: ``Muon``, ``NorMuon``,
``AdamW``…) whose state it is. A matrix that a ``use_muon`` group declares Muon's and that
holds AdamW's ``exp_avg`` stepped as AdamW, whatever the update's numbers say, and whatever the
candidate's single-device self did (it may share the split). Every rank audits its own view:
a candidate that routes by a rank's local piece routes differently on different ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from harness.algorithms import reference_of
from harness.cases.case import Case
from harness.tasks.layouts import case_param
from harness.tasks.sides import by_name

#: what a parameter's state shows where the candidate keeps none for it
NO_STATE = "no state"
#: how a state that fits no route, or several, begins
UNKNOWN = "unknown"


class Route(NamedTuple):
    """One parameter on one rank: the route the case declares and the one its state shows."""

    name: str
    shape: tuple[int, ...]
    rank: int
    declared: str
    stepped: str


def stepped_route(routes: Mapping[str, tuple[str, ...]], state: Mapping[str, Any]) -> str:
    """The one route whose state ``state`` holds every tensor of (``NO_STATE`` where it holds
    no tensor), or ``unknown (KEYS)`` where none or several fit."""
    held = {k for k, v in state.items() if isinstance(v, Tensor)}
    if not held:
        return NO_STATE
    fits = [name for name, keys in routes.items() if set(keys) <= held]
    return fits[0] if len(fits) == 1 else f"{UNKNOWN} ({', '.join(sorted(held))})"


def audit(
    case: Case, ref: torch.optim.Optimizer | None, opt: torch.optim.Optimizer, model: Any, rank: int
) -> tuple[Route, ...]:
    """Each case parameter the reference stepped (all of them without a reference): the route
    declared for it and the one the candidate's state shows, on this rank."""
    algorithm = reference_of(case)
    if not algorithm.routes:
        return ()
    ref_params = by_name(ref)
    out = []
    for spec in case.params:
        declared = algorithm.route_of(spec.use_muon)
        if declared is None or (ref is not None and not ref.state.get(ref_params[spec.name])):
            continue
        state = opt.state.get(case_param(model, spec.name), {})
        out.append(Route(spec.name, spec.shape, rank, declared, stepped_route(algorithm.routes, state)))
    return tuple(out)
