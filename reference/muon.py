"""Single-device Muon, the reference every sharded implementation is checked against.

Muon (Keller Jordan, 2024) updates a hidden weight matrix with the *orthogonalized*
momentum: the Newton–Schulz iteration pushes every singular value of the momentum
towards one, so the update moves all directions of the matrix by about the same amount.
Everything that is not a hidden matrix (embeddings, heads, norms, biases) is trained
with AdamW in the same optimizer, through param groups (``use_muon=False``).

Published Muons disagree on almost every detail, and a sharded implementation can
quietly pick a different one. Every convention is therefore an explicit setting here:

momentum form (``momentum_form``)
    ``"ema"`` (torch.optim.Muon, Keller Jordan): ``buf = lerp(buf, g, 1 - μ)``,
    Nesterov update ``lerp(g, buf, μ)``.
    ``"sum"`` (d2l, classic SGD): ``buf = μ·buf + g``, Nesterov update ``g + μ·buf``.
    With ``nesterov=False`` the update is ``buf`` itself.
Newton–Schulz coefficients (``ns_coefficients``)
    ``"keller"``: the quintic (3.4445, −4.7750, 2.0315) on every iteration.
    ``"polar_express"``: the five per-iteration triples of Amsel et al. 2025 as used in
    modded-nanogpt, with its 2 % safety factor on the norm; iterations past the fifth
    reuse the last triple. A tuple ``(a, b, c)`` gives a custom quintic.
eps form (``eps_form``)
    ``"add"`` (Keller Jordan): ``X / (‖X‖_F·s + eps)``; ``"clamp"`` (torch.optim.Muon):
    ``X / max(‖X‖_F·s, eps)``; ``s`` is the safety factor (1 except Polar Express).
Newton–Schulz dtype (``ns_dtype``)
    ``torch.bfloat16`` (default, as everyone) or ``torch.float32``; ``torch.float16`` too
    with a Gram ``ns_form`` (DeepSpeed's, where the accelerator has fp16), not drawn by the
    gates. The output stays in this dtype; it is widened only when it is added to the
    parameter.
Newton–Schulz form (``ns_form``)
    ``"addmm"`` (default): ``B = addmm(A, A, A, β=b, α=c)``; ``X = addmm(X, B, X, β=a)``
    (torch.optim.Muon's arithmetic, see below).
    ``"expanded"``: ``B = b·A + (c·A)@A``; ``X = a·X + B@X``, every scaling, product and sum
    rounded to the Newton–Schulz dtype on its own. Python reads ``c * A @ A`` left to right,
    so the coefficient scales ``A`` before the product: Keller Jordan's original code and
    DeepSpeed's ``ns_method="standard"`` (``zeropower_via_newtonschulz5``).
    ``"gram"``: the Gram form (Tri Dao et al. 2026, DeepSpeed's ``ns_method="gram"``): on a
    matrix with fewer rows than columns (after the transposition below) it iterates on the
    small Gram matrix ``R = X@Xᵀ`` and a product ``Q`` of polynomials in it,
    ``Z = b·R + (c·R)@R``; ``Q = Z + a·I`` at the first iteration, ``Q = a·Q + Z@Q`` after;
    ``R ← a·(a·R + Z@R) + Z@(a·R + Z@R)``, and applies ``Q`` once, ``X ← Q@X``. It restarts
    at iteration ``GRAM_RESTART`` (2): ``X ← Q@X``, ``R = X@Xᵀ``, the next ``Q`` fresh. A
    square matrix takes the ``"expanded"`` form. A tall matrix's result is ``Xᵀ@Qᵀ``, not
    ``(Q@X)ᵀ``: the same numbers, other roundings.
    ``"gram_addmm"``: ``"gram"`` with ``Q`` and ``R`` advanced by ``addmm`` (``β=a``), as
    DeepSpeed 0.19.0–0.19.1 did. The first ``Q`` and ``Z`` are as in ``"gram"``.
    ``"expanded"`` and the Gram forms take each matrix's norm over its last two dimensions.
    With 0 iterations the Gram forms give the normalized matrix, as the others do (DeepSpeed's
    raises).
Newton–Schulz normalization (``ns_normalize``)
    ``"ns_dtype"`` (default): the update is cast to the Newton–Schulz dtype, then divided by
    its norm there. ``"input"``: divided by its norm in its own dtype (float32), then cast
    (DeepSpeed 0.19.8's Gram form, so that a large fp32 update cannot overflow fp16 first).
the unit Newton–Schulz orthogonalizes (``ns_heads``, ``ns_split``)
    ``ns_heads=1`` and ``ns_split=()`` (default): each matrix whole. ``ns_heads=h > 1``: each
    matrix's rows are ``h`` heads of equal size, each orthogonalized on its own (per-head Muon
    for the Q, K and V projections of torchtitan's Kimi and Moonlight recipes and DeepSpeed's
    ``per_head_muon``; ``h = 2`` is a fused gate/up projection split in its halves).
    ``ns_split=(r₁, r₂, …)``: row blocks of those sizes, unequal allowed (dion's
    ``split_sizes``, a fused QKV under GQA). Each block's lr scale is its own shape's, so the
    rows of one matrix may step with different scales. A group takes only matrices whose rows
    the blocks fit; a Muon group holds these settings only where they were given, as the forms
    above.
how the heads are iterated (``ns_blocks``)
    ``"each"`` (default): one head after another, each a matrix of its own. ``"batched"``: the
    ``ns_heads`` heads as one stack ``[h, rows/h, cols]`` in batched products (DeepSpeed's
    ``per_head_muon``, a view of the update). The same arithmetic, but a batched product may
    run another kernel than ``h`` single ones: on an AMD EPYC (Zen 5, oneDNN's AVX-512 path)
    DeepSpeed 0.19.8's batched heads of an [8, 4] projection were 1 ULP from ``"each"`` in 2 of
    32 elements, and bitwise on the CPU the gate was written on; following the candidate's
    order makes the verdict the same on both. Equal blocks only: not with ``ns_split``.
lr scale (``adjust_lr_fn``)
    ``"original"``: lr·√max(1, rows/cols); ``"match_rms_adamw"``: lr·0.2·√max(rows, cols)
    (Moonshot); ``"none"``: lr. Rows and cols are the *global* matrix shape (a row block's, with
    ``ns_heads`` or ``ns_split``), never a shard's.
where the lr scale applies (``lr_scale_on``)
    ``"lr"`` (default): ``p ← p − (lr·scale)·update``. ``"update"``: the orthogonalized update
    is multiplied by the scale in its own (Newton–Schulz) dtype, rounded there, and the step
    is ``p ← p − lr·update`` (DeepSpeed's ``update *= scale``).
AdamW form (``adamw_form``), for the ``use_muon=False`` groups
    ``"torch"`` (default): torch.optim.AdamW's single-tensor arithmetic.
    ``"keller"``: Keller Jordan's ``adam_update`` (DeepSpeed's inline Adam, where no
    ``torch.optim`` AdamW is handed to it): ``m = lerp(m, g, 1−β₁)``, ``v = lerp(v, g², 1−β₂)``,
    update ``(m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + eps)``; decay ``p·(1 − lr·wd)`` first.
    ``"lerp"``: torch's, with ``v = lerp(v, g², 1−β₂)`` (pytorch-optimizer's AdamW groups).
the AdamW kernels (``adamw_kernels``), with ``adamw_form="torch"``
    ``"single_tensor"`` (default): each operation the tensor's own, as
    ``torch.optim.AdamW(foreach=False)``. ``"foreach"``: the same operations through torch's
    ``_foreach_*`` kernels, as ``foreach=True``. ``"default"``: what ``foreach=None`` (torch's
    default, what an optimizer handed ``torch.optim.AdamW`` gets) chooses for the tensor:
    foreach on CUDA (and torch's other foreach devices), single-tensor on the CPU
    (``torch_kernels``). Their bits differ on CUDA by a few ULP.
the AdamW step count (``adamw_steps``), ``t`` above
    ``"param"`` (default): the steps this parameter had a gradient in, as torch.optim.AdamW
    counts. ``"group"``: the optimizer's steps since its group was made, a gradient or not
    (pytorch-optimizer's ``group["step"]``): a parameter's first gradient at step 5 is
    bias-corrected as a fifth step.
weight decay
    Decoupled, before the update, with the unscaled lr: ``p ← p·(1 − lr·wd)``.
tall matrices
    A matrix with more rows than columns is transposed before Newton–Schulz and back
    after, so the Gram matrix is always the small one.
3-D tensors
    ``[E, rows, cols]`` (stacked MoE experts) is E independent matrices; each is
    orthogonalized on its own, one at a time. Batching them into one ``bmm`` is *not*
    bitwise the same on every shape, so ``orthogonalize`` never does it;
    ``orthogonalize_batch`` does, for callers that check the bits first.
how a stack is iterated (``ns_stacks``)
    ``"each"`` (default): as above. ``"batched"``: the stack in one batched product per step,
    its Frobenius norms in one reduction over the stack (torchtitan's ``DistMuon``, which
    orthogonalizes each rank's experts so; its source says batched kernels need not be
    bitwise one-by-one Muon). The same arithmetic, and on the CPU nearly always the same bits
    as ``"each"`` (199 of 200 stacks of 2 to 6 experts), but not on every shape and device:
    on one H100 66 of 200 stacks differed. ``W`` (an int): batched in the ``W`` chunks
    ``torch.chunk`` cuts the stack's first dimension into, as ``W`` ranks that each hold their
    chunk of the experts (FSDP2's ``Shard(0)``) and batch them do; a stack batched whole and in
    halves differed in 5 of 200 stacks on that H100 (0 on the CPU). With the ``"addmm"`` form
    normalized in the Newton–Schulz dtype only.
``grad is None``
    The parameter is skipped entirely: no momentum, no weight decay, no step count.
precision
    Optimizer state (momentum, AdamW moments) is float32 whatever the parameter dtype.
    Elementwise arithmetic runs in float32 and a low-precision parameter is rounded once
    at the end. This is a choice for sharding: bf16 ``add(…, alpha=…)`` on the CPU
    rounds differently in the vectorised body and the scalar tail of a loop, so the same
    element could get different bits on a shard of a different length.

The Newton–Schulz iteration uses ``addmm`` (torch.optim.Muon's arithmetic, and the fast
one on GPUs); it is not bitwise the plain ``a·X + (b·A + c·A²)·X`` form.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, cast, get_args

import torch
from torch import Tensor
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

MomentumForm = Literal["ema", "sum"]
EpsForm = Literal["add", "clamp"]
LrAdjust = Literal["original", "match_rms_adamw", "none"]
CoefficientsName = Literal["keller", "polar_express"]
NsForm = Literal["addmm", "expanded", "gram", "gram_addmm"]
NsNormalize = Literal["ns_dtype", "input"]
NsBlocks = Literal["each", "batched"]
StackNorm = Literal["each", "batched"]
NsStacks = StackNorm | int
LrScaleOn = Literal["lr", "update"]
AdamwForm = Literal["torch", "keller", "lerp"]
AdamwKernels = Literal["single_tensor", "foreach", "default"]
AdamwSteps = Literal["param", "group"]

#: the iteration at which the Gram forms apply their polynomial to X and start again from its
#: Gram matrix (DeepSpeed's ``restart_at``), which keeps the half-precision product stable
GRAM_RESTART = 2

KELLER_COEFFICIENTS: tuple[tuple[float, float, float], ...] = ((3.4445, -4.7750, 2.0315),)
# Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv 2505.16932), five-step schedule
# with safety factor 2e-2 as published in modded-nanogpt's train_gpt.py.
POLAR_EXPRESS_COEFFICIENTS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 1.02


def coefficient_schedule(
    ns_coefficients: CoefficientsName | tuple[float, float, float],
) -> tuple[tuple[tuple[float, float, float], ...], float]:
    """The per-iteration (a, b, c) triples and the norm safety factor for a setting."""
    if ns_coefficients == "keller":
        return KELLER_COEFFICIENTS, 1.0
    if ns_coefficients == "polar_express":
        return POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_SAFETY
    if isinstance(ns_coefficients, tuple) and len(ns_coefficients) == 3:
        a, b, c = (float(x) for x in ns_coefficients)
        return ((a, b, c),), 1.0
    raise ValueError(f"ns_coefficients={ns_coefficients!r} is not 'keller', 'polar_express' or a tuple (a, b, c)")


def _newton_schulz(
    G: Tensor,
    steps: int,
    schedule: tuple[tuple[float, float, float], ...],
    safety: float,
    eps: float,
    eps_form: EpsForm,
    dtype: torch.dtype,
    form: NsForm = "addmm",
    normalize: NsNormalize = "ns_dtype",
    stack_norm: StackNorm = "each",
) -> Tensor:
    """One matrix ``[rows, cols]``, or a stack ``[n, rows, cols]`` in batched products, its
    norms one matrix at a time or in one reduction (``stack_norm``, ``ns_stacks``)."""
    if form != "addmm" or normalize != "ns_dtype":
        return _newton_schulz_expanded(G, steps, schedule, safety, eps, eps_form, dtype, form, normalize)
    # Newton–Schulz reads X from storage that starts where an allocation starts: on GPUs the
    # matmul and norm kernels chosen depend on the pointer's alignment, so a view at an
    # offset (one expert of a 3-D stack) and a fresh shard of the same numbers gave
    # different bits in fp32 (seen on H200: expert stacks, fp32 Newton–Schulz). G itself
    # qualifies when it is already a whole contiguous allocation in ``dtype`` (it is never
    # written); anything else is copied first.
    whole = G.dtype == dtype and G.is_contiguous() and G.storage_offset() == 0
    X = G if whole else G.to(dtype, copy=True)
    transposed = G.size(-2) > G.size(-1)
    if transposed:
        X = X.mT
    if X.ndim == 2:
        norm = X.norm()
    elif stack_norm == "batched":
        norm = X.norm(dim=(-2, -1), keepdim=True)
    else:
        norm = torch.stack([m.norm() for m in X.unbind(0)]).view(-1, 1, 1)
    if safety != 1.0:
        norm = norm * safety
    X = X / (norm + eps) if eps_form == "add" else X / norm.clamp(min=eps)
    addmm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for i in range(steps):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = X @ X.mT
        B = addmm(A, A, A, beta=b, alpha=c)
        X = addmm(X, B, X, beta=a)
    return X.mT if transposed else X


def _newton_schulz_expanded(
    G: Tensor,
    steps: int,
    schedule: tuple[tuple[float, float, float], ...],
    safety: float,
    eps: float,
    eps_form: EpsForm,
    dtype: torch.dtype,
    form: NsForm,
    normalize: NsNormalize,
) -> Tensor:
    """The ``"expanded"`` and Gram forms (and ``"addmm"`` normalized in the input's dtype):
    each written as ``a * X + B @ X`` is, so that every scaling and product rounds on its own."""
    X = G.to(dtype) if normalize == "ns_dtype" else G
    transposed = G.size(-2) > G.size(-1)
    if transposed:
        X = X.mT
    norm = X.norm(dim=(-2, -1), keepdim=True)
    if safety != 1.0:
        norm = norm * safety
    X = X / (norm + eps) if eps_form == "add" else X / norm.clamp(min=eps)
    X = X.to(dtype)
    if form in ("gram", "gram_addmm") and X.size(-2) < X.size(-1) and steps > 0:
        Q, X = _gram_polynomial(X, steps, schedule, form == "gram_addmm")
        return X.mT @ Q.mT if transposed else Q @ X
    addmm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for i in range(steps):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        A = X @ X.mT
        X = addmm(X, addmm(A, A, A, beta=b, alpha=c), X, beta=a) if form == "addmm" else a * X + (b * A + c * A @ A) @ X
    return X.mT if transposed else X


def _gram_polynomial(
    X: Tensor, steps: int, schedule: tuple[tuple[float, float, float], ...], fused: bool
) -> tuple[Tensor, Tensor]:
    """The Gram forms' iteration on a wide ``X``: ``(Q, X)`` such that ``Q @ X`` is the result,
    ``X`` the matrix the last restart left (see the module docstring)."""

    def times(M: Tensor, Z: Tensor, a: float) -> Tensor:
        """``a·M + Z@M``, by ``addmm`` where ``fused``."""
        if fused:
            return torch.addmm(M, Z, M, beta=a) if M.ndim == 2 else torch.baddbmm(M, Z, M, beta=a)
        return a * M + Z @ M

    R = X @ X.mT
    Q: Tensor | None = None
    for i in range(steps):
        a, b, c = schedule[min(i, len(schedule) - 1)]
        if i == GRAM_RESTART and Q is not None:
            X = Q @ X
            R = X @ X.mT
            Q = None
        Z = b * R + c * R @ R
        if Q is None:
            Q = Z.clone()
            Q.diagonal(dim1=-2, dim2=-1).add_(a)
        else:
            Q = times(Q, Z, a)
        if i < steps - 1 and i + 1 != GRAM_RESTART:
            RZ = times(R, Z, a)
            R = times(RZ, Z, a)
    assert Q is not None  # steps > 0
    return Q, X


def orthogonalize(
    G: Tensor,
    steps: int = 5,
    *,
    ns_coefficients: CoefficientsName | tuple[float, float, float] = "keller",
    eps: float = 1e-7,
    eps_form: EpsForm = "add",
    dtype: torch.dtype = torch.bfloat16,
    ns_form: NsForm = "addmm",
    ns_normalize: NsNormalize = "ns_dtype",
    ns_stacks: NsStacks = "each",
) -> Tensor:
    """Newton–Schulz orthogonalization of a matrix, or of each matrix of a batch.

    The quintic's slope at zero is pushed so high that it stops converging to one: the
    output is roughly ``U S' Vᵀ`` with ``S'`` in about [0.7, 1.2] rather than the exact
    polar factor ``U Vᵀ``. That is fine for training (Keller Jordan found no loss in model
    quality) and it is what every Muon ships, so it is what the reference computes.

    Leading dimensions are a batch, orthogonalized one matrix at a time, or, with
    ``ns_stacks``, a stack ``[n, rows, cols]`` in batched products, whole or in chunks (module
    docstring).
    The result has ``dtype`` and the shape of ``G``.
    """
    schedule, safety = coefficient_schedule(ns_coefficients)
    if G.ndim < 2:
        raise ValueError(f"orthogonalize needs a matrix or a batch of matrices; got shape {tuple(G.shape)}")
    if G.ndim == 2:
        return _newton_schulz(G, steps, schedule, safety, eps, eps_form, dtype, ns_form, ns_normalize)
    if ns_stacks != "each" and G.ndim == 3 and G.size(0) > 0:
        chunks = (G,) if ns_stacks == "batched" else G.chunk(ns_stacks)
        out = [
            _newton_schulz(c, steps, schedule, safety, eps, eps_form, dtype, ns_form, ns_normalize, "batched")
            for c in chunks
        ]
        return torch.cat(out)
    flat = G.reshape(-1, *G.shape[-2:])
    out = [
        _newton_schulz(m, steps, schedule, safety, eps, eps_form, dtype, ns_form, ns_normalize) for m in flat.unbind(0)
    ]
    if not out:
        return torch.empty(G.shape, dtype=dtype, device=G.device)
    return torch.stack(out).reshape(G.shape)


def orthogonalize_batch(
    G: Tensor,
    steps: int = 5,
    *,
    ns_coefficients: CoefficientsName | tuple[float, float, float] = "keller",
    eps: float = 1e-7,
    eps_form: EpsForm = "add",
    dtype: torch.dtype = torch.bfloat16,
    ns_form: NsForm = "addmm",
    ns_normalize: NsNormalize = "ns_dtype",
) -> Tensor:
    """``orthogonalize`` of each matrix of a stack ``[n, rows, cols]``, in one batched
    product (``bmm``/``baddbmm``) per step instead of ``n``: the same arithmetic, much
    faster on small matrices.

    A batched product may run a different kernel than ``n`` single ones, so this is *not*
    bitwise ``orthogonalize`` on every shape and device; a caller that needs the
    reference's bits checks first (``ShardedMuon`` does, per shape).
    """
    if G.ndim != 3:
        raise ValueError(f"orthogonalize_batch needs a stack [n, rows, cols]; got shape {tuple(G.shape)}")
    schedule, safety = coefficient_schedule(ns_coefficients)
    if G.size(0) == 0:
        return torch.empty(G.shape, dtype=dtype, device=G.device)
    return _newton_schulz(G, steps, schedule, safety, eps, eps_form, dtype, ns_form, ns_normalize)


def group_orthogonalizer(group: dict[str, Any], fn: Callable[..., Tensor] | None = None) -> Callable[[Tensor], Tensor]:
    """``matrix -> fn(matrix, …)`` with a param group's Newton–Schulz settings (``fn``: ``orthogonalize``);
    with row blocks (``ns_heads``, ``ns_split``: ``row_blocks``), ``fn`` takes each block of rows
    of the matrix (of every matrix of a stack) on its own, and the results are laid back in order."""
    kernel = orthogonalize if fn is None else fn
    # only where they are not the defaults, so that a kernel of the older signature still runs
    forms = {k: group[k] for k in ("ns_form", "ns_normalize", "ns_stacks") if form_of(group, k) != FORM_DEFAULTS[k]}

    batched = form_of(group, "ns_blocks") == "batched"

    def run(matrix: Tensor) -> Tensor:
        blocks = row_blocks(matrix.shape[-2], group)
        if len(blocks) == 1:
            return whole(matrix)
        if batched:  # equal heads (validate_settings), one stack of every matrix's heads
            *lead, rows, cols = matrix.shape
            stack = matrix.reshape(-1, blocks[0], cols)
            return whole(stack, orthogonalize_batch if fn is None else kernel).reshape(*lead, rows, cols)
        return torch.cat([whole(block) for block in matrix.split(blocks, dim=-2)], dim=-2)

    def whole(matrix: Tensor, kernel: Callable[..., Tensor] = kernel) -> Tensor:
        return kernel(
            matrix,
            group["ns_steps"],
            ns_coefficients=group["ns_coefficients"],
            eps=group["eps"],
            eps_form=group["eps_form"],
            dtype=group["ns_dtype"],
            **forms,
        )

    return run


def row_blocks(rows: int, group: dict[str, Any]) -> tuple[int, ...]:
    """The sizes of the row blocks Newton–Schulz orthogonalizes one at a time in a matrix of
    ``rows`` rows: ``ns_heads`` heads of equal size, the ``ns_split`` sizes, or the whole matrix."""
    heads, split = form_of(group, "ns_heads"), tuple(form_of(group, "ns_split"))
    if split:
        if sum(split) != rows:
            raise ValueError(f"ns_split={split} does not add up to the {rows} rows of the matrix")
        return split
    if rows % heads:
        raise ValueError(f"ns_heads={heads} does not divide the {rows} rows of the matrix into heads of equal size")
    return (rows // heads,) * heads if heads > 1 else (rows,)


def block_scales(shape: Sequence[int], group: dict[str, Any]) -> tuple[float, ...]:
    """Muon's lr scale of each row block of a matrix of global ``shape`` (``row_blocks``), from
    the block's own shape."""
    return tuple(lr_scale((b, shape[-1]), group["adjust_lr_fn"]) for b in row_blocks(shape[-2], group))


def blocks_of_rows(rows: Sequence[int], total: int, group: dict[str, Any]) -> list[int]:
    """The row block (``row_blocks``) each of ``rows``, rows of a matrix of ``total`` rows, is in."""
    ends = list(itertools.accumulate(row_blocks(total, group)))
    return [bisect.bisect_right(ends, r) for r in rows]


def apply_blocks(
    param: Tensor, ortho: Tensor, group: dict[str, Any], scales: tuple[float, ...], rows: Sequence[int], total: int
) -> None:
    """``apply_update`` of Newton–Schulz's output ``ortho`` to ``param``, each row with the lr
    scale of its block (``block_scales``; where the lr scale applies: ``lr_scale_on``). ``rows``:
    the row of the whole matrix (of ``total`` rows) that each of ``param``'s rows is, in order (a
    shard holds a run of them). Elementwise: a shard's rows come out as the whole matrix's do."""
    lr, wd, on_update = group["lr"], group["weight_decay"], form_of(group, "lr_scale_on") == "update"

    def apply(p: Tensor, o: Tensor, scale: float) -> None:
        if on_update:
            apply_update(p, o * scale, lr, wd, lr)  # in the update's own dtype, rounded there
        else:
            apply_update(p, o, lr, wd, lr * scale)

    if len(set(scales)) == 1:
        apply(param, ortho, scales[0])
        return
    of_row = blocks_of_rows(rows, total, group)
    start = 0
    for i in range(1, len(of_row) + 1):
        if i == len(of_row) or of_row[i] != of_row[start]:
            apply(param[..., start:i, :], ortho[..., start:i, :], scales[of_row[start]])
            start = i


def lr_scale(shape: Sequence[int], adjust_lr_fn: LrAdjust) -> float:
    """The factor Muon's lr is multiplied by, from the global (rows, cols) of one matrix."""
    rows, cols = shape[-2], shape[-1]
    if adjust_lr_fn == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def momentum_update(
    buf: Tensor,
    grad: Tensor,
    momentum: float,
    nesterov: bool,
    momentum_form: MomentumForm,
    out: Tensor | None = None,
) -> Tensor:
    """Advances the float32 momentum buffer in place and returns the update.

    The update is computed in float32; with ``out`` (of any float dtype, e.g. the
    Newton–Schulz dtype) it is written there, rounded once, which gives the same bits as
    rounding a float32 update afterwards with one pass less over memory. Purely
    elementwise, so a shard of ``buf`` and ``grad`` gives that shard of the result.
    """
    g = grad.float()
    if momentum_form == "ema":
        buf.lerp_(g, 1 - momentum)
        if nesterov:
            return torch.lerp(g, buf, momentum, out=out)
    else:
        buf.mul_(momentum).add_(g)
        if nesterov:
            return torch.add(g, buf, alpha=momentum, out=out)
    return buf.clone() if out is None else out.copy_(buf)


def apply_update(param: Tensor, update: Tensor, lr: float, weight_decay: float, scaled_lr: float) -> None:
    """``p ← p·(1 − lr·wd) − scaled_lr·update``, in float32, rounding ``p`` once. Elementwise."""
    p = param if param.dtype == torch.float32 else param.float()
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    p.add_(update, alpha=-scaled_lr)  # mixed dtypes: widened per element, as torch.optim.Muon does
    if p is not param:
        param.copy_(p)


def adamw_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    squares: Literal["addcmul", "lerp"] = "addcmul",
    kernels: AdamwKernels = "single_tensor",
) -> None:
    """One AdamW step (torch.optim.AdamW's single-tensor arithmetic) on float32 state, its second
    moment by ``addcmul`` as torch's or by ``lerp`` (``adamw_form="lerp"``), or through torch's
    foreach kernels (``kernels``, ``torch_kernels``). Elementwise."""
    beta1, beta2 = betas
    g = grad.float()
    if torch_kernels(kernels, param) == "foreach":
        p = param if param.dtype == torch.float32 else param.float()
        foreach_adam_update(p, g, exp_avg, exp_avg_sq, step, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if p is not param:
            param.copy_(p)
        return
    exp_avg.lerp_(g, 1 - beta1)
    if squares == "lerp":
        exp_avg_sq.lerp_(g.square(), 1 - beta2)
    else:
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = math.sqrt(1 - beta2**step)
    p = param if param.dtype == torch.float32 else param.float()
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
    if p is not param:
        param.copy_(p)


def torch_kernels(kernels: AdamwKernels, t: Tensor) -> Literal["single_tensor", "foreach"]:
    """The kernels torch.optim's Adam steps ``t`` with: ``kernels``, or for ``"default"``
    (``foreach=None``) what torch chooses, foreach on its foreach devices (CUDA among them) and
    single-tensor elsewhere (``torch.optim.optimizer._default_to_fused_or_foreach``)."""
    if kernels != "default":
        return kernels
    return "foreach" if t.device.type in _get_foreach_kernels_supported_devices() else "single_tensor"


def foreach_adam_update(
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: float,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool = True,
    max_exp_avg_sq: Tensor | None = None,
) -> None:
    """One step of ``p`` as ``torch.optim.AdamW``/``Adam(foreach=True)`` runs it (their
    ``_multi_tensor_adam(w)``), operation for operation on one-element lists: decay (decoupled
    on ``p``, or L2 into the gradient), both moments, amsgrad's running maximum where
    ``max_exp_avg_sq`` is given, then the bias-corrected step, in ``p``'s own dtype."""
    beta1, beta2 = betas
    grads = [g]
    if weight_decay != 0:
        if decoupled:
            torch._foreach_mul_([p], 1 - lr * weight_decay)
        else:
            grads = list(torch._foreach_add(grads, [p], alpha=weight_decay))
    torch._foreach_lerp_([exp_avg], grads, 1 - beta1)
    torch._foreach_mul_([exp_avg_sq], beta2)
    torch._foreach_addcmul_([exp_avg_sq], grads, grads, 1 - beta2)
    second = [exp_avg_sq]
    if max_exp_avg_sq is not None:
        second = [max_exp_avg_sq]
        torch._foreach_maximum_(second, [exp_avg_sq])
    denom = torch._foreach_sqrt(second)
    torch._foreach_div_(denom, [(1 - beta2**step) ** 0.5])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_([p], [exp_avg], denom, [-(lr / (1 - beta1**step))])


def keller_adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """One step of Keller Jordan's ``adam_update`` (``adamw_form="keller"``) on float32 state. Elementwise."""
    beta1, beta2 = betas
    g = grad.float()
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.lerp_(g.square(), 1 - beta2)
    update = (exp_avg / (1 - beta1**step)) / ((exp_avg_sq / (1 - beta2**step)).sqrt() + eps)
    p = param if param.dtype == torch.float32 else param.float()
    p.mul_(1 - lr * weight_decay)
    p.add_(update, alpha=-lr)
    if p is not param:
        param.copy_(p)


_NS_DTYPES = (torch.bfloat16, torch.float32)
#: what ``ns_dtype`` takes; the gates draw ``_NS_DTYPES`` only
_NS_DTYPES_TAKEN = (*_NS_DTYPES, torch.float16)


def param_names(group: dict[str, Any], index: int) -> list[str]:
    """The names of param group ``index``'s parameters for messages: its ``param_names``, or
    ``group{index}.param{i}``."""
    return group.get("param_names") or [f"group{index}.param{i}" for i in range(len(group["params"]))]


def validate_settings(group: dict[str, Any]) -> None:
    """Raises ``ValueError`` naming the first setting of a param group that is out of range."""

    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"{name}={group[name]!r} {why}")

    if not group["lr"] >= 0:
        raise bad("lr", "must be >= 0")
    if not group["weight_decay"] >= 0:
        raise bad("weight_decay", "must be >= 0")
    if not 0 <= group["momentum"] < 1:
        raise bad("momentum", "must be in [0, 1)")
    if group["momentum_form"] not in get_args(MomentumForm):
        raise bad("momentum_form", f"is not one of {get_args(MomentumForm)}")
    if group["eps_form"] not in get_args(EpsForm):
        raise bad("eps_form", f"is not one of {get_args(EpsForm)}")
    if group["adjust_lr_fn"] not in get_args(LrAdjust):
        raise bad("adjust_lr_fn", f"is not one of {get_args(LrAdjust)}")
    gram = form_of(group, "ns_form") in ("gram", "gram_addmm")
    if group["ns_dtype"] not in (_NS_DTYPES_TAKEN if gram else _NS_DTYPES):
        raise bad("ns_dtype", "must be torch.bfloat16 or torch.float32 (torch.float16 with a Gram ns_form)")
    for name, kind in (
        ("ns_form", NsForm),
        ("ns_normalize", NsNormalize),
        ("ns_blocks", NsBlocks),
        ("lr_scale_on", LrScaleOn),
        ("adamw_form", AdamwForm),
        ("adamw_steps", AdamwSteps),
        ("adamw_kernels", AdamwKernels),
    ):
        if form_of(group, name) not in get_args(kind):
            raise bad(name, f"is not one of {get_args(kind)}")
    if form_of(group, "adamw_kernels") != "single_tensor" and form_of(group, "adamw_form") != "torch":
        raise bad("adamw_kernels", "is torch's AdamW's: it takes adamw_form='torch'")
    heads, split = form_of(group, "ns_heads"), form_of(group, "ns_split")
    if not (isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1):
        raise bad("ns_heads", "must be an int of at least 1")
    if not (isinstance(split, tuple | list) and all(isinstance(n, int) and n >= 1 for n in split)):
        raise bad("ns_split", "must be a tuple of row counts of at least 1")
    if heads > 1 and split:
        raise bad("ns_split", "and ns_heads: give one of them")
    stacks = form_of(group, "ns_stacks")
    if not (
        stacks in ("each", "batched") or (isinstance(stacks, int) and not isinstance(stacks, bool) and stacks >= 1)
    ):
        raise bad("ns_stacks", "is not 'each', 'batched' or a number of chunks of at least 1")
    if stacks != "each" and (form_of(group, "ns_form") != "addmm" or form_of(group, "ns_normalize") != "ns_dtype"):
        raise bad(
            "ns_stacks", "batches the addmm form normalized in ns_dtype (ns_form='addmm', ns_normalize='ns_dtype')"
        )
    if split and form_of(group, "ns_blocks") == "batched":
        raise bad("ns_blocks", "batches equal heads (ns_heads), not ns_split's row blocks")
    if not (isinstance(group["ns_steps"], int) and 0 <= group["ns_steps"] < 100):
        raise bad("ns_steps", "must be an int in [0, 100)")
    if not group["eps"] > 0:
        raise bad("eps", "must be > 0")
    coefficient_schedule(group["ns_coefficients"])
    b1, b2 = group["adamw_betas"]
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise bad("adamw_betas", "must both be in [0, 1)")
    if not group["adamw_eps"] >= 0:
        raise bad("adamw_eps", "must be >= 0")


