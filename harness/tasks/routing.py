"""Which algorithm stepped each parameter (the routing audit): what its first step did, and the
state the candidate keeps.

What the step did decides. On each parameter's first step, each rank holds the full value and
gradient the reference stepped from and its own piece of the candidate's update; it steps a
fresh reference once per route (the reference's ``ROUTES``: a hybrid's ``use_muon`` side and its
AdamW side) from those, and names the route whose update this rank's piece is
(``stepped_by_update``): a correct candidate lands on its route's update (bitwise, or as close as
its declared causes), while the other route's is another update altogether (Muon's is
orthogonalized, AdamW's elementwise). A candidate that silently steps a matrix with AdamW is named
so whatever it calls its state, and whatever its single-device self did (it shares the split, so
``--against self`` cannot see it). Where the step does not tell the routes apart (no gradient on
the first step, a zero one, an empty piece), the state names the route: the one route whose
state tensors it holds. Every rank audits its own view: a candidate that routes by a rank's
local piece routes differently on different ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from harness.algorithms import Algorithm, reference_of
from harness.cases.case import Case
from harness.tasks.common import local_piece
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


#: how far (relative Frobenius) a piece of the candidate's update may lie from a route's and be
#: that route's: a correct candidate's first step is bitwise its route's, or within its declared
#: causes (at most about 1e-2 of it, bf16 Newton–Schulz in another form); Muon's and AdamW's
#: first steps of one gradient lie about 1 apart, so anything from 0.1 up is another route
SAME_STEP = 0.1


class FirstStep(NamedTuple):
    """One parameter's first step on one rank: the full value and gradient the reference stepped
    from, and this rank's piece of the candidate's update (after minus before, float32)."""

    before: Tensor
    grad: Tensor
    update: Tensor


def route_updates(algorithm: Algorithm, settings: Mapping[str, Any], before: Tensor, grad: Tensor) -> dict[str, Tensor]:
    """Each route's first update of ``before`` by ``grad``: a fresh reference with ``settings``,
    the parameter in that route's group (a hybrid's ``use_muon`` or AdamW group); a route that
    does not take the parameter (a vector in a Muon group) is left out."""
    out: dict[str, Tensor] = {}
    for use_muon in (True, False) if algorithm.hybrid else (True,):
        route = algorithm.route_of(use_muon)
        if route is None or route in out:
            continue
        p = torch.nn.Parameter(before.clone())
        p.grad = grad.clone()
        group = {"params": [p], "param_names": ["p"], **({"use_muon": use_muon} if algorithm.hybrid else {})}
        try:
            algorithm.factory([group], **settings).step()
        except (ValueError, TypeError):
            continue
        out[route] = p.detach().float() - before.float()
    return out


def stepped_by_update(updates: Mapping[str, Tensor], mine: Tensor, p: Tensor) -> str | None:
    """The route whose update (``route_updates``, full) this rank's piece ``mine`` of the
    candidate's is, within ``SAME_STEP``; ``unknown (…)`` where it is none of them; ``None`` where
    the routes' pieces cannot be told apart here (equal, or an empty piece)."""
    pieces = {route: local_piece(u, p).float() for route, u in updates.items()}
    if len(pieces) < 2 or mine.numel() == 0:
        return None
    first, *others = pieces.values()
    if all(torch.equal(first, o) for o in others):
        return None

    def distance(expected: Tensor) -> float:
        scale = max(expected.norm().item(), mine.norm().item(), 1e-30)
        return (mine - expected).norm().item() / scale

    far = {route: distance(piece) for route, piece in pieces.items()}
    close = [route for route, d in far.items() if d <= SAME_STEP]
    if len(close) == 1:
        return close[0]
    return f"{UNKNOWN} (an update {min(far.values()):.2g} from the nearest route's)"


def routes_of(
    algorithm: Algorithm,
    declared: Iterable[tuple[str, Tensor, bool]],
    opt: torch.optim.Optimizer,
    rank: int,
    *,
    first: Mapping[str, FirstStep] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Route, ...]:
    """For each ``(name, candidate parameter, use_muon)``: the route declared for it and the one
    its first step shows (``stepped_by_update``, where ``first`` holds it: the reference built
    with ``settings``), or where that cannot tell, the one the candidate's state shows, on this
    rank (none where the reference declares no ``ROUTES``)."""
    if not algorithm.routes:
        return ()
    out = []
    for name, p, use_muon in declared:
        route = algorithm.route_of(use_muon)
        if route is None:
            continue
        stepped = None
        if first and name in first:
            step = first[name]
            updates = route_updates(algorithm, settings or {}, step.before, step.grad)
            stepped = stepped_by_update(updates, step.update, p)
        if stepped is None:
            stepped = stepped_route(algorithm.routes, opt.state.get(p, {}))
        out.append(Route(name, tuple(p.shape), rank, route, stepped))
    return tuple(out)


def audit(
    case: Case,
    ref: torch.optim.Optimizer | None,
    opt: torch.optim.Optimizer,
    model: Any,
    rank: int,
    first: Mapping[str, FirstStep] | None = None,
) -> tuple[Route, ...]:
    """Each case parameter the reference stepped (all of them without a reference), by ``routes_of``."""
    ref_params = by_name(ref)
    stepped = [s for s in case.params if ref is None or ref.state.get(ref_params[s.name])]
    declared = ((s.name, case_param(model, s.name), s.use_muon) for s in stepped)
    return routes_of(reference_of(case), declared, opt, rank, first=first, settings=case.settings_dict())
