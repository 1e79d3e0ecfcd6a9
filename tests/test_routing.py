"""Claims about the routing audit's parts: which route a candidate's state shows
(``harness.tasks.routing``), the declared route of each group (``Algorithm.route_of``), and
the verdict over every rank (``harness.runner.routing``)."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from harness.algorithms import MUON, Algorithm
from harness.runner.routing import judge_routes
from harness.tasks.routing import NO_STATE, Route, route_updates, stepped_by_update, stepped_route
from reference import Adafactor, AdamW

T = torch.zeros(())


def test_the_state_names_the_route_whose_every_tensor_it_holds() -> None:
    routes = MUON.routes
    assert stepped_route(routes, {"momentum_buffer": T}) == "Muon"
    assert stepped_route(routes, {"exp_avg": T, "exp_avg_sq": T, "step": 3}) == "AdamW"
    assert stepped_route(routes, {"step": 3}) == NO_STATE
    assert stepped_route(routes, {}) == NO_STATE
    assert stepped_route(routes, {"exp_avg": T}) == "unknown (exp_avg)"
    assert stepped_route(routes, {"momentum_buffer": T, "exp_avg": T, "exp_avg_sq": T}).startswith("unknown")


def test_the_first_step_names_the_route_whose_update_it_is_whatever_the_state_is_called() -> None:
    """Muon's and AdamW's first steps of one gradient, from ``route_updates``: an update that is one
    of them names it; one that is neither is unknown; where the routes' updates are the same (a
    zero gradient, no decay) or the piece is empty, the step cannot tell, and the state decides."""
    torch.manual_seed(0)
    before, grad = torch.randn(6, 4), torch.randn(6, 4)
    updates = route_updates(MUON, dict(MUON.defaults), before, grad)
    assert set(updates) == {"Muon", "AdamW"}
    assert stepped_by_update(updates, updates["Muon"], before) == "Muon"
    assert stepped_by_update(updates, updates["AdamW"], before) == "AdamW"
    assert stepped_by_update(updates, updates["Muon"] * 1.01, before) == "Muon", "within the causes' reach"
    assert stepped_by_update(updates, -updates["Muon"], before).startswith("unknown (an update")
    still = route_updates(MUON, dict(MUON.defaults), before, torch.zeros(6, 4))
    assert stepped_by_update(still, still["Muon"], before) is None
    assert stepped_by_update(updates, torch.zeros(0, 4), before) is None
    vector = route_updates(MUON, dict(MUON.defaults), torch.randn(5), torch.randn(5))
    assert set(vector) == {"AdamW"} and stepped_by_update(vector, vector["AdamW"], before) is None


def test_a_hybrid_reference_declares_its_own_route_for_use_muon_and_adamw_for_the_rest() -> None:
    assert (MUON.route_of(True), MUON.route_of(False)) == ("Muon", "AdamW")
    adamw = Algorithm.of(AdamW)
    assert (adamw.route_of(True), adamw.route_of(False)) == ("AdamW", "AdamW")
    assert Algorithm.of(Adafactor).route_of(True) is None


def _routes(*stepped: str, declared: str = "Muon") -> list[Route]:
    return [Route("w0", (4, 4), rank, declared, s) for rank, s in enumerate(stepped)]


def test_a_matrix_stepped_as_adamw_on_one_rank_is_red_and_names_the_ranks() -> None:
    rows, status, message = judge_routes(_routes("Muon", "AdamW"))
    assert status == "failed" and rows == (("w0[4, 4]", "Muon", "Muon on rank 0; AdamW on rank 1", "wrong"),)
    assert "w0[4, 4]: declared Muon, stepped as Muon on rank 0; AdamW on rank 1" in message


def test_a_state_that_shows_no_route_is_never_green_by_itself() -> None:
    assert judge_routes(_routes(NO_STATE, NO_STATE))[1] == "not judged"
    assert judge_routes([])[1] == "not judged"
    mixed = [*_routes("Muon", "Muon"), Route("b", (4,), 0, "AdamW", "unknown (m)")]
    rows, status, message = judge_routes(mixed)
    assert status == "passed" and rows[1][3] == "not shown" and "not shown by its state: b[4]" in message


def test_the_terminal_names_only_the_parameters_not_as_declared_and_the_files_list_them_all() -> None:
    from reports import render, to_markdown
    from reports.records import Header, Routing
    from reports.summary import summarize

    ok = Routing("routing:transformer", "world 2, fsdp, 1 step", "candidate", (("w0[4, 4]", "Muon", "Muon", "ok"),))
    wrong = Routing("training", "the dense model, world 2", "candidate",
                    (("w0[4, 4]", "Muon", "Muon", "ok"), ("w1[4, 4]", "Muon", "AdamW on rank 1", "wrong")))  # fmt: skip
    summary = summarize([Header(), ok, wrong])
    buffer = io.StringIO()
    Console(file=buffer, width=200, no_color=True).print(render(summary))
    terminal = buffer.getvalue()
    assert (
        "routing audit · routing:transformer: candidate on world 2, fsdp, 1 step: 1 parameter: 1 Muon as declared"
        in terminal
    )
    assert "w1[4, 4]" in terminal and "AdamW on rank 1" in terminal and "w0[4, 4]" not in terminal.split("training")[-1]
    markdown = to_markdown(summary)
    assert (
        markdown.count("| w0[4, 4] | Muon | Muon | ok |") == 2
        and "| w1[4, 4] | Muon | AdamW on rank 1 | wrong |" in markdown
    )
