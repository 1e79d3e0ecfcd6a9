"""Replaying a captured layout (``harness.capture``; issue #52): a user's own parameters and
placements as the cases the gates run (``--layout-from=FILE``).

Each mesh of the file becomes one case of every parameter laid out on it, in the layout family
whose builder lays that parameter out exactly so (``harness.layouts``: ``fully_shard``,
``parallelize_module`` by style, both, HSDP, expert parallelism): a parameter's captured
placements must be what that builder gives it, and every rank's captured piece what the
placements give (``local_shapes``, ``torch.chunk``'s split as DTensor pads it), or the
parameter is not replayed and the report says why.

A mesh of at most ``--nproc`` ranks replays as captured (a multi-dim mesh the pool does not
make on its own is made at start-up: ``Replay.grids``). A larger one replays on a reduced mesh
(each dim but the last at most 2, the last what the ranks left allow), each sharded dim of each
parameter resized so that its pieces keep the sizes the captured ranks held: the full chunk,
the uneven remainder, the empty piece, as many of them as that mesh can show (``reduced``). What
was kept and what was not is written, per parameter, into the report's header.

The file fixes what it holds: shapes, dtypes, which parameter each algorithm steps, and the
settings of the first group that is not AdamW where the session's reference takes them (a value
it refuses is drawn instead, and said). Hypothesis still draws the values, the steps and the
settings the file leaves open (``harness.cases.strategies.replay_cases``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness import layouts
from harness.capture import Capture
from harness.cases.case import Case, ParamSpec, Style, optimizer_settings, stored_setting
from harness.layouts import Layout, Placement
from reports.records import Unjudged

if TYPE_CHECKING:
    from harness.algorithms import Algorithm

_PLACEMENT = re.compile(r"^(?P<kind>_StridedShard|Shard|Replicate|Partial)\((?:dim=(?P<dim>\d+))?(?:, sf=(?P<sf>\d+))?")
_DTYPES = ("float32", "bfloat16")
_STYLES: tuple[Style, ...] = ("colwise", "rowwise", "replicate")


def parse_placement(text: str) -> Placement:
    """A placement as ``repr`` writes it (``Shard(dim=0)``, ``_StridedShard(dim=0, sf=2)``,
    ``Replicate()``, ``Partial(sum)``), as a tuple the replay compares."""
    m = _PLACEMENT.match(text)
    if m is None:
        raise ValueError(f"placement {text!r} is not one muongate knows")
    kind = m["kind"]
    if kind == "Shard":
        return ("shard", int(m["dim"]))
    if kind == "_StridedShard":
        return ("strided", int(m["dim"]), int(m["sf"]))
    return (kind.lower(),)


def _pieces(size: int, parts: int) -> list[int]:
    """``torch.chunk``'s split of ``size`` into ``parts``, padded with empty pieces as a
    DTensor ``Shard`` holds them."""
    chunk = -(-size // parts)
    return [max(0, min(chunk, size - i * chunk)) for i in range(parts)]


def local_shapes(
    shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Placement]
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each mesh coordinate and the local shape ``placements`` give it: shards in mesh-dim
    order, a strided shard after the later dims (it splits the piece they left, as FSDP2
    splits a TP piece)."""
    order = [d for d, p in enumerate(placements) if p[0] != "strided"]
    order += [d for d in reversed(range(len(placements))) if placements[d][0] == "strided"]
    for coord in itertools.product(*(range(n) for n in mesh)):
        local = list(shape)
        for d in order:
            if placements[d][0] in ("shard", "strided"):
                dim = placements[d][1]
                local[dim] = _pieces(local[dim], mesh[d])[coord[d]]
        yield coord, tuple(local)


def _sizes(size: int, dim: int, mesh: Sequence[int], placements: Sequence[Placement]) -> set[int]:
    """The piece sizes of tensor dim ``dim`` (of ``size``) over every coordinate of ``mesh``."""
    shape = [1] * (1 + max([dim, *(p[1] for p in placements if p[0] in ("shard", "strided"))]))
    shape[dim] = size
    return {local[dim] for _, local in local_shapes(shape, mesh, placements)}


