"""Known, understood differences from the reference ("causes"), and the tier each is judged in.

A candidate whose arithmetic differs from ``reference.Muon`` for a stated cause fails every
bitwise gate, and a real bug could hide in that failure. It declares its causes
(``Candidate.differences``), and the cause gate holds it, over ``STEPS`` steps, to tiers
calibrated on exactly those causes, for the very setting of the case: Nesterov on or off,
the parameter's dtype, the Newton–Schulz dtype, and the shape family (square, wide, tall).
After every step it judges each tensor of ``KINDS``: the parameter's change since the start
(``update``) and the momentum buffer, each with a tier of its own for that step. A bug that
first shows at the second step, or only in the state, meets its own bound there.

Calibration is measured on the gate's device when a setting is first asked for: on
``SAMPLES`` random matrices of the family, each with ``STEPS`` random gradients, the relative
Frobenius error of each tensor after each step

* of a **correct variant**: the reference with the causes emulated, against the reference;
* of **wrong variants** (``BUGS``), the causes emulated and a plausible bug added: one
  Newton–Schulz iteration fewer; the lr scale taken from a shard of half the rows (tall
  matrices); the momentum restarted from zero every step (first shows at the second step);
  the momentum buffer normalized in place when it is the update itself (Nesterov off: the
  step's update is right, the state is not).

A tensor's bound at a step is ``MARGIN`` (3) times the worst correct error there: anything
farther from the reference's is an error the causes do not explain. Every wrong variant must
be beyond the bound, on every sample, for some tensor at some step; where one is not, the
tiers cannot judge that setting and say so (``NotSeparable``). The cause gate runs at lr 1, so
that a bf16 weight's own rounding is small beside its update.

Such a candidate differs from the reference in every bitwise gate, by design, and a bug that
shows only where the cause gate does not look (weight decay, several matrices, other world sizes
and settings) could hide in those differences. So each case of a bitwise gate that differs is
judged by its setting's tier (``judge_causes``), measured at the case's own settings, lr and
weight decay included (``correct_reach``): green, ``within causes``, where every difference lies
inside it; red, ``beyond its causes``, where a tensor lies past ``UNSURE`` (2) times it
(``BEYOND`` (10) times past is counted apart, as far past); and ``not judged``, each tensor named
with why, where no tier can judge the difference or it lies between the tier and twice it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import reference
import reference.muon as reference_muon
from harness.algorithms import ANY_FAMILY, reference_of
from harness.cases import case as case_module
from harness.cases.case import Case, optimizer_settings
from harness.verdicts.compare import Tier
from harness.verdicts.kept import kept
from reports.records import Comparison

#: the causes that change no value, only a zero's sign (``harness.algorithms.ANY_FAMILY``): their
#: tier is equality in value, for any algorithm; the others are Muon's arithmetic
#: (``reference.MUON_CAUSES``), emulated and calibrated here
SIGN_ONLY = frozenset(ANY_FAMILY)
#: square; wide (fewer rows than columns); tall (at least twice the rows, where the lr scale
#: √(rows/cols) stays above one even on half the rows); and a little tall, in between
FAMILIES = ("square", "wide", "tall", "a little tall")
SAMPLES = 48
#: an update may be this many times as far from the reference's as the correct variants reach
MARGIN = 3.0
#: the least bound, where the causes change nothing at a setting (a float32 parameter's bf16 momentum)
FLOOR = 2.0**-20
#: the steps a cause case runs, and the tensors it judges after each
STEPS = 3
KINDS = ("update", "momentum_buffer")
#: the wrong variants' bugs (see the module docstring)
BUGS = ("one_iteration_fewer", "half_rows_lr", "momentum_restart", "buffer_normalized")


class NotSeparable(ValueError):
    """The correct and wrong variants of a setting overlap: no tier can tell them apart."""


def family_of(shape: tuple[int, ...]) -> str:
    """The family (``FAMILIES``) of a matrix's shape."""
    rows, cols = shape[-2:]
    return "square" if rows == cols else "wide" if rows < cols else "tall" if rows >= 2 * cols else "a little tall"


def shape_in(family: str, small: int, large: int) -> tuple[int, int]:
    """A matrix of ``family`` from two sizes ``1 <= small <= large``."""
    if family == "square":
        return large, large
    if family == "wide":
        return small, large + 1
    if family == "tall":
        return 2 * large, small
    cols = max(2, small)
    return cols + 1 + large % (cols - 1), cols


