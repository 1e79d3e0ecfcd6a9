"""A training case's mixed precision, as FSDP2 applies it and as one device follows it.

``Precision`` declares what a training step computes in: FSDP2's ``MixedPrecisionPolicy``
(``param``: the dtype the gathered parameters, the forward and the backward run in;
``reduce``: the dtype the gradients are reduced in, FSDP2's default being ``param``'s) and an
optional ``torch.autocast`` around the forward. The sharded side lays its model out with
``policy()`` and runs its forward in ``forward()``. The one-device side follows the same
declaration (``micro_batch_grads``, ``mean``): each micro-batch's forward and backward on a copy
of its parameters cast to ``param``, each gradient cast to ``reduce``, the sum in ``reduce``,
then the mean cast back to the parameter's dtype, as FSDP2's reduce-scatter leaves it. So a
layout that reduces in another dtype than it declares differs from the one-device step, while
the one-device step cannot share that narrower reduction: it follows the declaration, not the
layout.

At 2 ranks every such step is bitwise: each rank's forward and backward is the one-device
side's on the same micro-batch and the same cast parameters, and a sum of two values, rounded
once in ``reduce`` and halved, does not depend on their order.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """What a training step computes in (module docstring); every field ``None``: the
    parameters' own dtype throughout, no autocast (FSDP2's default)."""

    #: FSDP2's ``param_dtype``: the gathered parameters, forward and backward
    param: str | None = None
    #: FSDP2's ``reduce_dtype`` (``None``: ``param``'s, FSDP2's default)
    reduce: str | None = None
    #: ``torch.autocast``'s dtype around the forward, on the ranks' device
    autocast: str | None = None

    def __post_init__(self) -> None:
        for name in ("param", "reduce", "autocast"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"Precision {name}={value!r}: one of {sorted(DTYPES)} or None")
        if self.reduce is not None and self.param is None:
            raise ValueError(
                f"Precision reduce={self.reduce!r} without param: FSDP2 reduces in the parameters' own dtype "
                "unless a param dtype is declared"
            )

    @property
    def mixed(self) -> bool:
        return any((self.param, self.reduce, self.autocast))

    def policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` of this declaration."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=_dtype(self.param), reduce_dtype=_dtype(self.reduce))

    @contextlib.contextmanager
    def forward(self, device: torch.device) -> Iterator[None]:
        """Where a forward runs: under ``torch.autocast`` on ``device`` if declared."""
        if self.autocast is None:
            yield
            return
        with torch.autocast(device.type, dtype=DTYPES[self.autocast]):
            yield

    def computed_on(self, model: nn.Module) -> nn.Module:
        """The model a one-device forward runs: ``model`` itself, or a copy cast to ``param``."""
        return model if self.param is None else copy.deepcopy(model).to(DTYPES[self.param])

    def mean(self, grads: Sequence[Sequence[Tensor | None]], params: Sequence[Tensor]) -> list[Tensor]:
        """The mean over ranks of each parameter's gradient, reduced as declared: each rank's
        gradient cast to the reduce dtype, summed in rank order in it, divided by the ranks,
        cast to the parameter's dtype (zeros where no rank has one)."""
        reduce = self.reduce or self.param
        means = []
        for i, p in enumerate(params):
            dtype = p.dtype if reduce is None else DTYPES[reduce]
            total: Tensor | None = None
            for rank in grads:
                g = rank[i]
                if g is not None:
                    total = g.to(dtype) if total is None else total + g.to(dtype)
            if total is None:
                total = torch.zeros(p.shape, dtype=dtype, device=p.device)
            means.append((total / len(grads)).to(p.dtype))
        return means

    def describe(self) -> str:
        if not self.mixed:
            return "the parameters' dtype throughout"
        parts = []
        if self.param is not None:
            parts.append(f"{self.param} params, {self.reduce or self.param} reduce (FSDP2 MixedPrecisionPolicy)")
        if self.autocast is not None:
            parts.append(f"{self.autocast} autocast")
        return ", ".join(parts)

    def clause(self) -> str:
        """``", " + describe()`` where mixed, for a case's description; else nothing."""
        return f", {self.describe()}" if self.mixed else ""


#: FSDP2's default: no mixed precision
FULL = Precision()


def precision_of(spec: Any) -> Precision:
    """A training spec's declared precision (``FULL`` where it declares none)."""
    return getattr(spec, "precision", FULL)


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else DTYPES[name]