def reduced(
    size: int, dim: int, captured: set[int], mesh: Sequence[int], placements: Sequence[Placement], *, empty_ok: bool
) -> int:
    """The size of tensor dim ``dim`` on the reduced ``mesh`` whose pieces keep the most of the
    ``captured`` piece sizes, the full chunk (the largest) first, adding the fewest others, the
    smallest such (``empty_ok``: an empty piece may appear where none was captured)."""
    split = math.prod(n for n, p in zip(mesh, placements, strict=True) if p[0] in ("shard", "strided") and p[1] == dim)
    best: tuple[tuple[int, bool, int, int], int] | None = None
    for new in range(1, max(captured) * split + 1):
        pieces = _sizes(new, dim, mesh, placements)
        if not empty_ok and 0 in pieces and 0 not in captured:
            continue
        score = (len(pieces & captured), max(captured) in pieces, -len(pieces - captured), -new)
        if best is None or score > best[0]:
            best = (score, new)
    return size if best is None else best[1]


@dataclass(frozen=True)
class Replayed:
    """One mesh of a capture as the case the gates run: its parameters, world, mesh and
    degrees, with the settings the file fixes; seed, steps and the other settings are drawn."""

    case: Case
    #: the settings the file fixes (the others are drawn)
    fixed: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Replay:
    """A capture file made into the cases the gates replay (``replay``)."""

    capture: Capture
    meshes: tuple[Replayed, ...]
    #: what the report says: the file, then what each mesh and parameter kept and did not
    lines: tuple[str, ...]
    #: every captured parameter not replayed, and why: the ledger's unjudged parts, each named
    #: by the user's file (``--layout-from``), so each fails the session unless ``--allow-unjudged``
    unjudged: tuple[Unjudged, ...] = ()

    @property
    def grids(self) -> tuple[tuple[int, ...], ...]:
        """The multi-dim meshes the replayed cases run on (the pool makes their groups)."""
        return tuple(sorted({r.case.mesh for r in self.meshes if len(r.case.mesh) > 1}))


class _Notes:
    """What the replay says (``lines``) and the parameters it could not replay (``unjudged``)."""

    def __init__(self, first: str) -> None:
        self.lines = [first]
        self.unjudged: list[Unjudged] = []

    def append(self, line: str) -> None:
        self.lines.append(line)

    def drop(self, names: Iterable[str], reason: str, *, where: str = "") -> None:
        """``names`` are not replayed, for ``reason`` (of the mesh ``where``, for all of them at once)."""
        names = list(names)
        self.lines.append(f"{where or ', '.join(names)}: not replayed: {reason}")
        self.unjudged += [Unjudged(f"parameter {n}", f"{where}: {reason}" if where else reason) for n in names]


def stepped_as(captured: str, algorithm: Algorithm) -> bool | None:
    """Which side of ``algorithm`` steps a parameter the capture says ``captured`` stepped: its
    own (``True``: a hybrid's ``use_muon`` side, any other's only side), a hybrid's AdamW side
    (``False``), or neither (``None``: the reference has no side that is that optimizer).

    ``captured`` is a hybrid group's ``muon`` or ``adamw`` (``use_muon``), or the class name of
    the optimizer that stepped the group: ``Adam…`` is AdamW's, a name ending in the family's
    (``Muon``, ``ShardedMuon``, ``DistMuon`` for ``reference.Muon``; ``NorMuon`` is not Muon's)."""
    name, family = captured.lower(), algorithm.name.lower()
    if name == "muon":
        return True if algorithm.hybrid else None
    if name.endswith(family) and not (family == "muon" and name.endswith("normuon")):
        return True
    if name.startswith("adam"):
        return False if algorithm.hybrid else None
    return None


def _identifier(name: str, taken: set[str]) -> str:
    """A parameter name as the gates' modules hold it: ``layers.0.wq.weight`` → ``layers_0_wq_weight``."""
    base = re.sub(r"\W", "_", name) or "p"
    base = f"p{base}" if base[0].isdigit() else base
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


def _match(
    family: Layout, param: Mapping[str, Any], placements: tuple[Placement, ...], mesh: Sequence[int]
) -> Style | None:
    """The style in which ``family``'s builder lays ``param`` out with ``placements`` (``None``: none does)."""
    ndim = len(param["shape"])
    styles = _STYLES if "tp" in family.dims and ndim == 2 else _STYLES[:1]
    return next((s for s in styles if family.lays_out(s, ndim, mesh) == placements), None)


