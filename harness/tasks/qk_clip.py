"""QK-clip on a rank, after each step of an optimizer case that has a ``Case.qk_clip``.

The harness stands in for attention's forward: each replica of the batch (a coordinate of the
mesh's dims other than ``tp``; tensor-parallel ranks share their replica's batch) observes the
largest logit of each head on its micro-batches, drawn from the case's seed in [0, 2). The
candidate's QK-clip (``Candidate.qk_clip``: ``qk_clip(model, [(q, k, maxima)], tau, alpha)``,
``q`` and ``k`` the projections' paths in the model, ``q_proj.weight`` where they are
``nn.Linear`` weights) gets this rank's maxima and rescales the projections it holds; the reference
(``reference.qk_clip``) rescales the whole projections by the maxima over every replica. The
optimizer gates' comparisons after the step then judge the clipped weights bit for bit, on every
rank, so that a replica that took its own maximum differs from the reference there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from harness.candidates.declaration import declaration_of
from harness.cases.case import Case
from harness.tasks.common import factory_of
from harness.tasks.layouts import CaseModule
from reference.qk_clip import qk_clip_


def qk_clip_of(case: Any) -> Callable[..., Any]:
    """The case's candidate's declared QK-clip (``Candidate.qk_clip``); one it lacks is refused by name."""
    factory = factory_of(case)
    found = declaration_of(factory).qk_clip
    if found is None:
        raise TypeError(f"{factory!r} declares no qk_clip (Candidate.qk_clip); the QK-clip gate skips it")
    return found


def replica(mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's replica of the batch (its coordinate on every dim but ``tp``) and how many there are."""
    names = mesh.mesh_dim_names or tuple(str(d) for d in range(mesh.ndim))
    index, count = 0, 1
    for dim, name in enumerate(names):
        if name != "tp":
            index, count = index * mesh.size(dim) + mesh.get_local_rank(dim), count * mesh.size(dim)
    return index, count


def observed(case: Case, step: int, index: int) -> Tensor:
    """The largest logit of each head on replica ``index``'s batch at ``step``, in [0, 2)."""
    assert case.qk_clip is not None
    # integers only: a string's hash differs between processes
    generator = torch.Generator().manual_seed(hash((case.seed, step, index, 5)) % 2**62)
    return 2 * torch.rand(case.qk_clip.heads, generator=generator)


def qk_clip_step(case: Case, step: int, model: nn.Module, mesh: DeviceMesh, ref_params: Mapping[str, Tensor]) -> None:
    """The candidate's QK-clip on this rank's maxima, and the reference's on every replica's."""
    clip = case.qk_clip
    assert clip is not None
    index, count = replica(mesh)
    q, k = (model.paths.get(name, name) if isinstance(model, CaseModule) else name for name in (clip.q, clip.k))
    qk_clip_of(case)(model, [(q, k, observed(case, step, index))], clip.tau, clip.alpha)
    if ref_params:
        # The maxima where the reference's weights are: the factors' powers are the device's
        # (CUDA's pow is not the CPU's, by an ULP), as a candidate's on its own device are.
        whole = torch.stack([observed(case, step, i) for i in range(count)]).amax(0).to(ref_params[clip.q].device)
        with torch.no_grad():
            qk_clip_(ref_params[clip.q], ref_params[clip.k], whole, clip.tau, clip.alpha)
