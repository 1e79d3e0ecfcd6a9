"""Megatron-core's ``DistributedDataParallel`` and its ``DistributedOptimizer`` (ZeRO-1 over data
parallel, in buckets), with its Adam, as a muongate engine (``harness.engines``)::

    pip install --no-deps --ignore-requires-python megatron-core==0.19.2   # and triton, on CUDA
    pytest -m gate --gate-device cuda --nproc 1 --engine examples.megatron_adapter:megatron_ddp

Megatron-core allocates its buffers and its optimizers' scalars on CUDA unconditionally
(docs/pages/engines.md, "Megatron-core", has the lines and the errors on CPU), so the adapter
needs a GPU per rank: ``--gate-device cuda`` (NCCL), the engine on ``cuda:(rank % GPUs)``. Ranks
cannot share one GPU here: under ``--gate-device cpu`` the pool hides the GPUs from its ranks,
and the factory refuses, in one line, before it touches Megatron. On a GPU machine of one card
this judges a world of one (Megatron's arithmetic, buffers and buckets, none of the sharding).

What it declares, and why:

- Stage 0: Megatron's DDP all-reduces the gradients into its contiguous gradient buffer, and a
  replicated ``FP32Optimizer`` (float32 models) or ``Float16OptimizerWithFloat16Params``
  (bf16 models, float32 masters) steps. Stage 1: ``use_distributed_optimizer=True``: the
  buffer is reduce-scattered, each rank steps its range of every bucket (a range that starts
  and ends inside parameters), and the parameters are all-gathered again.
- ``optimizer="adam"`` with ``decoupled_weight_decay=True``: without Transformer Engine or apex
  Megatron steps ``torch.optim.AdamW``, whose default on CUDA is its ``foreach`` kernels; judged
  against ``reference.AdamW(kernels="foreach")`` on the same GPU (``conventions``): bitwise on
  one H100, every steps cell, float32 and bf16. Against the single-tensor reference a third of
  the cases had differed by 1 to 13 ULP in the parameter.
- ``overlap_grad_reduce`` on and off (``options``): on, the buffer is split into buckets of 16
  elements (``bucket_size``), so most cases have several buckets and parameters that straddle
  the ranks' ranges inside them; off, Megatron makes one bucket.
- Accumulation 1, 2 and 4, as Megatron's schedule runs it: the loss of each micro-batch divided
  by their number, gradients accumulated in the buffer, the reduction at the last
  (``no_sync`` around the others).
- A parameter without a gradient steps on zeros: Megatron's buffer holds zeros for it, and its
  Adam steps every parameter it holds (``missing_gradient="zeros"``). With
  ``overlap_grad_reduce`` Megatron needs a gradient for every parameter of a bucket at every
  step (a bare ``AssertionError`` in ``_ParamAndGradBucketGroup.reset`` otherwise), so those
  cases give every parameter one (``needs_every_grad``).
- Clipping (``clip_grad``): Megatron's ``get_grad_norm_fp32`` and ``clip_grad_by_total_norm_fp32``
  multiply by ``max / (norm + 1e-6)`` where that is below 1 (``"torch"``'s form); without
  apex it returns the norm as a Python float, which the adapter hands back as a float64 tensor.
- Checkpoints at stage 0, as Megatron's training saves one: the model's and the optimizer's
  ``state_dict``, loaded by a fresh engine, and at another world size as they are (stage 0's
  state is whole on every rank: the conversion is a copy, and the gate judges the load).
  Not at stage 1: there the parameter state goes through ``save_parameter_state`` and
  ``load_parameter_state`` (its ``dp_zero`` format), and with torch's AdamW (no Transformer
  Engine, no apex) ``load_state_dict`` gives every parameter's state a ``step`` tensor that
  ``load_parameter_state`` then looks for among the saved tensors:
  ``KeyError: 'step'`` at ``distrib_optimizer.py:1223``, seen with the CUDA calls sent to the
  CPU (docs/pages/engines.md), not yet on a GPU.
- ``config_overrides={}``: Megatron's default overrides give biases and vectors ``wd_mult=0``,
  which only its ``OptimizerParamScheduler`` applies; with none, every parameter decays alike,
  as the reference does, whether or not a scheduler runs.

Not declared: Megatron's Muon (``optimizer="muon"``, emerging-optimizers' ``TensorParallelMuon``;
its layer-wise distributed form is bf16 only and was not run here), Megatron-FSDP, and tensor,
pipeline and expert parallelism (the ``GradientFeed`` is a data-parallel model).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from harness.engines import Engine, EngineConfig

#: the release the adapter was written against and run with
RELEASE = "0.19.2"
#: elements per bucket with ``overlap_grad_reduce`` (several buckets for the cases' shapes)
BUCKET_SIZE = 16
ADAM_STATE = ("exp_avg", "exp_avg_sq")


def refusal(gpus: int) -> str | None:
    """Why the adapter cannot build an engine here (one line), or ``None``."""
    if gpus < 1:
        return (
            "examples.megatron_adapter needs a GPU: megatron-core allocates its gradient buffers and "
            "its optimizers' scalars on CUDA (docs/pages/engines.md, 'Megatron-core')"
        )
    return None


def _initialized() -> None:
    """Megatron's parallel state over every rank (data parallel only), once per process."""
    from megatron.core import parallel_state

    world = dist.get_world_size()
    if parallel_state.model_parallel_is_initialized():
        if parallel_state.get_data_parallel_world_size() == world:
            return
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 1)