def _smaller_mesh(mesh: tuple[int, ...], nproc: int) -> tuple[int, ...] | None:
    """The reduced mesh a mesh of more than ``nproc`` ranks replays on (``None``: none keeps
    every dim split)."""
    if len(mesh) == 1:
        return (nproc,) if nproc > 1 else None
    head = tuple(min(n, 2) for n in mesh[:-1])
    last = min(mesh[-1], nproc // math.prod(head))
    out = (*head, last)
    return out if all(n >= min(2, m) for n, m in zip(out, mesh, strict=True)) else None


#: an AdamW group's settings as a hybrid reference names them for its AdamW side
_ADAMW_SIDE = {"lr": "adamw_lr", "betas": "adamw_betas", "eps": "adamw_eps", "weight_decay": "adamw_weight_decay"}


def _settings(capture: Capture, algorithm: Algorithm, notes: _Notes) -> tuple[tuple[str, Any], ...]:
    """The settings the file fixes: those of the first group the reference's own side steps, and
    (a hybrid reference) those of the first group its AdamW side steps, under the AdamW side's
    names (``adamw_lr``, …); each checked by building the reference with it; a refused one is drawn."""
    import torch
    from torch import nn

    def first(side: bool) -> Mapping[str, Any]:
        groups = (p.get("settings") for p in capture.params if stepped_as(str(p["algorithm"]), algorithm) is side)
        return next((g for g in groups if g), {})

    own = {k: v for k, v in first(True).items() if k not in _ADAMW_SIDE.values()}
    adamw = {_ADAMW_SIDE[k]: v for k, v in first(False).items() if k in _ADAMW_SIDE}
    group = {**own, **adamw}
    if not group:
        return ()
    defaults = {k: stored_setting(k, v) for k, v in algorithm.defaults.items()}
    fixed = []
    for key, value in group.items():
        if key not in defaults or key == "use_muon":
            continue
        value = _tupled(stored_setting(key, value))  # a dtype by name, a list as the tuple it was
        try:
            algorithm.factory([nn.Parameter(torch.zeros(2, 2))], **optimizer_settings({**defaults, key: value}.items()))
        except (ValueError, TypeError, AttributeError) as e:
            notes.append(f"setting {key}={value!r}: drawn instead ({str(e).splitlines()[0]})")
            continue
        fixed.append((key, value))
    return tuple(fixed)


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def replay(capture: Capture, *, nproc: int, algorithm: Algorithm) -> Replay:
    """The cases that replay ``capture`` on a pool of ``nproc`` ranks for ``algorithm`` (a family,
    ``harness.algorithms``), and what they kept."""
    notes = _Notes(capture.summary())
    fixed = _settings(capture, algorithm, notes)
    by_mesh: dict[tuple[tuple[int, ...], tuple[Any, ...]], list[tuple[Mapping[str, Any], tuple[Placement, ...]]]] = {}
    for p in capture.params:
        layout = p["layout"]
        if "mesh" not in layout:
            notes.drop([p["name"]], "a plain tensor on every rank (not a DTensor); muongate lays out DTensors")
            continue
        try:
            placements = tuple(parse_placement(t) for t in layout["placements"])
        except ValueError as e:
            notes.drop([p["name"]], str(e))
            continue
        mesh = tuple(layout["mesh"]["shape"])
        ranks = tuple(itertools.chain.from_iterable(_flat(layout["mesh"]["ranks"])))
        by_mesh.setdefault((mesh, ranks), []).append((p, placements))
    meshes = [
        m
        for (mesh, ranks), params in by_mesh.items()
        if (m := _mesh_case(mesh, ranks, params, nproc, algorithm, fixed, notes))
    ]
    return Replay(capture, tuple(meshes), tuple(notes.lines), tuple(notes.unjudged))


def _flat(ranks: Any) -> Iterable[list[int]]:
    """The rows of a nested list of ranks."""
    if ranks and isinstance(ranks[0], list):
        for row in ranks:
            yield from _flat(row)
    else:
        yield list(ranks)


def _mesh_case(
    mesh: tuple[int, ...],
    ranks: tuple[int, ...],
    params: list[tuple[Mapping[str, Any], tuple[Placement, ...]]],
    nproc: int,
    algorithm: Algorithm,
    fixed: tuple[tuple[str, Any], ...],
    notes: _Notes,
) -> Replayed | None:
    where = f"mesh {list(mesh)}"
    families = layouts.replayed(len(mesh))
    # on a tie (a 1-D mesh of row-split matrices is FSDP2's and TP's alike; matrices alone are
    # HSDP's and expert parallelism's alike), the mesh's dim names decide: muongate's own, then a "tp"
    dims = tuple(params[0][0]["layout"]["mesh"].get("dim_names") or ())
    scored = [
        (
            sum(_match(f, p, pl, mesh) is not None for p, pl in params),
            dims == f.dims,
            ("tp" in dims) == ("tp" in f.dims),
            -i,
            f,
        )
        for i, f in enumerate(families)
    ]
    names = [p["name"] for p, _ in params]
    if not scored or max(scored)[0] == 0:
        notes.drop(names, "no muongate layout lays it out as captured", where=where)
        return None
    family = max(scored)[-1]
    world = math.prod(mesh)
    target = mesh if world <= nproc else _smaller_mesh(mesh, nproc)
    if target is None:
        notes.drop(names, f"a split on each of its dims needs --nproc {2 ** len(mesh)} or more", where=where)
        return None
    notes.append(
        f"{where} ({family.title}): as captured, {world} ranks"
        if target == mesh
        else f"{where} ({family.title}) of {world} ranks: on mesh {list(target)}, {math.prod(target)} ranks"
    )
    taken: set[str] = set()
    specs = []
    for p, placements in params:
        spec = _param(p, placements, family, mesh, ranks, target, algorithm, taken, notes)
        if spec is not None:
            specs.append(spec)
    if not specs:
        return None
    case = Case(
        params=tuple(specs), world_size=math.prod(target), mesh=target, layout=family, reference=algorithm.in_case,
        label=f"replay of {where}",
    )  # fmt: skip
    return Replayed(case, fixed)


def _param(
    p: Mapping[str, Any],
    placements: tuple[Placement, ...],
    family: Layout,
    mesh: tuple[int, ...],
    ranks: tuple[int, ...],
    target: tuple[int, ...],
    algorithm: Algorithm,
    taken: set[str],
    notes: _Notes,
) -> ParamSpec | None:
    """One captured parameter as a ``ParamSpec`` on ``target``, or why not (into ``notes``)."""
    name, shape = p["name"], tuple(p["shape"])
    style = _match(family, p, placements, mesh)
    said = ", ".join(p["layout"]["placements"])
    if style is None:
        notes.drop([name], f"{family.title} does not lay out a {len(shape)}-D parameter as ({said})")
        return None
    if p["dtype"] not in _DTYPES:
        notes.drop([name], f"dtype {p['dtype']}; the gates run {' and '.join(_DTYPES)}")
        return None
    captured = [r["local_shape"] for r in p["layout"]["ranks"]]
    for coord, local in local_shapes(shape, mesh, placements):
        rank = ranks[sum(c * math.prod(mesh[d + 1 :]) for d, c in enumerate(coord))]
        if rank >= len(captured) or tuple(captured[rank]) != local:
            held = captured[rank] if rank < len(captured) else "nothing"
            notes.drop([name], f"rank {rank} holds {held}, where ({said}) gives {list(local)}")
            return None
    side = stepped_as(str(p["algorithm"]), algorithm)
    if side is None:
        notes.drop([name], f"stepped by {p['algorithm']}, which {algorithm.title} does not step")
        return None
    use_muon = side
    if use_muon and len(shape) not in algorithm.ndims:
        notes.append(f"{name}: {len(shape)}-D, which {algorithm.name} does not step: stepped by AdamW")
        use_muon = False
    if not algorithm.hybrid and not use_muon:
        notes.drop([name], f"{algorithm.name} steps no {len(shape)}-D parameter")
        return None
    new = shape
    if target != mesh:
        new = tuple(
            _resized(d, shape, placements, ranks, captured, target, style, family, name, notes)
            for d in range(len(shape))
        )
    return ParamSpec(_identifier(name, taken), new, p["dtype"], use_muon=use_muon, style=style)


def _resized(
    d: int,
    shape: tuple[int, ...],
    placements: tuple[Placement, ...],
    ranks: tuple[int, ...],
    captured: list[list[int]],
    target: tuple[int, ...],
    style: Style,
    family: Layout,
    name: str,
    notes: _Notes,
) -> int:
    """Dim ``d`` of a parameter on the reduced ``target`` mesh, and a note of what it kept."""
    if not any(p[0] in ("shard", "strided") and p[1] == d for p in placements):
        return shape[d]
    held = {captured[r][d] for r in ranks}
    placements = family.lays_out(style, len(shape), target)  # a strided split factor is the new tp
    # a row-wise piece with no columns under FSDP2 over TP is one DTensor cannot gather (layout_cases)
    over_tp = "tp" in family.dims and len(family.dims) > 1  # FSDP2 over TP
    empty_ok = not (style == "rowwise" and d == 1 and over_tp)
    new = reduced(shape[d], d, held, target, placements, empty_ok=empty_ok)
    pieces = _sizes(new, d, target, placements)
    kept, lost = sorted(held & pieces, reverse=True), sorted(held - pieces, reverse=True)
    notes.append(
        f"{name}: dim {d} {shape[d]} → {new}: pieces of {', '.join(map(str, kept))} kept"
        + (f"; {', '.join(map(str, lost))} not kept" if lost else "")
    )
    return new
