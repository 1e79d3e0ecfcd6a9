"""The compatibility matrix: every adapter through the gates, one row each.

    python -m harness.matrix --nproc 2 --profile dev -k "one_step or several_steps" \\
        distributed_impl:ShardedMuon examples.broken_muon:broken_muon examples.muon_fsdp2_adapter:muon_fsdp2

Each adapter runs in a pytest process of its own (``--impl SPEC``, its report under
``OUT/<slug>/``), so a crash in one cannot take the others down. Its cells come from that
run's own records (``reports.summary.summarize``): a cell per gate and one per layout family,
each in the report's words: ``bitwise``, ``in tier`` (within a named tolerance tier, with
max|diff|), ``within causes``, ``holds`` (the gate's own verdict with nothing to compare, e.g.
an input refused by name), ``differs`` (max|diff| and the minimal case), ``accepted`` (differs,
as a finding the ``--accept FILE`` given to every run names), ``crashes`` (hang, abort,
collective mismatch or error, with the message), ``not judged``, ``not supported`` (skipped
for a declaration the candidate made, named) or ``not run``; a cell counts the cases no tier
could judge beside its verdict. A cell counts only what ran the candidate: a gate of
muongate's own code (``judges``) is skipped under ``--impl`` and shows as ``not run``. Where an adapter leaves a
feature or layout undeclared, the matrix runs it once more with ``--probe-undeclared`` (its
report under ``OUT/<slug>-probe/``), and a cell it had narrowed or skipped for that says what
the package did there: ``not declared: tried: bitwise …``, ``… crashes …`` (``--no-probe``
leaves that out). ``--jobs N`` runs N adapters at once (each with its own ranks: on a
machine with cores to spare); the rows keep the order they were named in. The matrix is written as
``OUT/matrix.md``, ``OUT/matrix.html`` (a colour grid) and ``OUT/matrix.json`` (every cell and the
run that made it: what the docs page's grid is drawn from) and printed. ``--render`` runs
nothing and writes the three again from the runs under ``OUT`` (the same adapters named), as
this version reads their records.

A Newton–Schulz kernel (``--kernel MODULE:FN``, repeatable) gets a row of its own table: it
runs every kernel gate (``gates/test_kernel_gates.py``; ``-k`` chooses only the optimizers'
gates), and the optimizer it is plugged into is muongate's ``ShardedMuon``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reports.matrix import Cell, Matrix, Row, render_html, render_markdown, render_terminal
from reports.records import CaseResult, Header, Skip
from reports.stream import read_streams
from reports.summary import cause_reach_text, fmt, gate_outcome, summarize, worse

CRASHES = ("hang", "abort", "collective mismatch", "error")


@dataclass(frozen=True)
class Adapter:
    spec: str
    #: ``optimizer`` (``--impl``), ``kernel`` (``--kernel``), or ``probe`` (an optimizer run with ``--probe-undeclared``)
    kind: str = "optimizer"

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.spec)

    def package(self) -> str:
        """``name version`` of the package an optimizer adapter declares (``Candidate.package``), else the spec."""
        module, _, attr = self.spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except Exception as e:  # an adapter whose package does not import: its row says why
            return f"{self.spec} (does not import: {type(e).__name__}: {e})"
        from harness.candidates import declaration_of

        name = declaration_of(factory).package if self.kind == "optimizer" else None
        if name is None:
            return self.spec
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            return f"{name} (not installed)"


def run_adapter(adapter: Adapter, out: Path, args: argparse.Namespace) -> Row:
    """One adapter through the gates in its own pytest process; its row from its records."""
    directory = out / (adapter.slug + ("-probe" if adapter.kind == "probe" else ""))
    chosen = ["gates.test_kernel_gates", "--kernel"] if adapter.kind == "kernel" else ["gates", "--impl"]
    command = [
        sys.executable, "-m", "pytest", "--pyargs", chosen[0], "-m", "gate", "-q", "-p", "no:randomly",
        "-p", "no:cacheprovider", "--nproc", str(args.nproc), chosen[1], adapter.spec,
        "--hypothesis-profile", args.profile, f"--gate-report={directory}", "--gate-device", args.gate_device,
        *(["-k", args.k] if args.k and adapter.kind != "kernel" else []),
        *(["--against", args.against] if adapter.kind != "kernel" else []),
        *(["--reference", args.reference] if args.reference and adapter.kind != "kernel" else []),
        *(["--probe-undeclared"] if adapter.kind == "probe" else []),
        *(["--accept", str(Path(args.accept).resolve())] if args.accept and adapter.kind != "kernel" else []),
    ]  # fmt: skip
    noted = directory / _NOTE
    if args.render:  # the run this directory holds, read again
        note = noted.read_text(encoding="utf-8") if noted.exists() else ""
    else:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
            note = "" if done.returncode in (0, 1) else _usage(done.stdout + done.stderr)
        except subprocess.TimeoutExpired:
            note = f"the run took longer than {args.timeout:g} s and was stopped"
        directory.mkdir(parents=True, exist_ok=True)
        noted.write_text(note, encoding="utf-8")
    streams = sorted(directory.glob("results*.jsonl"))
    row = row_of(adapter.spec, adapter.package(), read_streams(streams) if streams else [], note, adapter.kind)
    if adapter.kind == "optimizer" and args.probe and _undeclared(row):
        probe = run_adapter(Adapter(adapter.spec, "probe"), out, args)
        row = with_probe(row, probe)
    return row


#: beside a run's records: why it ended without a verdict, if it did (``--render`` reads it again)
_NOTE = "matrix-note.txt"


def _undeclared(row: Row) -> bool:
    """Whether a row has cells narrowed or skipped for what its candidate did not declare."""
    return any(c.narrowed or _declined(c) for c in [*row.gates.values(), *row.layouts.values()])


def _declined(cell: Cell) -> bool:
    """A cell skipped for a feature or layout the candidate did not declare (not a device, not a convention)."""
    return cell.status == "not supported" and (
        cell.detail.startswith("its point narrowed away")
        or re.match(r"does not declare (?!cpu|cuda)", cell.detail) is not None
    )


def with_probe(row: Row, probe: Row) -> Row:
    """``row`` with what its package did where it declared nothing (``probe``: the same run with
    ``--probe-undeclared``): a skipped cell becomes ``not declared: tried: …``, a narrowed one says
    what the cases it narrowed did unnarrowed, and a layout family it never ran gets a cell."""

    def merged(cell: Cell | None, tried: Cell | None) -> Cell | None:
        if tried is None or tried.status in ("not supported", "not run"):
            return cell
        if cell is None or _declined(cell):
            return Cell("not declared", f"tried: {tried.text()}")
        if cell.narrowed:
            return dataclasses.replace(cell, detail=f"{cell.detail}; not declared, tried unnarrowed: {tried.text()}")
        return cell

    gates = {g: merged(c, probe.gates.get(g)) or c for g, c in row.gates.items()}
    tried = {f: merged(row.layouts.get(f), c) for f, c in probe.layouts.items()}
    layouts = {**row.layouts, **{f: c for f, c in tried.items() if c is not None}}
    return dataclasses.replace(row, gates=gates, layouts=layouts)


def _usage(text: str) -> str:
    """Why a run ended without a verdict: its last error line, else its last line."""
    lines = text.strip().splitlines() or ["no output"]
    errors = [line for line in lines if "error:" in line.lower() or "UsageError" in line]
    return (errors or lines)[-1][:300]


def row_of(spec: str, package: str, records: Sequence[object], note: str = "", kind: str = "optimizer") -> Row:
    """An adapter's cells from its run's records; of a run judged ``--against self``, from its
    comparisons with itself alone (those with the reference are in its own report)."""
    if next((r.against for r in reversed(records) if isinstance(r, Header)), "reference") == "self":
        records = [_with_itself(r) if isinstance(r, CaseResult) else r for r in records]
    summary = summarize(records)  # type: ignore[arg-type]
    cells: dict[str, Cell] = {}
    for g in summary.gates.values():
        if g.gate.startswith("negative:"):
            continue
        n = (g.cases, g.narrowed_cases)
        found = [f for f in summary.failures if f.gate == g.gate]  # one minimal case per kind of finding
        if g.failed_cases:
            crashed = any(f.finding in CRASHES for f in found)
            if g.accepted and not crashed:  # a finding the run's --accept file names, never bitwise
                cells[g.gate] = Cell("accepted", g.accepted, *n)
            else:
                cells[g.gate] = Cell("crashes" if crashed else "differs", "; ".join(_finding(f) for f in found), *n)
        elif g.cases == g.not_judged:
            cells[g.gate] = Cell("not judged", "every case differed where no tier can judge it", *n)
        else:
            # the cases judged, and those no tier could judge, which never count as passes
            unjudged = f"; {g.not_judged} of {g.cases} cases not judged" if g.not_judged else ""
            outcome = gate_outcome(g)
            if outcome == "within causes":
                cells[g.gate] = Cell(
                    "within causes",
                    f"{g.within_causes} within its causes, {cause_reach_text(g.cause_reach)}{unjudged}",
                    *n,
                )
            elif outcome == "in tier":
                tiers = ", ".join(sorted(g.tiers - {"bitwise"})) or "its own tier"
                worst = f", max|diff| {fmt(g.worst_abs_diff)}" if g.comparisons else ": the gate's own verdict in it"
                cells[g.gate] = Cell("in tier", f"{tiers}{worst}{unjudged}", *n)
            elif not g.comparisons:
                cells[g.gate] = Cell("holds", f"nothing compared: the gate's own verdict{unjudged}", *n)
            else:
                cells[g.gate] = Cell("bitwise", f"{g.bitwise}/{g.comparisons}{unjudged}", *n)
    for s in summary.skips:
        gate, declared = _declared_skip(s)
        if gate and gate not in cells:
            cells[gate] = Cell("not supported", declared, 0)
    layouts = {family: _layout_cell(cases) for family, cases in _by_layout(records).items()}
    h = summary.header
    commit = h.git_commit if h.git_commit != "unknown" else ""
    return Row(spec, package, h.torch, h.backend, cells, layouts, note, kind, h.against, commit)


def _with_itself(case: CaseResult) -> CaseResult:
    return dataclasses.replace(case, comparisons=tuple(c for c in case.comparisons if c.against == "self"))


def _layout_cell(cases: list[CaseResult]) -> Cell:
    """Every gate's cases of one layout family: crashes if any crashed, differs if any failed, else
    within causes where any was, bitwise or in a tier (cases not judged are counted, never as passes)."""
    failed = [c for c in cases if c.failed]
    n = (len(cases), sum(bool(c.narrowed) for c in cases))
    crashed = sorted({c.finding for c in failed if c.finding in CRASHES})
    if crashed:
        return Cell("crashes", f"{len(failed)} of {len(cases)} cases failed ({', '.join(crashed)} among them)", *n)
    if failed:
        return Cell("differs", f"{len(failed)} of {len(cases)} cases failed", *n)
    within = sum(c.status == "within causes" for c in cases)
    unjudged = sum(c.status == "not judged" for c in cases)
    if unjudged == len(cases):
        return Cell("not judged", f"{unjudged} of {len(cases)} cases not judged", *n)
    if within:
        rest = f", {unjudged} not judged" if unjudged else ""
        return Cell("within causes", f"{within} of {len(cases)} cases within its causes{rest}", *n)
    comparisons = [c for case in cases for c in case.comparisons]
    if all(c.bitwise for c in comparisons):
        return Cell("bitwise", f"{len(comparisons)}/{len(comparisons)}", *n)
    # a NaN is the worst there is, wherever it came (``max`` keeps or drops it by its place)
    worst = functools.reduce(worse, (c.max_abs_diff for c in comparisons), 0.0)
    return Cell("in tier", f"max|diff| {fmt(worst)}", *n)


def _declared_skip(s: Skip) -> tuple[str, str]:
    """A skip for something the candidate did or did not declare: ``(gate, what)``; else ``("", "")``."""
    m = re.match(r"(?P<gate>[\w:.×-]+): not run: .*? (?P<what>does not declare .+|declares conventions .+)$", s.reason)
    if m:
        return m["gate"], m["what"]
    m = re.match(r"(?P<gate>[\w:.×-]+): not run: narrowed for \S+: (?P<what>.+)$", s.reason)  # a hand-picked case
    return (m["gate"], f"its point narrowed away: {m['what']}") if m else ("", "")


def _by_layout(records: Sequence[object]) -> dict[str, list[CaseResult]]:
    families: dict[str, list[CaseResult]] = {}
    for r in records:
        if isinstance(r, CaseResult) and r.layout and not r.gate.startswith("negative:"):
            families.setdefault(r.layout, []).append(r)
    return families


def _finding(f: CaseResult) -> str:
    """One kind of finding of a gate: what it was, its minimal case, and its message or max|diff|."""
    if f.finding in CRASHES:
        first = f.message.strip().splitlines()[0] if f.message.strip() else ""
        first = first.removeprefix(f"{f.gate}: ").removeprefix(f"{f.finding}: ")[:200]
        return f"{f.finding} at {f.case}: {first}"
    worst = functools.reduce(worse, (c.max_abs_diff for c in f.comparisons if not c.passed), None)
    return f"{f.finding} (max|diff| {fmt(worst)}) at {f.case}"


def _this_run(argv: Sequence[str] | None) -> dict[str, str]:
    """What made this matrix: its command, the muongate commit it ran at (as a run's header
    names it), the date, and the machine."""
    import datetime
    import platform

    from harness.runinfo import muongate_commit

    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "command": " ".join(["python -m harness.matrix", *args]),
        "commit": muongate_commit(),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def _previous_run(out: Path) -> dict[str, str]:
    """The run a ``--render`` reads again, as its ``matrix.json`` names it (empty without one)."""
    try:
        return Matrix.from_json((out / "matrix.json").read_text(encoding="utf-8")).run
    except (OSError, ValueError, KeyError):
        return {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("adapters", nargs="*", metavar="MODULE:FACTORY", help="optimizers (--impl)")
    parser.add_argument(
        "--kernel", action="append", default=[], metavar="MODULE:FN", help="a Newton–Schulz kernel (repeatable)"
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--profile", default="dev", help="hypothesis profile of every run (default: dev)")
    parser.add_argument(
        "--gate-device", default="cpu", choices=("cpu", "cuda"), help="the ranks' devices (default: cpu)"
    )
    parser.add_argument("-k", default="", help="pytest -k expression: which gates run (default: all)")
    parser.add_argument(
        "--against",
        default="reference",
        choices=("reference", "self"),
        help="what the optimizers are judged against: their reference, or each one's own single-device self",
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="MODULE:CLASS",
        help="every optimizer's reference (default: the one each declares); none, with --against self, for none",
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds one adapter's run may take")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="adapters run at once, each in its own pytest process with its own ranks (default: 1)",
    )
    parser.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="do not run an adapter once more on the features and layouts it does not declare",
    )
    parser.add_argument("--out", default="muongate-matrix", help="directory for the runs and the matrix")
    parser.add_argument(
        "--accept", metavar="FILE", default=None, help="an accepted-findings file for every optimizer's run (--accept)"
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="run nothing: the matrix again from the runs under --out (the same adapters named), as this version reads them",
    )
    args = parser.parse_args(argv)
    bad = [f"--{name} {getattr(args, name):g}" for name in ("nproc", "jobs", "timeout") if getattr(args, name) <= 0]
    if bad:
        parser.error(f"{', '.join(bad)}: must be positive")
    if not args.adapters and not args.kernel:
        parser.error("name at least one adapter (MODULE:FACTORY) or --kernel MODULE:FN")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CI", "true")  # plain progress in the subprocesses' logs
    adapters = [Adapter(spec) for spec in args.adapters] + [Adapter(spec, "kernel") for spec in args.kernel]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        matrix = Matrix(list(pool.map(lambda adapter: run_adapter(adapter, out, args), adapters)))
    if args.render:
        matrix = dataclasses.replace(matrix, run=_previous_run(out))
    else:
        matrix = dataclasses.replace(matrix, run=_this_run(argv))
    (out / "matrix.md").write_text(render_markdown(matrix), encoding="utf-8")
    (out / "matrix.html").write_text(render_html(matrix), encoding="utf-8")
    (out / "matrix.json").write_text(matrix.to_json(), encoding="utf-8")
    render_terminal(matrix)
    print(f"muongate matrix: {out}/matrix.md, matrix.html, matrix.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
