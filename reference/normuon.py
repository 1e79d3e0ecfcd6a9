"""Single-device NorMuon: Muon whose orthogonalized update is normalized per neuron.

NorMuon (Zichong Li, Liming Liu, Chen Liang, Weizhu Chen, Tuo Zhao, "NorMuon: Making Muon more
efficient and scalable", arXiv 2510.05491, 2025) keeps, per matrix, an EMA of the mean square
of each row of Newton–Schulz's output (one value per output neuron) and divides the output's
rows by its square root, so that no neuron's update dominates; the result is then rescaled.
Everything before Newton–Schulz's output (momentum, its form, Nesterov, coefficients, eps,
dtype) and everything after the rescale (the lr scale, decoupled weight decay, the AdamW
groups) is ``reference.Muon``'s, with its settings. Per step, per matrix, in float32::

    O = newton_schulz(momentum update)            # Muon's, in ns_dtype, then widened
    n = ‖O‖_F                                     # over the last two dimensions
    v = lerp(v, mean(O ⊙ O, axis), 1 − beta2)     # the state ``second_moment``, zeros at first
    Ô = O / (√v + eps)      or  O · rsqrt(max(v, eps))                      (normuon_denominator)
    Ô = Ô · n / (‖Ô‖_F + eps)  then lr · Muon's lr scale                    (normuon_scale "frobenius")
    Ô = Ô · 0.2·√(rows·cols) / (‖Ô‖_F + eps)  and lr alone                  (normuon_scale "rms")
    p ← p·(1 − lr·wd) − scaled_lr · Ô

The public implementations disagree, and each difference is a setting:

``normuon_axis``
    ``"rows"`` (the authors' ``normuon.py``, microsoft/dion): the mean over the columns, one
    value per row (``v`` of shape ``[…, rows, 1]``). ``"shape"`` (modded-nanogpt,
    karpathy/nanochat, NVIDIA's Emerging-Optimizers ``normuon``): per row where
    ``rows ≥ cols``, else per column (``[…, 1, cols]``).
``normuon_denominator``
    ``"add"``: ``√v + eps`` (the authors, 1e-10; dion, 1e-8). ``"clamp"``: ``rsqrt(max(v,
    eps))`` (modded-nanogpt, Emerging-Optimizers). The Frobenius rescale's division takes the
    same form: ``+ eps`` or ``max(·, eps)``.
``normuon_scale``
    ``"frobenius"`` (every merged implementation): the normalized update keeps
    Newton–Schulz's Frobenius norm, and the step is Muon's (``adjust_lr_fn``).
    ``"rms"`` (the paper's Algorithm 1, and optax pull request 1651): the update is
    rescaled to ``0.2·√(rows·cols)`` in Frobenius norm (an RMS of 0.2) and the lr is not
    scaled again.
``normuon_tall``
    how a tall matrix's (more rows than columns) Newton–Schulz output is laid out in memory
    when its statistics and norms are summed: ``"row_major"``, or ``"transposed"``, the
    transpose of the wide matrix Newton–Schulz iterated on, as pytorch-optimizer's NorMuon
    leaves it. The same sums in another order: a step of a ``[31, 13]`` matrix came out
    otherwise in 130 of 200 draws, by at most 2.4e-7.
``normuon_eps`` and ``beta2``
    as above; the authors' defaults (1e-10, 0.95).

Conventions of this reference, which a sharded NorMuon must follow: ``v`` is float32 whatever
the parameter's dtype (the authors keep it in the parameter's dtype), starts at zero and is
not bias-corrected (none of the implementations does; the Frobenius rescale cancels it but for
``eps``); the statistics and both norms are of the *whole* matrix (each expert of a 3-D stack
on its own), never of a shard: microsoft/dion's sharded NorMuon rescales each shard by its own
norm, which its code calls an approximation. Not modelled: dion's ``flatten`` of a stack, the
authors' reshape of 4-D convolution weights, modded-nanogpt's cautious weight decay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, cast, get_args

import torch
from torch import Tensor

from reference.muon import MUON_DEFAULTS, Interval, Muon, block_scales, lr_scale, validate_settings

NormuonAxis = Literal["rows", "shape"]
NormuonDenominator = Literal["add", "clamp"]
NormuonScale = Literal["frobenius", "rms"]
NormuonTall = Literal["row_major", "transposed"]

NORMUON_DEFAULTS: dict[str, Any] = dict(
    MUON_DEFAULTS,
    beta2=0.95,
    normuon_eps=1e-10,
    normuon_axis="rows",
    normuon_denominator="add",
    normuon_scale="frobenius",
    normuon_tall="row_major",
)


def statistics_dim(shape: Sequence[int], axis: NormuonAxis) -> int:
    """The dimension the mean square is taken over: the columns (one value per row), or, with
    ``"shape"``, the rows of a matrix with fewer rows than columns."""
    return -1 if axis == "rows" or shape[-2] >= shape[-1] else -2


def second_moment_shape(shape: Sequence[int], axis: NormuonAxis) -> tuple[int, ...]:
    """The shape of ``second_moment`` for a parameter of ``shape``."""
    out = list(shape)
    out[statistics_dim(shape, axis)] = 1
    return tuple(out)


def _divided(x: Tensor | float, by: Tensor, eps: float, denominator: NormuonDenominator) -> Tensor:
    return x / (by + eps) if denominator == "add" else x / by.clamp(min=eps)


def divided_by_statistics(
    ortho: Tensor, second_moment: Tensor, group: dict[str, Any], shape: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """Advances ``second_moment`` (float32) in place from Newton–Schulz's output ``ortho`` of a
    matrix of global ``shape``; returns that output in float32, laid out as ``normuon_tall``
    says (the order its sums run in), and divided by the statistics."""
    u = ortho.float().contiguous()
    if group["normuon_tall"] == "transposed" and shape[-2] > shape[-1]:
        u = u.mT.contiguous().mT
    dim = statistics_dim(shape, group["normuon_axis"])
    second_moment.lerp_((u * u).mean(dim=dim, keepdim=True), 1 - group["beta2"])
    return u, divided_by(u, second_moment, group)


def divided_by(u: Tensor, second_moment: Tensor, group: dict[str, Any]) -> Tensor:
    """``u`` divided by the root of the statistics (``normuon_denominator``): ``u / (√v + eps)``
    or ``u · rsqrt(max(v, eps))``."""
    eps = group["normuon_eps"]
    if group["normuon_denominator"] == "add":
        return u / (second_moment.sqrt() + eps)
    return u * second_moment.clamp(min=eps).rsqrt()


def rescaled(norm: Tensor, divided: Tensor, group: dict[str, Any], shape: Sequence[int]) -> tuple[Tensor, float]:
    """The divided update rescaled (``normuon_scale``): to ``norm``, Newton–Schulz's output's
    Frobenius norm, or to an RMS of 0.2; and the factor the lr is then multiplied by."""
    eps, denominator = group["normuon_eps"], group["normuon_denominator"]
    normalized = torch.linalg.vector_norm(divided, dim=(-2, -1), keepdim=True)
    if group["normuon_scale"] == "frobenius":
        return divided * _divided(norm, normalized, eps, denominator), _lr_factor(group, shape)
    target = 0.2 * math.sqrt(shape[-2] * shape[-1])
    return divided * _divided(target, normalized, eps, denominator), _lr_factor(group, shape)


def _lr_factor(group: dict[str, Any], shape: Sequence[int]) -> float:
    """What the lr is multiplied by after ``rescaled``: Muon's lr scale under the Frobenius
    rescale, 1 under the RMS one (whose target already holds the shape)."""
    return lr_scale(shape, group["adjust_lr_fn"]) if group["normuon_scale"] == "frobenius" else 1.0


def normalize_neurons(
    ortho: Tensor, second_moment: Tensor, group: dict[str, Any], shape: Sequence[int]
) -> tuple[Tensor, float]:
    """NorMuon's step from Newton–Schulz's output ``ortho`` of the whole matrix of global
    ``shape``: advances ``second_moment`` in place; returns the float32 update and the factor the
    lr is multiplied by.

    A stack ``[…, rows, cols]`` is normalized one matrix at a time, each from an allocation of
    its own: CUDA's reduction kernels choose their order by the tensor's shape and alignment, so
    the sums of a stack of E experts and of a shard of fewer differed by an ULP (ShardedNorMuon on
    one H100, 2026-12-04); on the CPU the two give the same bits (300 of 300 shapes)."""
    if ortho.ndim > 2:
        matrix = tuple(shape[-2:])
        moments = second_moment.view(-1, *second_moment.shape[-2:]).unbind(0)
        pieces = [
            normalize_neurons(m.clone(memory_format=torch.contiguous_format), v, group, matrix)[0]
            for m, v in zip(ortho.reshape(-1, *matrix).unbind(0), moments, strict=True)
        ]
        stacked = torch.stack(pieces) if pieces else ortho.float().reshape(0, *matrix)
        return stacked.view(ortho.shape), _lr_factor(group, shape)
    u, divided = divided_by_statistics(ortho, second_moment, group, shape)
    return rescaled(torch.linalg.vector_norm(u, dim=(-2, -1), keepdim=True), divided, group, shape)


def validate_normuon_settings(group: dict[str, Any]) -> None:
    """Muon's checks, then NorMuon's own settings."""
    validate_settings(group)
    for name, kind in (
        ("normuon_axis", NormuonAxis),
        ("normuon_denominator", NormuonDenominator),
        ("normuon_scale", NormuonScale),
        ("normuon_tall", NormuonTall),
    ):
        if group[name] not in get_args(kind):
            raise ValueError(f"{name}={group[name]!r} is not one of {get_args(kind)}")
    if not 0 <= group["beta2"] < 1:
        raise ValueError(f"beta2={group['beta2']!r} must be in [0, 1)")
    if not group["normuon_eps"] > 0:
        raise ValueError(f"normuon_eps={group['normuon_eps']!r} must be > 0")


class NorMuon(Muon):
    """NorMuon for hidden matrices and AdamW for the rest, on one device (module docstring)."""

    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {**Muon.SPACE, "beta2": (0.95, 0.9, Interval(0.0, 0.99))}
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {
        **Muon.CONVENTIONS,
        "normuon_axis": get_args(NormuonAxis),
        "normuon_denominator": get_args(NormuonDenominator),
        "normuon_scale": get_args(NormuonScale),
        "normuon_tall": get_args(NormuonTall),
        "normuon_eps": (1e-10, 1e-8),
    }
    STATE: ClassVar[tuple[str, ...]] = ("momentum_buffer", "second_moment", "exp_avg", "exp_avg_sq")
    DEFAULTS: ClassVar[dict[str, Any]] = NORMUON_DEFAULTS
    #: beside AdamW groups and on row blocks, as Muon; not Muon's Newton–Schulz claims: its update
    #: is not Newton–Schulz's output (the spectrum, the norm's ties and Muon's causes say nothing of it)
    CLAIMS: ClassVar[frozenset[str]] = frozenset({"hybrid_groups", "heads"})
    #: none of Muon's causes: they are calibrated on Muon's update, not on NorMuon's
    CAUSES: ClassVar[dict[str, str]] = {}
    ENGINE_NAME: ClassVar[str | None] = None
    ROUTES: ClassVar[dict[str, tuple[str, ...]]] = {
        "NorMuon": ("momentum_buffer", "second_moment"),
        "AdamW": ("exp_avg", "exp_avg_sq"),
    }

    VALIDATE: ClassVar[Callable[[dict[str, Any]], None]] = validate_normuon_settings

    @staticmethod
    def _scaled(
        ortho: Tensor, state: dict[str, Any], group: dict[str, Any], shape: Sequence[int]
    ) -> tuple[Tensor, tuple[float, ...]]:
        """NorMuon's normalization of Newton–Schulz's output (``normalize_neurons``), its
        statistics kept in ``state`` from the first step; then, under the Frobenius rescale, each
        row block's own lr scale (``ns_heads``, ``ns_split``: ``block_scales``), after the
        normalization of the whole matrix, which would cancel a scale applied before it
        (microsoft/dion's NorMuon with ``split_sizes``, fixed in its pull request 113)."""
        if "second_moment" not in state:
            moment = second_moment_shape(shape, group["normuon_axis"])
            state["second_moment"] = torch.zeros(moment, dtype=torch.float32, device=ortho.device)
        normalized, scale = normalize_neurons(ortho, cast(Tensor, state["second_moment"]), group, shape)
        return normalized, (block_scales(shape, group) if group["normuon_scale"] == "frobenius" else (scale,))
