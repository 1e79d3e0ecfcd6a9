"""Which algorithm stepped each parameter, as the candidate's own state shows it (the routing audit).

After an optimizer case's steps, each rank reads the state its candidate keeps for each case
parameter it holds and names the route (the reference's ``ROUTES``: ``Muon``, ``NorMuon``,
``AdamW``…) whose state it is. A matrix that a ``use_muon`` group declares Muon's and that
holds AdamW's ``exp_avg`` stepped as AdamW, whatever the update's numbers say, and whatever the
candidate's single-device self did (it may share the split). Every rank audits its own view:
a candidate that routes by a rank's local piece routes differently on different ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from harness.algorithms import Algorithm, reference_of
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


def routes_of(
    algorithm: Algorithm, declared: Iterable[tuple[str, Tensor, bool]], opt: torch.optim.Optimizer, rank: int
) -> tuple[Route, ...]:
    """For each ``(name, candidate parameter, use_muon)``: the route declared for it and the one
    the candidate's state shows, on this rank (none where the reference declares no ``ROUTES``)."""
    if not algorithm.routes:
        return ()
    out = []
    for name, p, use_muon in declared:
        route = algorithm.route_of(use_muon)
        if route is not None:
            stepped = stepped_route(algorithm.routes, opt.state.get(p, {}))
            out.append(Route(name, tuple(p.shape), rank, route, stepped))
    return tuple(out)


def audit(
    case: Case, ref: torch.optim.Optimizer | None, opt: torch.optim.Optimizer, model: Any, rank: int
) -> tuple[Route, ...]:
    """Each case parameter the reference stepped (all of them without a reference), by ``routes_of``."""
    ref_params = by_name(ref)
    stepped = [s for s in case.params if ref is None or ref.state.get(ref_params[s.name])]
    return routes_of(reference_of(case), ((s.name, case_param(model, s.name), s.use_muon) for s in stepped), opt, rank)