class MegatronRun:
    """One Megatron DDP and optimizer on this rank (``harness.engines.EngineRun``)."""

    def __init__(self, model: nn.Module, config: EngineConfig, group: Any) -> None:
        refused = refusal(torch.cuda.device_count())
        if refused:
            raise RuntimeError(refused)
        if dist.get_world_size(group) != dist.get_world_size():
            raise ValueError("Megatron's parallel state spans the default process group: run its cases on every rank")
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        _initialized()
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer import TransformerConfig

        s = config.options
        bf16 = config.dtype == "bfloat16"
        dtype = torch.bfloat16 if bf16 else torch.float32
        self.config = config
        self.micro = 0
        self.norm: Tensor | None = None
        overlap = bool(s.get("overlap_grad_reduce", False))
        transformer = TransformerConfig(
            num_layers=1, hidden_size=8, num_attention_heads=1, bf16=bf16, params_dtype=dtype
        )
        ddp = DistributedDataParallelConfig(
            use_distributed_optimizer=config.stage == 1,
            overlap_grad_reduce=overlap,
            bucket_size=BUCKET_SIZE if overlap else None,
        )
        self.ddp = DistributedDataParallel(transformer, ddp, model.cuda())
        optimizer = OptimizerConfig(
            optimizer="adam",
            lr=s["lr"],
            weight_decay=s["weight_decay"],
            adam_beta1=s["betas"][0],
            adam_beta2=s["betas"][1],
            adam_eps=s["eps"],
            decoupled_weight_decay=True,
            bf16=bf16,
            params_dtype=dtype,
            use_distributed_optimizer=config.stage == 1,
            clip_grad=config.clip,
        )
        self.optimizer = get_megatron_optimizer(optimizer, [self.ddp], config_overrides={})
        #: the optimizers Megatron chains (a ``ChainedOptimizer`` of one here: no expert parameters)
        self.chained = list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))
        self.params = dict(self.ddp.module.named_parameters())

    @property
    def module(self) -> nn.Module:
        return self.ddp  # type: ignore[no-any-return]

    def backward(self, loss: Tensor) -> None:
        # Megatron's schedule divides each micro-batch's loss by their number, and reduces at the last
        last = (self.micro + 1) % self.config.accumulate == 0
        if last:
            (loss / self.config.accumulate).backward()
        else:
            with self.ddp.no_sync():
                (loss / self.config.accumulate).backward()

    def step(self) -> None:
        self.micro += 1
        if self.micro % self.config.accumulate:
            return
        self.ddp.finish_grad_sync()
        ok, norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("Megatron's optimizer skipped the step (it found inf or NaN in the gradients)")
        self.norm = None if norm is None else torch.as_tensor(norm, dtype=torch.float64)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def grad_norm(self) -> Tensor | None:
        """The norm Megatron clipped its last step by (a Python float there; float64 here)."""
        return self.norm

    # -- reading through Megatron's own structures ---------------------------------------
    def _master(self, p: Tensor) -> Tensor:
        """Stage 0's float32 parameter: the model's own, or the bf16 model's master copy."""
        found = getattr(p, "main_param", None)
        return p if found is None else found

    def _pieces(self, p: Tensor) -> dict[str, tuple[int, int, Tensor]]:
        """Stage 1: this rank's range of ``p`` (within the flattened parameter) and its float32
        main parameter and Adam state there, as the distributed optimizer maps them."""
        for optimizer in self.chained:
            if p in optimizer.model_param_group_index_map:
                span = optimizer._get_model_param_range_map(p)["param"]
                tensors = optimizer._get_main_param_and_optimizer_states(p)
                return {k: (span.start, span.end, v.detach().float().cpu()) for k, v in tensors.items() if v.ndim > 0}
        return {}

    def _full(self, name: str, keys: tuple[str, ...]) -> dict[str, Tensor]:
        """Stage 1's whole ``keys`` of ``name`` from every rank's range, in one collective."""
        p = self.params[name]
        mine = {k: v for k, v in self._pieces(p).items() if k in keys}
        held: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(held, mine)
        found: dict[str, Tensor] = {}
        for key in keys:
            pieces = [h[key] for h in held if key in h]
            if not pieces:
                continue
            whole = torch.full((p.numel(),), float("nan"))
            for start, end, value in pieces:
                whole[start:end] = value
            found[key] = whole.view(p.shape).to(p.device)
        return found

    def full_param(self, name: str) -> Tensor:
        if self.config.stage == 1:
            found = self._full(name, ("param",))
            assert found, f"no rank holds a range of {name}"
            return found["param"]
        return self._master(self.params[name]).detach().float().clone()

    def full_state(self, name: str) -> Mapping[str, Tensor]:
        if self.config.stage == 1:
            return self._full(name, ADAM_STATE)
        master = self._master(self.params[name])
        own = next((o.optimizer.state[master] for o in self.chained if master in o.optimizer.state), {})
        return {k: own[k].clone() for k in ADAM_STATE if k in own}

    # -- checkpoints, as Megatron's training writes them ---------------------------------
    def save(self, path: str) -> None:
        rank = dist.get_rank()
        if rank == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
        dist.barrier()
        if self.config.stage == 1:
            self.optimizer.save_parameter_state(str(Path(path, "distrib_optim.pt")))
        if rank == 0:
            torch.save(
                {"model": self.ddp.module.state_dict(), "optimizer": self.optimizer.state_dict()},
                Path(path, "model_optim_rng.pt"),
            )
        dist.barrier()

    @torch.no_grad()
    def load(self, path: str) -> None:
        where = next(self.ddp.module.parameters()).device
        saved = torch.load(Path(path, "model_optim_rng.pt"), map_location=where, weights_only=False)
        self.ddp.module.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.config.stage == 1:
            self.optimizer.load_parameter_state(str(Path(path, "distrib_optim.pt")))


def as_saved(saved: str, out: str) -> None:
    """Stage 0's checkpoint loads at any data-parallel size as it is (see the module docstring)."""
    shutil.copytree(saved, out)


@Engine(
    stages={0, 1},
    optimizers={"adamw"},
    options={"adamw": {"overlap_grad_reduce": (True, False)}},
    dtypes={"float32", "bfloat16"},
    missing_gradient="zeros",
    needs_every_grad=lambda config: bool(config.options.get("overlap_grad_reduce")),
    checkpoint={0},
    reshard=as_saved,
    reshard_stages={0},
    reshard_optimizers={"adamw"},
    # Megatron multiplies by max / (norm + 1e-6) where that is below 1 (torch's min(…, 1) form)
    clip=lambda config: "torch",
    # torch.optim.AdamW's default on CUDA tensors (reference/adamw.py, "kernels")
    conventions=lambda config: {"kernels": "foreach"},
    package=f"megatron-core=={RELEASE}",
    # its gradient buffers and its optimizers' scalars are allocated on CUDA (``refusal``)
    devices={"cuda"},
)
def megatron_ddp(model: nn.Module, config: EngineConfig, group: Any) -> MegatronRun:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    return MegatronRun(model, config, group)
