"""Single-device AdamW, the reference for the Adam family of sharded optimizers.

Adam (Kingma & Ba, 2015) keeps two running averages per element, of the gradient and of its
square, and moves each element by the first over the square root of the second. Everything
is elementwise, so a sharded AdamW has no excuse: every rank's piece of the parameter and of
each state tensor must carry the same bits as that piece of the single-device result. The
bugs are in what is *not* elementwise: the step count behind the bias correction, how a
state is created, and (in low-bit variants) the blocks a state is quantized in.

Published Adams differ in a handful of conventions, each a setting here:

weight decay (``weight_decay_form``)
    ``"decoupled"`` (AdamW, Loshchilov & Hutter): ``p ← p·(1 − lr·wd)`` before the update.
    ``"l2"`` (``torch.optim.Adam``'s ``weight_decay``): ``g ← g + wd·p``, so the decay goes
    through both moments.
bias correction (``bias_correction``)
    ``True``: the moments are divided by ``1 − β₁ᵗ`` and ``1 − β₂ᵗ``, with ``t`` the number of
    steps *this parameter* has taken (a step without a gradient does not count).
    ``False``: they are used as they are (some fused kernels, and Adafactor-style code).
eps form (``eps_form``)
    ``"outside"`` (torch, Kingma & Ba): ``m̂ / (√v̂ + eps)``; ``"inside"`` (optax's ``eps_root``,
    some TPU code): ``m̂ / √(v̂ + eps)``.
state dtype (``state_dtype``)
    ``"param"`` (torch.optim): the moments have the parameter's dtype and the arithmetic runs
    in it. ``"float32"``: the moments are float32 whatever the parameter, the arithmetic runs
    in float32 and a low-precision parameter is rounded once at the end (``reference.Muon``'s
    AdamW groups, mixed-precision trainers).
``maximize``
    The gradient's sign is flipped first.
``amsgrad``
    The denominator uses the running maximum of the second moment (state ``max_exp_avg_sq``).
``grad is None``
    The parameter is skipped entirely: no decay, no moment update, no step count.
the step count
    ``state["step"]`` is a float32 0-d tensor on the CPU, and ``β**t`` is taken in Python
    floats from it, as ``torch.optim.AdamW`` does.
kernels (``kernels``, a form: ``ADAMW_FORMS``)
    ``"single_tensor"``: each operation is the tensor's own (``torch.optim.AdamW(foreach=False)``).
    ``"foreach"``: the same operations through torch's ``_foreach_*`` kernels on one-element
    lists, in ``torch.optim.AdamW(foreach=True)``'s order (its default on CUDA, and what
    Megatron-core steps). Their bits differ on the CPU in bf16 (``p.mul_(0.99)`` in place is not
    ``_foreach_mul_``'s, measured; float32 agreed on 300 of 300 runs). Torch has it for its own
    conventions only, so it takes decoupled or L2 decay, ``bias_correction=True``,
    ``eps_form="outside"`` and ``state_dtype="param"``.
    Like Muon's forms it is taken but not in ``DEFAULTS``: candidates are not handed it and the
    gates do not draw it; an engine's ``conventions`` name it.

With ``weight_decay_form="decoupled"``, ``bias_correction=True``, ``eps_form="outside"`` and
``state_dtype="param"``, a step is ``torch.optim.AdamW(foreach=False)``'s single-tensor
arithmetic, operation for operation, and gives its bits; with ``"l2"``, ``torch.optim.Adam``'s
(``tests/test_reference_adamw.py`` holds both over generated cases), and with
``kernels="foreach"`` their ``foreach=True`` forms'. It is not torch's ``fused`` kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, cast, get_args

import torch
from torch import Tensor

from reference.muon import foreach_adam_update, param_names, torch_kernels

WeightDecayForm = Literal["decoupled", "l2"]
AdamEpsForm = Literal["outside", "inside"]
StateDtype = Literal["param", "float32"]
AdamKernels = Literal["single_tensor", "foreach", "default"]

ADAMW_DEFAULTS: dict[str, Any] = dict(
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=1e-2,
    amsgrad=False,
    maximize=False,
    weight_decay_form="decoupled",
    bias_correction=True,
    eps_form="outside",
    state_dtype="param",
)
#: the settings that express another implementation's kernels; taken, not in ``ADAMW_DEFAULTS``
ADAMW_FORMS: dict[str, Any] = dict(kernels="single_tensor")


def validate_adamw_settings(group: dict[str, Any]) -> None:
    """Raises ``ValueError`` naming the first setting of a param group that is out of range."""

    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"{name}={group[name]!r} {why}")

    if not group["lr"] >= 0:
        raise bad("lr", "must be >= 0")
    b1, b2 = group["betas"]
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise bad("betas", "must both be in [0, 1)")
    if not group["eps"] >= 0:
        raise bad("eps", "must be >= 0")
    if not group["weight_decay"] >= 0:
        raise bad("weight_decay", "must be >= 0")
    for name, choices in (
        ("weight_decay_form", get_args(WeightDecayForm)),
        ("eps_form", get_args(AdamEpsForm)),
        ("state_dtype", get_args(StateDtype)),
        ("kernels", get_args(AdamKernels)),
    ):
        if name in group and group[name] not in choices:
            raise bad(name, f"is not one of {choices}")
    if group.get("kernels") in ("foreach", "default"):
        torch_forms = dict(bias_correction=True, eps_form="outside", state_dtype="param")
        for name, value in torch_forms.items():
            if group[name] != value:
                raise bad(name, f"cannot be taken with kernels={group['kernels']!r} (torch's Adam is {name}={value!r})")
    for name in ("amsgrad", "maximize", "bias_correction"):
        if not isinstance(group[name], bool):
            raise bad(name, "must be True or False")


def init_adam_state(param: Tensor, state: dict[str, Any], *, amsgrad: bool, state_dtype: StateDtype) -> None:
    """A parameter's first state: step 0 and zero moments of the state dtype."""
    dtype = torch.float32 if state_dtype == "float32" else param.dtype
    state["step"] = torch.tensor(0.0, dtype=torch.float32)
    state["exp_avg"] = torch.zeros(param.shape, dtype=dtype, device=param.device)
    state["exp_avg_sq"] = torch.zeros(param.shape, dtype=dtype, device=param.device)
    if amsgrad:
        state["max_exp_avg_sq"] = torch.zeros(param.shape, dtype=dtype, device=param.device)