MUON_DEFAULTS: dict[str, Any] = dict(
    lr=0.02,
    weight_decay=0.0,
    momentum=0.95,
    nesterov=True,
    ns_steps=5,
    eps=1e-7,
    momentum_form="ema",
    ns_coefficients="keller",
    eps_form="add",
    ns_dtype=torch.bfloat16,
    adjust_lr_fn="original",
    use_muon=True,
    adamw_lr=3e-4,
    adamw_betas=(0.9, 0.95),
    adamw_eps=1e-8,
    adamw_weight_decay=0.0,
)


#: the settings that express another Muon's arithmetic (DeepSpeed's), with the defaults that are
#: the reference's own. ``reference.Muon`` takes them, but they are not in ``MUON_DEFAULTS``
#: (``Muon.DEFAULTS``), which is what every candidate is handed and the gates draw from: a
#: param group holds one only where it was given.
#: the causes of difference from this reference's arithmetic that muongate can emulate and
#: calibrate a tier for (``harness.verdicts.causes``), each with what it is: a candidate declares the ones
#: its arithmetic has (``Candidate.differences``), and a bitwise gate that differs judges it by them
MUON_CAUSES: dict[str, str] = {
    "plain_quintic": "Newton–Schulz in the plain form B = b·A + c·(A@A); X = a·X + B@X, not addmm",
    "fused_quintic": (
        "Newton–Schulz compiled (torch.compile): the plain form, each elementwise step (the normalization, "
        "b·A + c·A², a·X + B@X) fused, computed in float32 and rounded to the Newton–Schulz dtype once"
    ),
    "scaled_update": "the lr scale multiplies the orthogonalized update in its own dtype before the lr does",
    "bf16_momentum": "momentum kept in the parameter's dtype, so a bf16 parameter's update starts from bf16",
    "fp32_normalize": "the update normalized in float32 first, then cast to the Newton–Schulz dtype",
    "decay_rounded": "weight decay applied to the parameter in its own dtype, rounded, before the update is added",
}

