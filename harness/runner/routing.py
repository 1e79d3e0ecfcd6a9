"""The routing audit's verdict: every rank's routes (``harness.tasks.routing.Route``) of one case
folded into one row per parameter, and whether the case stepped each as declared."""

from __future__ import annotations

from collections.abc import Iterable

from harness.tasks.routing import NO_STATE, UNKNOWN, Route
from reports.records import Status

Row = tuple[str, str, str, str]


def _stepped(by_rank: dict[int, str]) -> str:
    """The route every rank shows, or each route with the ranks that show it."""
    ranks: dict[str, list[int]] = {}
    for rank, stepped in sorted(by_rank.items()):
        ranks.setdefault(stepped, []).append(rank)
    if len(ranks) == 1:
        return next(iter(ranks))
    return "; ".join(f"{s} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}" for s, r in ranks.items())


def _verdict(declared: str, shown: set[str]) -> str:
    """``ok`` where every rank shows the declared route; ``wrong`` where some rank shows another
    of the reference's routes; ``not shown`` where the state shows none."""
    if shown == {declared}:
        return "ok"
    if any(s not in (declared, NO_STATE) and not s.startswith(UNKNOWN) for s in shown):
        return "wrong"
    return "not shown"


def judge_routes(routes: Iterable[Route]) -> tuple[tuple[Row, ...], Status, str]:
    """Rows (parameter, declared, stepped as, verdict), the case's status and its message: red
    where a parameter stepped as another algorithm on some rank; a parameter whose state shows
    none (none kept, or none muongate can read by the reference's ``ROUTES``) is never green by
    itself, so a case none of whose parameters showed its route is not judged."""
    by_param: dict[tuple[str, tuple[int, ...], str], dict[int, str]] = {}
    for r in routes:
        by_param.setdefault((r.name, tuple(r.shape), r.declared), {})[r.rank] = r.stepped
    rows = tuple(
        (f"{name}{list(shape)}", declared, _stepped(by_rank), _verdict(declared, set(by_rank.values())))
        for (name, shape, declared), by_rank in by_param.items()
    )
    wrong = [
        f"{name}: declared {declared}, stepped as {stepped}" for name, declared, stepped, v in rows if v == "wrong"
    ]
    unshown = [name for name, _, _, v in rows if v == "not shown"]
    if wrong:
        return rows, "failed", "stepped by another algorithm than declared:\n" + "\n".join(wrong)
    if len(unshown) == len(rows):
        why = f"the state of {', '.join(unshown)} shows no algorithm" if rows else "no parameter was stepped"
        return rows, "not judged", f"routing not judged: {why}"
    note = f"; not shown by its state: {', '.join(unshown)}" if unshown else ""
    return rows, "passed", f"every parameter stepped as declared{note}"