def adam_step(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Any],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    weight_decay_form: WeightDecayForm,
    bias_correction: bool,
    eps_form: AdamEpsForm,
    state_dtype: StateDtype,
    kernels: AdamKernels = "single_tensor",
) -> None:
    """One step of one parameter, its state created on the first call. Elementwise, so a
    piece of ``param``, ``grad`` and every state tensor gives that piece of the result."""
    if torch_kernels(kernels, param) == "foreach":
        _foreach_adam_step(
            param,
            grad,
            state,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled=weight_decay_form == "decoupled",
        )
        return
    wide = state_dtype == "float32" and param.dtype != torch.float32
    if "step" not in state:
        init_adam_state(param, state, amsgrad=amsgrad, state_dtype=state_dtype)
    p = param.float() if wide else param
    g = grad.float() if wide else grad
    if maximize:
        g = -g
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    step_t = state["step"]
    step_t += 1
    beta1, beta2 = betas
    if weight_decay != 0:
        if weight_decay_form == "decoupled":
            p.mul_(1 - lr * weight_decay)
        else:
            g = g.add(p, alpha=weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    second = exp_avg_sq
    if amsgrad:
        torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
        second = state["max_exp_avg_sq"]
    step = step_t.item()
    step_size = lr / (1 - beta1**step) if bias_correction else lr
    bias_correction2 = 1 - beta2**step if bias_correction else 1.0
    if eps_form == "outside":
        root = second.sqrt()
        denom = (root / bias_correction2**0.5 if bias_correction else root).add_(eps)
    else:
        denom = (second / bias_correction2 if bias_correction else second.clone()).add_(eps).sqrt_()
    p.addcdiv_(exp_avg, denom, value=-step_size)
    if p is not param:
        param.copy_(p)


def _foreach_adam_step(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Any],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
) -> None:
    """``adam_step`` with torch's conventions through ``_foreach_*`` kernels (``kernels="foreach"``)."""
    if "step" not in state:
        init_adam_state(param, state, amsgrad=amsgrad, state_dtype="param")
    state["step"] += 1
    foreach_adam_update(
        param,
        torch._foreach_neg([grad])[0] if maximize else grad,
        state["exp_avg"],
        state["exp_avg_sq"],
        state["step"].item(),
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=decoupled,
        max_exp_avg_sq=state["max_exp_avg_sq"] if amsgrad else None,
    )