FORM_DEFAULTS: dict[str, Any] = dict(
    ns_form="addmm",
    ns_normalize="ns_dtype",
    lr_scale_on="lr",
    adamw_form="torch",
    adamw_steps="param",
    adamw_kernels="single_tensor",
    ns_heads=1,
    ns_split=(),
    ns_blocks="each",
    ns_stacks="each",
)


def form_of(group: dict[str, Any], name: str) -> Any:
    """A param group's form setting (``FORM_DEFAULTS``), its default where the group has none."""
    return group.get(name, FORM_DEFAULTS[name])


FLOAT32_STATE = ("momentum_buffer", "exp_avg", "exp_avg_sq")


class Interval(NamedTuple):
    """Any float in ``[lo, hi]``, as one of a setting's values in a reference's ``SPACE``."""

    lo: float
    hi: float


def restore_float32_state(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any], keys: Sequence[str] = FLOAT32_STATE
) -> None:
    """Undoes ``Optimizer.load_state_dict``'s cast of floating state to the parameter dtype.

    torch.optim assumes state has the parameter's dtype; Muon's state is float32, and
    casting a bf16 parameter's momentum to bf16 and back would lose bits on resume.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
    for param_id, p in zip(saved_ids, params, strict=True):
        for key, value in state_dict["state"].get(param_id, {}).items():
            if key in keys:
                optimizer.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)


class Muon(torch.optim.Optimizer):
    """Muon for hidden matrices and AdamW for the rest, on one device.

    Groups with ``use_muon=True`` (the default) take 2-D or 3-D parameters; groups with
    ``use_muon=False`` run AdamW with ``adamw_lr``, ``adamw_betas``, ``adamw_eps`` and
    ``adamw_weight_decay``. Every other keyword is a convention described in the module
    docstring; keyword names follow ``torch.optim.Muon``. ``orthogonalize_fn`` replaces
    ``orthogonalize`` (same signature), e.g. a kernel under test; it is handed ``ns_form`` and
    ``ns_normalize`` only where they are not the defaults. Those and ``lr_scale_on`` and
    ``adamw_form`` (``FORM_DEFAULTS``) are taken but are not in ``DEFAULTS``: a candidate is
    not handed them, and the gates do not draw them.
    """

    #: the settings the gates draw, each with its values, the default (the shrink target) first
    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {
        "lr": (0.02, 0.1, 1e-3, 0.5),
        "momentum": (0.95, Interval(0.0, 0.99)),
        "nesterov": (True, False),
        "weight_decay": (0.0, 0.1, 0.01),
        "ns_steps": (5, 1, 3, 0),
    }
    #: the convention settings, drawn like ``SPACE`` and fixed by a candidate's declared conventions
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {
        "momentum_form": get_args(MomentumForm),
        "ns_coefficients": get_args(CoefficientsName),
        "eps_form": get_args(EpsForm),
        "ns_dtype": _NS_DTYPES,
        "adjust_lr_fn": get_args(LrAdjust),
    }
    #: the parameters its Muon groups take, by number of dimensions (``use_muon=False`` groups take any)
    PARAM_NDIMS: ClassVar[tuple[int, ...]] = (2, 3)
    #: the state it keeps per parameter; each is compared with a candidate's state of that name
    STATE: ClassVar[tuple[str, ...]] = FLOAT32_STATE
    DEFAULTS: ClassVar[dict[str, Any]] = MUON_DEFAULTS
    #: the settings taken beside ``DEFAULTS`` that express another Muon's arithmetic
    FORMS: ClassVar[dict[str, Any]] = FORM_DEFAULTS
    #: the causes of difference muongate calibrates for its arithmetic (``harness.verdicts.causes``)
    CAUSES: ClassVar[dict[str, str]] = MUON_CAUSES
    #: the gates' claims that hold for this family alone: its update is Newton–Schulz's (the
    #: gathered and owner-split modes, the causes of difference), beside AdamW groups, with the
    #: norm's bf16 ties and the output's spectrum, and on row blocks (``ns_heads``, ``ns_split``);
    #: ``harness.algorithms`` reads them
    CLAIMS: ClassVar[frozenset[str]] = frozenset(
        {"newton_schulz", "hybrid_groups", "bf16_norm_ties", "oracle_spectrum", "tier:causes", "heads", "qk_clip"}
    )
    #: the optimizer's name in the engine contract (``harness.engines``)
    ENGINE_NAME: ClassVar[str | None] = "muon"
    #: the state that shows which algorithm stepped a parameter: a ``use_muon`` group's (the
    #: first route) or an AdamW group's; the routing audit reads a candidate's state by it
    ROUTES: ClassVar[dict[str, tuple[str, ...]]] = {"Muon": ("momentum_buffer",), "AdamW": ("exp_avg", "exp_avg_sq")}
    #: raises ``ValueError`` naming the first setting of a param group out of range (as ``PerParameter``'s)
    VALIDATE: ClassVar[Callable[[dict[str, Any]], None]] = validate_settings

    def __init__(
        self, params: Iterable[Any], *, orthogonalize_fn: Callable[..., Tensor] | None = None, **settings: Any
    ) -> None:
        self.orthogonalize_fn = orthogonalize_fn
        defaults = type(self).DEFAULTS
        unknown = set(settings) - set(defaults) - set(type(self).FORMS)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted({**defaults, **type(self).FORMS})}")
        super().__init__(params, {**defaults, **settings})
        for gi, group in enumerate(self.param_groups):
            type(self).VALIDATE(group)
            for name, p in zip(param_names(group, gi), group["params"], strict=True):
                self._check_param(name, p, group["use_muon"])
                if group["use_muon"]:
                    try:
                        row_blocks(p.shape[-2], group)
                    except ValueError as e:
                        raise ValueError(f"parameter {name!r} of shape {tuple(p.shape)}: {e}") from None

    def _check_param(self, name: str, p: Tensor, use_muon: bool) -> None:
        """Raises ``ValueError`` naming a parameter this optimizer cannot take."""
        if use_muon and p.ndim not in (2, 3):
            raise ValueError(
                f"parameter {name!r} of a Muon group has shape {tuple(p.shape)}: Muon takes "
                "2-D matrices or 3-D stacks of matrices; put it in a group with use_muon=False"
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        restore_float32_state(self, state_dict, type(self).STATE)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if form_of(group, "adamw_steps") == "group":
                group["step"] = group.get("step", 0) + 1
            self._group_step([p for p in group["params"] if p.grad is not None], group)
        return loss

    def _group_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """One step of one param group, over the parameters that have a gradient."""
        for p in params:
            grad = cast(Tensor, p.grad)  # step() passes only parameters with a gradient
            if group["use_muon"]:
                self._muon_step(p, grad, self.state[p], group)
            else:
                self._adamw_step(p, grad, self.state[p], group)

    def _muon_step(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        update = momentum_update(
            state["momentum_buffer"], grad, group["momentum"], group["nesterov"], group["momentum_form"]
        )
        ortho, scales = self._scaled(group_orthogonalizer(group, self.orthogonalize_fn)(update), state, group, p.shape)
        rows = p.shape[-2]
        apply_blocks(p, ortho, group, scales, range(rows), rows)

    @staticmethod
    def _scaled(
        ortho: Tensor, state: dict[str, Any], group: dict[str, Any], shape: Sequence[int]
    ) -> tuple[Tensor, tuple[float, ...]]:
        """The update from Newton–Schulz's output of a matrix of global ``shape``, and the factors
        the lr is multiplied by, one per row block: the output itself and Muon's lr scale of each
        block (``block_scales``; a family that does more with the output, NorMuon, does it here,
        with ``state``)."""
        return ortho, block_scales(shape, group)

    @staticmethod
    def _adamw_step(p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        state["step"] += 1
        form = form_of(group, "adamw_form")
        t = cast(int, group["step"] if form_of(group, "adamw_steps") == "group" else state["step"])
        moments = (p, grad, state["exp_avg"], state["exp_avg_sq"], t)
        lr, betas, eps, wd = group["adamw_lr"], group["adamw_betas"], group["adamw_eps"], group["adamw_weight_decay"]
        if form == "keller":
            keller_adam_update(*moments, lr=lr, betas=betas, eps=eps, weight_decay=wd)
        else:
            squares: Literal["addcmul", "lerp"] = "lerp" if form == "lerp" else "addcmul"
            kernels = form_of(group, "adamw_kernels")
            adamw_update(*moments, lr=lr, betas=betas, eps=eps, weight_decay=wd, squares=squares, kernels=kernels)