def _newton_schulz(G: Tensor, group: dict[str, Any], causes: frozenset[str]) -> Tensor:
    """Newton–Schulz with the group's coefficients, eps form and dtype, and the causes that
    change it: the plain form (``plain_quintic``); the norm taken in float32
    (``fp32_normalize``); the plain form as Inductor compiles it (``fused_quintic``), the
    products rounded to the Newton–Schulz dtype as eager ones are, but each fused elementwise
    kernel (the norm and the division of the rounded input; ``b·A + c·A²``; ``a·X + B@X``)
    computing in float32 and rounding once, where eager rounds the norm and every product by a
    coefficient."""
    schedule, safety = reference.coefficient_schedule(group["ns_coefficients"])
    low = group["ns_dtype"]
    fused = "fused_quintic" in causes
    start = G.to(low) if fused else G  # the compiled kernel normalizes the rounded input, in float32
    X = start.to(torch.float32 if fused or "fp32_normalize" in causes else low, copy=True)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    norm = X.norm() * safety
    X = X / (norm + group["eps"]) if group["eps_form"] == "add" else X / norm.clamp(min=group["eps"])
    X = X.to(low)
    for i in range(group["ns_steps"]):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = X @ X.mT
        if fused:
            B = (b * A.float() + c * (A @ A).float()).to(low)
            X = (a * X.float() + (B @ X).float()).to(low)
        elif "plain_quintic" in causes:
            X = a * X + (b * A + c * (A @ A)) @ X
        else:
            X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X.mT if tall else X


def _momentum(buf: Tensor, g: Tensor, group: dict[str, Any], low: bool) -> Tensor:
    """Advances ``buf`` and returns the update: the reference's float32 momentum, or (``low``,
    the ``bf16_momentum`` cause) a buffer in the parameter's dtype, updated in it."""
    momentum, nesterov = group["momentum"], group["nesterov"]
    if not low:
        return reference.momentum_update(buf, g, momentum, nesterov, group["momentum_form"])
    grad = g.to(buf.dtype)
    if group["momentum_form"] == "ema":
        buf.lerp_(grad, 1 - momentum)
        return torch.lerp(grad, buf, momentum) if nesterov else buf
    buf.mul_(momentum).add_(grad)
    return grad.add(buf, alpha=momentum) if nesterov else buf