class PerParameter(torch.optim.Optimizer):
    """A reference that steps each parameter with a gradient on its own, ``STEP(param, grad, state,
    **settings)``, after its settings are checked by ``VALIDATE(group)`` (``AdamW``, ``Adafactor``).
    ``FORMS`` are settings it takes beside ``DEFAULTS`` that a group holds only where given."""

    DEFAULTS: ClassVar[dict[str, Any]]
    FORMS: ClassVar[dict[str, Any]] = {}
    STEP: ClassVar[Callable[..., None]]
    VALIDATE: ClassVar[Callable[[dict[str, Any]], None]]

    def __init__(self, params: Iterable[Any], **settings: Any) -> None:
        known = {**self.DEFAULTS, **self.FORMS}
        unknown = set(settings) - set(known)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
        super().__init__(params, {**self.DEFAULTS, **settings})
        for gi, group in enumerate(self.param_groups):
            type(self).VALIDATE(group)
            for name, p in zip(param_names(group, gi), group["params"], strict=True):
                if p.is_complex():
                    raise ValueError(
                        f"parameter {name!r} is complex {tuple(p.shape)}: reference.{type(self).__name__} is real only"
                    )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            settings = {k: group[k] for k in self.DEFAULTS}
            settings.update({k: group[k] for k in self.FORMS if k in group})
            for p in group["params"]:
                if p.grad is not None:
                    type(self).STEP(p, cast(Tensor, p.grad), self.state[p], **settings)
        return loss


class AdamW(PerParameter):
    """AdamW on one device, every convention a setting (see the module docstring).

    Keyword names follow ``torch.optim.AdamW``; it takes parameters of any shape.
    """

    #: the settings the gates draw, each with its values, the default (the shrink target) first
    SPACE: ClassVar[dict[str, tuple[Any, ...]]] = {
        "lr": (1e-3, 0.1, 1.0, 1e-5),
        "betas": ((0.9, 0.999), (0.9, 0.95), (0.0, 0.5), (0.5, 0.0)),
        "eps": (1e-8, 1e-3, 1e-16),
        "weight_decay": (1e-2, 0.0, 0.1),
        "amsgrad": (False, True),
        "maximize": (False, True),
    }
    #: the convention settings, drawn like ``SPACE`` and fixed by a candidate's declared conventions
    CONVENTIONS: ClassVar[dict[str, tuple[Any, ...]]] = {
        "weight_decay_form": get_args(WeightDecayForm),
        "bias_correction": (True, False),
        "eps_form": get_args(AdamEpsForm),
        "state_dtype": get_args(StateDtype),
    }
    #: the parameters it takes, by number of dimensions (0 for a scalar)
    PARAM_NDIMS: ClassVar[tuple[int, ...]] = (0, 1, 2, 3)
    #: the state it keeps per parameter; each is compared with a candidate's state of that name
    STATE: ClassVar[tuple[str, ...]] = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")
    #: every element's step reads that element alone
    ELEMENTWISE: ClassVar[bool] = True
    DEFAULTS: ClassVar[dict[str, Any]] = ADAMW_DEFAULTS
    FORMS: ClassVar[dict[str, Any]] = ADAMW_FORMS
    #: the optimizer's name in the engine contract (``harness.engines``)
    ENGINE_NAME: ClassVar[str | None] = "adamw"
    #: the state that shows a parameter stepped as AdamW (the routing audit)
    ROUTES: ClassVar[dict[str, tuple[str, ...]]] = {"AdamW": ("exp_avg", "exp_avg_sq")}
    STEP: ClassVar[Callable[..., None]] = adam_step
    VALIDATE = validate_adamw_settings

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``Optimizer.load_state_dict``, keeping float32 moments float32 under ``state_dtype="float32"``
        (it casts floating state to the parameter's dtype, which would lose bits on resume)."""
        super().load_state_dict(state_dict)
        saved = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [(p, group) for group in self.param_groups for p in group["params"]]
        for param_id, (p, group) in zip(saved, params, strict=True):
            if group["state_dtype"] != "float32":
                continue
            for key, value in state_dict["state"].get(param_id, {}).items():
                if key != "step" and isinstance(value, Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