def trajectory(
    p: Tensor, grads: list[Tensor], group: dict[str, Any], causes: frozenset[str], bug: str | None = None
) -> list[dict[str, Tensor]]:
    """Each step of Muon from zero momentum on ``p``, at the group's settings (the cause gate's
    have no weight decay), with ``causes`` emulated and ``bug`` (of ``BUGS``) planted: after each
    step, the parameter's float32 change since the start (``update``) and the momentum buffer
    (float32), by ``KINDS``."""
    low = "bf16_momentum" in causes and p.dtype == torch.bfloat16
    buf = torch.zeros(p.shape, dtype=p.dtype if low else torch.float32, device=p.device)
    rows, cols = p.shape
    scale = reference.lr_scale((max(1, rows // 2) if bug == "half_rows_lr" else rows, cols), group["adjust_lr_fn"])
    settings = {**group, "ns_steps": group["ns_steps"] - (bug == "one_iteration_fewer")}
    changed = causes & {"plain_quintic", "fused_quintic", "fp32_normalize"}
    after = p.clone()
    out = []
    for g in grads:
        if bug == "momentum_restart":
            buf.zero_()
        update = _momentum(buf, g, group, low)
        ortho = (
            _newton_schulz(update, settings, changed) if changed else reference.group_orthogonalizer(settings)(update)
        )
        if bug == "buffer_normalized":
            buf.div_(buf.float().norm() + group["eps"])
        lr, decay = group["lr"], group["weight_decay"]
        if "decay_rounded" in causes and decay:
            after.mul_(1 - lr * decay)  # in the parameter's dtype: a bf16 one is rounded once more
            decay = 0.0
        if "scaled_update" in causes:
            reference.apply_update(after, ortho * scale, lr, decay, lr)
        else:
            reference.apply_update(after, ortho, lr, decay, lr * scale)
        out.append({"update": after.float() - p.float(), "momentum_buffer": buf.float().clone()})
    return out


def _shape(family: str, gen: torch.Generator) -> tuple[int, int]:
    small, large = sorted(int(x) for x in torch.randint(1, 33, (2,), generator=gen))  # as the gate draws them
    return shape_in(family, small, large)


def _rel_fro(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp(min=1e-30))


def _bugs(group: dict[str, Any], family: str) -> list[str]:
    """The wrong variants a setting can show: each needs what it breaks."""
    bugs = ["one_iteration_fewer"] if group["ns_steps"] >= 1 else []
    if family in ("tall", "a little tall"):  # only a tall matrix's lr scale depends on its rows
        bugs.append("half_rows_lr")
    if group["momentum"] > 0:
        bugs.append("momentum_restart")
    if not group["nesterov"]:  # with Nesterov the update is a tensor of its own
        bugs.append("buffer_normalized")
    return bugs


#: a setting's tiers: one for each (tensor kind, step)
CauseTiers = dict[tuple[str, int], Tier]


def _at(kind: str, step: int) -> str:
    return f"{kind} {step}"


def _errors(
    causes: frozenset[str],
    group: dict[str, Any],
    dtype: str,
    family: str,
    device: str,
    *,
    samples: int,
    steps: int,
    bugs: list[str],
    grad_scale: float = 1.0,
    grad_dtype: str = "float32",
    also: tuple[int, int] | None = None,
) -> dict[str, dict[str, float]]:
    """On ``samples`` random matrices of ``family`` (in ``dtype``, each with ``steps`` gradients,
    ``grad_scale`` times a normal one, in ``grad_dtype``), and as many more of shape ``also``
    if given, for each tensor and step (``_at``): the worst relative error of the correct
    variants (``"correct"``) and the least of each wrong one (by bug), against the reference."""
    gen = torch.Generator().manual_seed(0)
    where = [(kind, step) for step in range(steps) for kind in KINDS]
    correct = dict.fromkeys(where, 0.0)
    wrong = {bug: dict.fromkeys(where, math.inf) for bug in bugs}
    shapes: list[tuple[int, int] | None] = [None] * samples + ([also] * samples if also is not None else [])
    for fixed in shapes:
        shape = fixed or _shape(family, gen)
        p = torch.randn(shape, generator=gen).to(device, getattr(torch, dtype))
        grads = [
            (torch.randn(shape, generator=gen) * grad_scale).to(device, getattr(torch, grad_dtype))
            for _ in range(steps)
        ]
        expected = trajectory(p, grads, group, frozenset())
        for step, tensors in enumerate(trajectory(p, grads, group, causes)):
            for kind in KINDS:
                correct[(kind, step)] = max(correct[(kind, step)], _rel_fro(tensors[kind], expected[step][kind]))
        for bug in bugs:
            for step, tensors in enumerate(trajectory(p, grads, group, causes, bug)):
                for kind in KINDS:
                    error = _rel_fro(tensors[kind], expected[step][kind])
                    wrong[bug][(kind, step)] = min(wrong[bug][(kind, step)], error)
    errors = {"correct": correct, **wrong}
    return {name: {_at(*k): e for k, e in measured.items()} for name, measured in errors.items()}


@kept(reference_muon, case_module)
def _variant_errors(
    causes: tuple[str, ...], settings: tuple[tuple[str, Any], ...], dtype: str, family: str, device: str
) -> dict[str, dict[str, float]]:
    """``cause_tiers``'s measurement: ``_errors`` on ``SAMPLES`` matrices over ``STEPS`` steps,
    with the setting's wrong variants."""
    group = {**reference.MUON_DEFAULTS, **optimizer_settings(settings)}
    return _errors(
        frozenset(causes), group, dtype, family, device, samples=SAMPLES, steps=STEPS, bugs=_bugs(group, family)
    )


@functools.cache
def cause_tiers(
    causes: frozenset[str], settings: tuple[tuple[str, Any], ...], dtype: str, family: str, device: str = "cpu"
) -> CauseTiers:
    """The tiers for ``causes`` at one setting (the group's ``settings``, the parameter's
    ``dtype``, the shape ``family``), measured on ``device`` between correct and wrong
    variants, one for each tensor of ``KINDS`` after each of ``STEPS`` steps. The measurement
    is kept between sessions (``harness.verdicts.kept``): the same code, torch and device measure the
    same figures."""
    unknown = sorted(causes - reference.MUON_CAUSES.keys())
    if unknown:
        raise ValueError(f"unknown causes {unknown}; Muon's: {sorted(reference.MUON_CAUSES)}")
    group = {**reference.MUON_DEFAULTS, **optimizer_settings(settings)}
    where = [(kind, step) for step in range(STEPS) for kind in KINDS]
    errors = _variant_errors(tuple(sorted(causes)), settings, dtype, family, device)
    correct = {k: errors["correct"][_at(*k)] for k in where}
    bugs = _bugs(group, family)
    wrong = {bug: {k: errors[bug][_at(*k)] for k in where} for bug in bugs}
    ns = str(group["ns_dtype"]).removeprefix("torch.")
    setting = f"{'+'.join(sorted(causes))}, nesterov {group['nesterov']}, {dtype}, ns {ns}, {family}"
    bound = {k: MARGIN * max(correct[k], FLOOR) for k in where}
    hidden = [bug for bug in bugs if not any(wrong[bug][k] > bound[k] for k in where)]
    if hidden:
        worst = max(correct.values())
        raise NotSeparable(
            f"{setting}: correct variants reach {worst:.3g}; {', '.join(hidden)} stays within 3× of them everywhere"
        )
    tiers: CauseTiers = {}
    for kind, step in where:
        caught = {bug: wrong[bug][(kind, step)] for bug in bugs}
        shown = ", ".join(f"{bug} ≥ {e:.3g}" for bug, e in caught.items())
        reason = f"{setting}; {kind} after step {step}: correct ≤ {correct[(kind, step)]:.3g}; wrong: {shown} ({SAMPLES} matrices)"
        tiers[(kind, step)] = Tier(
            f"cause:{'+'.join(sorted(causes))}", "tolerance", reason, max_rel_fro=bound[(kind, step)]
        )
    return tiers


#: a difference in a bitwise gate this many times past its setting's cause tier is counted apart,
#: as far past (``judge_causes``)
BEYOND = 10.0
#: a difference past its cause tier but within this many times it is not judged: correct variants'
#: tails reach up to 0.93 of the tier (gathered_muon, about 1,000 drawn cases under the dev and ci
#: profiles, CPU, 2026-12-06) and a half-row lr scale on a 7×5 matrix lands at 1.13 to 1.32 of it,
#: so neither a green nor a red there would be a measured verdict
UNSURE = 2.0
#: the random matrices a case's own calibration draws (the cause gate's tiers draw ``SAMPLES``)
REACH_SAMPLES = 16


@kept(reference_muon, case_module)
def _reach(
    causes: tuple[str, ...],
    settings: tuple[tuple[str, Any], ...],
    dtype: str,
    family: str,
    steps: int,
    grad_scale: float,
    shape: tuple[int, int],
    device: str,
) -> dict[str, float]:
    group = {**reference.MUON_DEFAULTS, **optimizer_settings(settings)}
    errors = _errors(
        frozenset(causes), group, dtype, family, device,
        samples=REACH_SAMPLES, steps=steps, bugs=[], grad_scale=grad_scale, grad_dtype=dtype, also=shape,
    )  # fmt: skip
    return errors["correct"]


def correct_reach(
    causes: frozenset[str],
    settings: tuple[tuple[str, Any], ...],
    dtype: str,
    family: str,
    steps: int,
    grad_scale: float,
    shape: tuple[int, int],
    device: str,
) -> dict[tuple[str, int], float]:
    """How far the correct variants (the reference with ``causes`` emulated) land from the
    reference at exactly these settings (lr, weight decay and momentum included), over ``steps``
    steps: for each tensor of ``KINDS`` after each step, the largest relative Frobenius error on
    ``REACH_SAMPLES`` random matrices of the family, drawn as the cases draw theirs (the weight
    and its gradients, ``grad_scale`` times a normal one, in the parameter's dtype), and as many
    of the case's own ``shape``: at one Newton–Schulz iteration the correct variants land up to
    3 times farther on a ``[1, 1]`` or ``[8, 1]`` matrix than on the family's drawn ones (CPU,
    plain quintic, 2026-12-05). Kept between sessions, as ``cause_tiers``'s measurement is."""
    reach = _reach(tuple(sorted(causes)), settings, dtype, family, steps, grad_scale, shape, device)
    return {(kind, step): reach[_at(kind, step)] for step in range(steps) for kind in KINDS}


#: what of a parameter whose gradient is zero at every step a cause can move: its update is zero on
#: both sides, so only weight decay applied another way can leave a difference
_ZERO_GRAD_CAUSES = frozenset({"decay_rounded"})
#: gradient patterns whose tensors the cause tier judges: a gradient at every step, at every other
#: one, or from a later step on (fewer steps move a tensor less far, so the every-step reach bounds
#: it); not a gradient on some ranks only, nor one built to sit on bf16 rounding ties of the norm
#: (the tier is measured on normal gradients, and the normalization is what some causes change)
_JUDGED_GRADS = ("normal", "every_other", "late")


@dataclass(frozen=True)
class CauseVerdict:
    """What a failed case of a bitwise gate is, for a candidate that declares causes
    (``judge_causes``), one line per failing tensor (``name.kind step N``): judged and found
    within its setting's cause tier (``within``, with the largest fraction of a tier reached,
    ``reach``), or past it (``past``; ``far`` counts those ``BEYOND`` times past, a finding of its
    own); or it differs where its causes cannot reach (``unexplained``: a parameter never stepped,
    an AdamW one, a non-finite value); or no tier can judge it (``unjudged``), each with why."""

    within: tuple[str, ...] = ()
    reach: float = 0.0
    past: tuple[str, ...] = ()
    far: int = 0
    unexplained: tuple[str, ...] = ()
    unjudged: tuple[str, ...] = ()


def judge_causes(
    causes: frozenset[str],
    case: Case,
    comparisons: Iterable[Comparison],
    device: str,
    *,
    calibrated: bool = True,
    against: str = "reference",
) -> CauseVerdict:
    """Judges each failing tensor of a failed case of a bitwise gate, of a candidate that declares
    ``causes`` (``CauseVerdict``), as the cause gate judges its own cases: the tier is ``MARGIN``
    times how far the causes alone move the tensor at the case's own settings and shape
    (``correct_reach``), at least ``FLOOR``: a tensor inside it is within its causes, one past
    ``UNSURE`` times it differs by more than the causes explain, and one in between is not judged. A tensor's error is its difference over the reference's change since the start,
    each summed over the ranks' pieces (``Comparison.diff_norm``, ``change_norm``).

    Judged: the Muon group's matrices and 3-D stacks with a gradient at every step (or every
    other, or from a later step on), and their momentum buffers, against the reference (a stack
    at its matrices' tier: the reference steps each on its own, and the stack's error is at most
    its worst matrix's). Not judged, and named: a bf16 weight (at the gates' learning rates it
    moves by a few rounding steps, and ``torch.optim.Muon``, correct, adds its bf16 update with
    one rounding the causes do not emulate: 1 ULP off a weight whose tier was 2.9e-6, CPU,
    2026-12-06; its momentum buffer is judged); a tensor whose tier is its whole change or more
    (there the tier could not tell a missing update from a correct one);
    the tensors of a case whose gradients come from a model's backward (``calibrated=False``: the
    tiers are measured on normal gradients; gathered_muon, correct, lay up to 4× its tier on
    ``real_backward`` and within 0.93 of it on about 1,000 drawn cases of the optimizer gates, CPU,
    2026-12-06); everything under a ``--kernel`` (the causes are emulated on the reference's
    Newton–Schulz). Against the candidate itself on one device (``against="self"``) only a cause
    that changes no value (``SIGN_ONLY``) can explain a difference: the others are the candidate's
    own arithmetic on both sides."""
    if not causes or case.kernel is not None:
        return CauseVerdict()
    specs = {s.name: s for s in case.params}
    sums: dict[tuple[str, str, int], list[float]] = {}
    failed: set[tuple[str, str, int]] = set()
    unexplained: set[str] = set()
    unjudged: set[str] = set()
    signs: set[str] = set()
    muon = against == "reference" and "tier:causes" in reference_of(case).claims and bool(causes - SIGN_ONLY)
    for c in comparisons:
        if c.against != against:
            continue
        name, key = _owner(c.tensor, specs)
        label = f"{name}.{key or 'update'} step {c.step}"
        spec = specs.get(name)
        if not c.passed and causes & SIGN_ONLY and c.max_abs_diff == 0.0 and c.mismatches:
            signs.add(f"{label}: equal in value, {c.mismatches} zero(s) of the other sign (signed_zero)")
            continue
        if not c.passed and not muon:
            unexplained.add(
                f"{label}: max|diff| {c.max_abs_diff:.3g}, a value that differs, which no declared cause makes"
            )
            continue
        if not c.passed and spec is not None and (
            not math.isfinite(c.max_abs_diff) or not spec.use_muon or spec.grad == "none"
            or (spec.grad == "zero" and not causes & _ZERO_GRAD_CAUSES)
        ):  # fmt: skip
            unexplained.add(f"{label}: {_why_unexplained(spec.use_muon, spec.grad, c.max_abs_diff)}")
            continue
        why = _why_unjudged(spec, key, calibrated)
        if why:
            if not c.passed:
                unjudged.add(f"{label} ({why})")
            continue
        acc = sums.setdefault((name, key or "update", c.step), [0.0, 0.0])
        acc[0] += c.diff_norm**2
        acc[1] += c.change_norm**2
        if not c.passed:
            failed.add((name, key or "update", c.step))
    settings = tuple(sorted(case.settings))
    group = {**reference.MUON_DEFAULTS, **optimizer_settings(settings)}
    ns = str(group["ns_dtype"]).removeprefix("torch.")
    within, past, far, reach_seen = [], [], 0, 0.0
    for (name, kind, step), (diff, change) in sorted(sums.items()):
        if (name, kind, step) not in failed:
            continue
        label = f"{name}.{kind} step {step}"
        if change == 0.0:
            unjudged.add(f"{label} (the reference did not move it)")
            continue
        spec = specs[name]
        rows, cols = spec.shape[-2:]
        family = family_of((rows, cols))
        reach = correct_reach(causes, settings, spec.dtype, family, case.steps, spec.grad_scale, (rows, cols), device)[
            (kind, step)
        ]
        tier = MARGIN * max(reach, FLOOR)
        error = math.sqrt(diff / change)
        setting = f"{'+'.join(sorted(causes))}, nesterov {group['nesterov']}, {spec.dtype}, ns {ns}, {family}"
        if tier >= 1.0:
            unjudged.add(
                f"{label}: {error:.3g} of its change, where the causes alone move it {reach:.2g} of it ({setting}): "
                "a tier this wide could not tell a missing update from a correct one"
            )
        elif tier < error <= UNSURE * tier:
            unjudged.add(
                f"{label}: {error:.3g} of its change, {error / tier:.3g} × the causes' tier {tier:.3g} ({setting}): "
                f"past it, but within {UNSURE:g} × it, where a correct variant's tail and a small bug both land"
            )
        elif error > tier:
            far += error > BEYOND * tier
            past.append(
                f"{label}: {error:.3g} of its change, {error / tier:.3g} × the causes' tier {tier:.3g} at this "
                f"setting ({setting})"
            )
        else:
            within.append(f"{label}: {error:.3g} of its change, {error / tier:.2g} of the causes' tier {tier:.3g}")
            reach_seen = max(reach_seen, error / tier)
    within += sorted(signs)
    return CauseVerdict(
        tuple(within), reach_seen, tuple(past), far, tuple(sorted(unexplained)), tuple(sorted(unjudged))
    )


def _owner(tensor: str, specs: Mapping[str, Any]) -> tuple[str, str]:
    """(parameter name, state key) of a compared tensor: ``w``, ``w.momentum_buffer``, and a model's
    dotted names (``0.weight``, ``0.weight.momentum_buffer``) by the longest parameter name it starts with."""
    owners = [n for n in specs if tensor == n or tensor.startswith(n + ".")]
    if not owners:
        name, _, key = tensor.partition(".")
        return name, key
    name = max(owners, key=len)
    return name, tensor[len(name) + 1 :]


def _why_unjudged(spec: Any, key: str, calibrated: bool) -> str:
    """Why the cause tier cannot judge this tensor; empty where it can."""
    if spec is None:
        return "not a parameter of the case"
    if key not in ("", "momentum_buffer"):
        return f"state {key!r}, which the causes' tier does not measure"
    if len(spec.shape) not in (2, 3):
        return f"a {len(spec.shape)}-D parameter"
    if not key and spec.dtype != "float32":
        return (
            "a bf16 weight: at the gates' learning rates it moves by a few rounding steps, and a correct bf16 add "
            "of the update lands as far (its momentum buffer is judged)"
        )
    if not calibrated:
        return "its gradients come from a model's backward; the tiers are measured on normal ones"
    if spec.grad not in _JUDGED_GRADS:
        return f"gradient pattern {spec.grad!r}, which the tier, measured on normal gradients, does not bound"
    return ""


def _why_unexplained(use_muon: bool, grad: str, max_abs_diff: float) -> str:
    if not math.isfinite(max_abs_diff):
        return "a non-finite difference, which no cause explains"
    if not use_muon:
        return "an AdamW parameter, whose arithmetic no cause of Muon's changes"
    if grad == "none":
        return "a parameter without a gradient, which no cause moves"
    return "a parameter whose gradient is zero: only decay_rounded could move it"


def beyond_causes(causes: frozenset[str], case: Case, comparisons: Iterable[Comparison], device: str) -> list[str]:
    """The tensors of a failed case that lie past its causes' tier (``judge_causes``)."""
    return list(judge_causes(causes, case, comparisons, device).past)
