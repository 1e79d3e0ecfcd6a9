"""DeepSpeed's ZeRO stages 0–3, with its Muon and its AdamW, as a muongate engine
(``harness.engines``), on every release that has Muon (0.17.6 and later; 0.19.8 is pinned in
``examples/engines-no-deps.txt``)::

    pip install --no-deps -r examples/engines-no-deps.txt
    pytest -m gate --nproc 2 --engine examples.deepspeed_adapter:deepspeed_zero

An older release is refused at import, in one line naming it and why (``refusal``).

What it declares, and why:

- Stages 0, 1, 2 and 3; ``"type": "muon"`` (``MuonWithAuxAdam``: Muon for every matrix whose
  name holds neither ``embed`` nor ``lm_head``, its AdamW for the rest) and ``"type": "adamw"``,
  both with ``"torch_adam": true`` (``torch.optim.AdamW``, not the FusedAdam it would compile).
- ``reduce_scatter`` on and off at stages 1, 2 and 3 (ZeRO 1–2 read it; stage 0 has no
  partitioned reduction), but off only for stage 3's Muon (it refuses it on: "Muon and reduce
  scatter cannot be used together");
  accumulation 1, 2 and 4; float32 and bf16 (float32 masters at every stage).
- A parameter without a gradient steps on zeros (decayed, its state started), as DeepSpeed's
  engine does at every stage and its one-device ``MuonWithAuxAdam`` does ("force
  synchronization"); the one-device side is given zeros too (``missing_gradient="zeros"``).
  At stages 1–3 only where no rank's loss reaches it: a parameter that one rank's loss reaches
  and another's does not makes gloo abort the job (``needs_same_grads``; matrix finding 36).
- Muon's ``ns_method``, ``"gram"`` and ``"standard"``, from 0.19.0 (the releases before take
  no such key and run ``"standard"``'s iteration).
- AdamW is judged against ``reference.AdamW`` with ``kernels="default"``: torch's AdamW at its
  default, foreach on CUDA, its for-loop on the CPU (``torch_adam`` hands DeepSpeed's optimizer
  ``torch.optim.AdamW`` with no ``foreach``; the two kernels differ by a few ULP on CUDA).
  Muon against ``reference.Muon`` on the settings that are DeepSpeed's arithmetic
  (``conventions``, each a setting of the reference read from DeepSpeed's source of that
  release, none of DeepSpeed's code run on the reference's side): ``ns_method="gram"`` is
  ``ns_form="gram"`` in fp16 (fp32 where the accelerator has no fp16; the CPU accelerator has
  it where oneDNN does), normalized in float32 before the cast from 0.19.8
  (``ns_normalize="input"``), advanced by ``addmm`` in 0.19.0–0.19.1 (``"gram_addmm"``);
  ``"standard"`` is ``ns_form="expanded"`` in bf16; the lr scale multiplies the update in the
  Newton–Schulz dtype (``lr_scale_on="update"``); the AdamW half is Keller Jordan's inline
  ``adam_update`` up to 0.19.5 and ``torch.optim.AdamW`` from 0.19.6 (``"torch_adam": true``,
  at its default kernels: ``adamw_kernels="default"``), at DeepSpeed's own betas (0.9, 0.95)
  and eps 1e-10 for it. DeepSpeed's own ``MuonWithAuxAdam`` on one device is compared too and
  shown beside the verdict (``shown``): where the two disagree, the reference is what decides, so a bug the engine
  shares with its one-device optimizer fails the gate, and one of the one-device optimizer
  alone does not fail a correct stage. A bf16 model's momentum is rounded to bf16 at stages 1–3
  (``examples/findings/deepspeed_muon_bf16_momentum.py``), which the reference does not take:
  those cells differ, a finding. A CI that runs DeepSpeed as it is accepts its documented
  findings for the release they hold for: ``--accept=examples/accepted/deepspeed-0.19.8.toml``
  (``harness/plugin/accepted.py``) keeps exactly those cells green as accepted.
- Universal checkpoints (``ds_to_universal``) convert stages 1–3 of AdamW for another world
  size; DeepSpeed's converter knows AdamW's state only, so Muon's momentum is not declared.
- Per-head Muon (``"per_head_muon": true``, ``per_head``), where the release has it: DeepSpeed
  tags the query projection by its leaf name and the model's ``config`` and orthogonalizes it
  per head, each head with its own shape's lr scale on the update, which is the reference's
  ``ns_heads`` on the same conventions. Its own one-device ``MuonWithAuxAdam``, shown beside,
  is not given the head count (DeepSpeed tags parameters in its engine only), so it steps that
  matrix whole.

What the adapter sets, as a user on a CPU machine would: the CPU accelerator where no GPU
is seen, ``LOCAL_RANK`` (the rank's GPU where there are GPUs: ranks that share one card share its
index), no shared-memory all-reduce op (it is built at start-up where a
compiler is present, and only inference uses it), ``"gradient_clipping"`` the case's max norm,
0 where the case does not clip (DeepSpeed's default clips at 1.0); the clipping cells
(``clip``: the ZeRO optimizers divide by the clip ratio; stage 0 reports no norm), and ``torch.compile`` off in the processes
that import it (DeepSpeed's Muon is compiled, which on CPU builds C++ kernels on every new
shape; eager runs the same functions, so the compiled kernels are not what the gates judge).
At ZeRO 1–2 it links the optimizer state into the parameters' fragments again before it reads
it, with DeepSpeed's own method: otherwise a Muon model's AdamW state cannot be read
(``examples/findings/deepspeed_muon_adamw_state_unreadable.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from packaging.version import Version
from torch import Tensor, nn

from harness.engines import Engine, EngineConfig

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
# DeepSpeed's Muon functions are torch.compile'd; in every process that imports this adapter
# they run eagerly (as TORCH_COMPILE_DISABLE=1 would have them). Switched off only around the
# engine's calls, one compiled by a call outside them (stage 0's bf16 wrapper steps its
# optimizer inside deepspeed.initialize) stayed cached and served later cases of its shapes in
# the same rank: compiled arithmetic where eager is judged, 5.9e-05 off on a [7, 8] matrix
# (2026-12-03).
torch._dynamo.config.disable = True

import deepspeed  # noqa: E402

#: the first release with Muon (``deepspeed/runtime/zero/muon/``; every release before has none)
FIRST_WITH_MUON = Version("0.17.6")
RELEASE = Version(deepspeed.__version__)
#: the first release whose Muon takes ``ns_method`` ("gram", its default, or "standard")
FIRST_WITH_NS_METHOD = Version("0.19.0")
#: per-head Muon (``"per_head_muon": true``: each attention projection the model's config
#: describes orthogonalized per head), where the release has it
PER_HEAD_SETTING = "per_head_muon"
PER_HEAD = hasattr(deepspeed, "resolve_per_head_muon_after_sharding")


def refusal(release: Version, has_muon: bool) -> str | None:
    """Why this adapter cannot drive ``release`` (one line), or ``None``."""
    if not has_muon or release < FIRST_WITH_MUON:
        return (
            f"DeepSpeed {release} has no Muon (deepspeed/runtime/zero/muon/ arrived in {FIRST_WITH_MUON}); "
            f"examples.deepspeed_adapter drives DeepSpeed {FIRST_WITH_MUON} and later"
        )
    return None


def _has_muon() -> bool:
    try:
        return importlib.util.find_spec("deepspeed.runtime.zero.muon") is not None
    except ModuleNotFoundError:  # a parent package missing too
        return False


_refused = refusal(RELEASE, _has_muon())
if _refused is not None:
    raise ImportError(_refused)

import deepspeed.ops  # noqa: E402
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam  # noqa: E402
from deepspeed.utils import logger, safe_get_full_fp32_param, safe_get_full_optimizer_state  # noqa: E402

# Every op is "not compatible", so the shared-memory all-reduce op is neither probed nor built
# (DeepSpeed reads this table only there); training never calls it. A table that answers False
# for every name, not an empty one: releases before 0.19.7 index it (``[builder.NAME]``), and an
# empty table raised a bare KeyError: 'deepspeed_shm_comm' in deepspeed.initialize.
deepspeed.ops.__compatible_ops__ = defaultdict(bool)
logger.setLevel(logging.WARNING)

TAG = "muongate"
ADAM_STATE = ("exp_avg", "exp_avg_sq")


def uses_muon(name: str, p: Tensor) -> bool:
    """DeepSpeed's own split (``deepspeed.set_optimizer_flags``): matrices, but no embedding or head."""
    return p.ndim >= 2 and not any(k in name.lower() for k in ("embed", "lm_head"))


#: the fewest elements a ZeRO bucket holds here (``ds_config``)
BUCKET_ELEMENTS = 2**20


def ds_config(config: EngineConfig, elements: int = 0) -> dict[str, Any]:
    """The DeepSpeed configuration of one engine case, of a model of ``elements`` elements.

    ZeRO's reduce and all-gather buckets hold the whole model, as its defaults (5e8 elements)
    do for the gates' models, but no more than ``BUCKET_ELEMENTS`` beyond it: each engine
    allocates its buckets on the device whole, and DeepSpeed 0.19.8's engines are never freed
    in a process that builds many (its gradient hooks hold them from torch's autograd graph,
    out of Python's collector's reach), so on one H100 a rank had 38 GiB of 1.86 GiB
    buckets after about twenty cases, and the next case ran out of memory. A bucket that
    holds the whole model reduces and gathers it in the same operations whatever its size."""
    s = config.options
    params: dict[str, Any] = {"lr": s["lr"], "weight_decay": s["weight_decay"], "torch_adam": True}
    if config.optimizer == "muon":
        params["momentum"] = s["momentum"]
        if "ns_method" in s:
            params["ns_method"] = s["ns_method"]
        if s.get(PER_HEAD_SETTING):
            params[PER_HEAD_SETTING] = True
    else:
        params.update(betas=list(s["betas"]), eps=s["eps"])
    bucket = max(elements, BUCKET_ELEMENTS)
    zero: dict[str, Any] = {"stage": config.stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if config.reduce_scatter is not None:
        zero["reduce_scatter"] = config.reduce_scatter
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": config.accumulate,
        "optimizer": {"type": config.optimizer, "params": params},
        "zero_optimization": zero,
        "gradient_clipping": config.clip,
        "steps_per_print": 2**31 - 1,
        **({"bf16": {"enabled": True}} if config.dtype == "bfloat16" else {}),
    }


def forget_destroyed_groups() -> None:
    """DeepSpeed makes its process groups once a process and keeps them in
    ``deepspeed.utils.groups``'s globals (its clone of the world group, its expert and ZeRO
    groups). muongate's pool makes a rank's groups afresh after a case that raised (the
    regroup), which leaves those globals naming destroyed groups, and the next
    ``deepspeed.initialize`` asked torch for the ranks of one ("Group … is not registered",
    one H100, 2026-12-07). Each destroyed one is forgotten here, so DeepSpeed makes it again."""
    from deepspeed.utils import groups

    def destroyed(group: Any) -> bool:
        try:
            dist.get_process_group_ranks(group)
        except KeyError:
            return True
        return False

    for name, value in list(vars(groups).items()):
        if isinstance(value, dist.ProcessGroup) and destroyed(value):
            setattr(groups, name, None)
        elif isinstance(value, dict) and any(isinstance(g, dist.ProcessGroup) and destroyed(g) for g in value.values()):
            value.clear()


class DeepSpeedRun:
    """One DeepSpeed engine on this rank (``harness.engines.EngineRun``)."""

    #: configuration beside the case's (``ds_config``): none here; a planted bug's
    #: (``examples/deepspeed_planted_bugs.py``) may add some
    extra_config: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: nn.Module, config: EngineConfig, group: Any) -> None:
        if dist.get_world_size(group) != dist.get_world_size():
            raise ValueError(
                f"DeepSpeed talks over the default process group ({dist.get_world_size()} ranks), and the case's "
                f"group has {dist.get_world_size(group)}: run its cases on every rank"
            )
        # the GPU DeepSpeed's engine sets as its device: one of the node's, shared where ranks
        # outnumber them (muongate's relay on one card), as the pool placed this rank
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        os.environ["LOCAL_RANK"] = str(dist.get_rank() % gpus if gpus else dist.get_rank())
        forget_destroyed_groups()
        self.config = config
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters(),
            config={**ds_config(config, sum(p.numel() for p in model.parameters())), **self.extra_config},
        )
        self.params = dict(self.engine.module.named_parameters())

    @property
    def module(self) -> nn.Module:
        return self.engine  # type: ignore[no-any-return]

    def backward(self, loss: Tensor) -> None:
        self.engine.backward(loss)

    def grad_norm(self) -> Tensor | float | None:
        """The norm DeepSpeed clipped its last step by, as its engine reports it (a tensor in the
        dtype it summed in: float64 at stage 3)."""
        return self.engine.get_global_grad_norm()  # type: ignore[no-any-return]

    def step(self) -> None:
        # Without grad mode, as a training loop under torch.no_grad() would step: before 0.19,
        # ZeRO 1–2 all-gather into views that split() made of a flat buffer, which torch 2.13
        # refuses to write in place in grad mode ("Output 0 of Split is a view and is being
        # modified inplace"); no gradient flows through a step either way.
        with torch.no_grad():
            self.engine.step()

    # -- reading through DeepSpeed's own API ----------------------------------------------
    def full_param(self, name: str) -> Tensor:
        p = self.params[name]
        if self.config.stage == 0:
            return self._stage0_master(p).detach().clone()
        return safe_get_full_fp32_param(p).clone()

    def full_state(self, name: str) -> Mapping[str, Tensor]:
        p = self.params[name]
        muon = self.config.optimizer == "muon" and uses_muon(name, p)
        keys: tuple[str, ...] = ("momentum_buffer",) if muon else ADAM_STATE
        if self.config.stage == 0:
            state = (
                self.engine.optimizer.state if self.config.dtype == "float32" else self.engine.optimizer.optimizer.state
            )
            own = state.get(self._stage0_master(p), {})
            return {k: own[k].clone() for k in keys if k in own}
        if muon and self.config.stage in (1, 2):
            return self._flat_momentum(name)
        if self.config.stage in (1, 2):
            self._relink()
            keys = tuple(k for k in keys if self._fragments_hold(p, k))
        found = {k: safe_get_full_optimizer_state(p, k) for k in keys}
        return {k: v.clone() for k, v in found.items() if v is not None}

    def _stage0_master(self, p: Tensor) -> Tensor:
        """Stage 0 keeps the model's own parameters, or float32 copies of bf16 ones."""
        if self.config.dtype == "float32":
            return p
        optimizer = self.engine.optimizer
        for low, high in zip(optimizer.fp16_groups, optimizer.fp32_groups, strict=True):
            for q, master in zip(low, high, strict=True):
                if q is p:
                    return master  # type: ignore[no-any-return]
        raise KeyError(f"no float32 master of a parameter of shape {list(p.shape)}")

    def _relink(self) -> None:
        """ZeRO 1–2 link each group's state into the parameters' fragments once, after the
        first group's step, when a Muon model's AdamW half has none yet, so its state cannot be
        read (examples/findings/deepspeed_muon_adamw_state_unreadable.py): link again, with
        DeepSpeed's own method, now that every group has stepped."""
        zero = self.engine.optimizer
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()

    @staticmethod
    def _fragments_hold(p: Tensor, key: str) -> bool:
        """Whether every rank that holds a fragment of ``p`` holds ``key`` for it (a group whose
        parameters had no gradient has no state yet): a rank that lacked it would raise inside
        ``safe_get_full_optimizer_state`` and leave the others in its all-reduce."""
        mapping = getattr(p, "_hp_mapping", None)
        mine = None if mapping is None else key in (mapping.optim_fragment or {})
        held: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(held, mine)
        return all(h for h in held if h is not None) and any(h is not None for h in held)

    def _flat_momentum(self, name: str) -> dict[str, Tensor]:
        """Stages 1–2 keep Muon's momentum as one flat buffer per group of the whole matrices
        that overlap this rank's partition (its fragment API does not map it): every rank
        reads its own, and the first that holds ``name``'s gives it."""
        optimizer = self.engine.optimizer
        mine: Tensor | None = None
        for g, params in enumerate(optimizer.params_in_partition):
            buffer = optimizer.optimizer.state[optimizer.single_partition_of_fp32_groups[g]].get("momentum_buffer")
            offset = 0
            for q in params:
                if q is self.params[name] and buffer is not None:
                    mine = buffer[offset : offset + q.numel()].view(q.shape).clone()
                offset += q.numel()
        held: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(held, mine)
        first = next((t for t in held if t is not None), None)
        return {} if first is None else {"momentum_buffer": first}

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, path: str) -> None:
        self.engine.save_checkpoint(path, tag=TAG)

    def load(self, path: str) -> None:
        if Path(path, "latest_universal").exists():
            # what "checkpoint": {"load_universal": true} in the configuration sets
            self.engine._config.load_universal_checkpoint = True
            self.engine.load_checkpoint(path)
        else:
            self.engine.load_checkpoint(path, tag=TAG)


def universal(saved: str, out: str) -> None:
    """DeepSpeed's own conversion into a universal checkpoint (``ds_to_universal``), in this
    process; ``inject_missing_state``: a plain model carries no ``universal_checkpoint_info``."""
    from deepspeed.checkpoint import ds_to_universal

    args = SimpleNamespace(
        input_folder=str(Path(saved, TAG)),
        output_folder=str(Path(out, TAG)),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        ds_to_universal.main(args)


def single_device(named: list[tuple[str, nn.Parameter]], config: EngineConfig) -> torch.optim.Optimizer:
    """DeepSpeed's ``MuonWithAuxAdam`` on one device, grouped as its engine groups a model."""
    s = config.options
    muon = [p for n, p in named if uses_muon(n, p)]
    adam = [p for n, p in named if not uses_muon(n, p)]
    for n, p in named:
        p.use_muon = uses_muon(n, p)  # type: ignore[attr-defined]
    common = {"lr": s["lr"], "weight_decay": s["weight_decay"]}
    method = {"ns_method": s["ns_method"]} if "ns_method" in s else {}
    groups = [
        {"params": muon, "use_muon": True, "momentum": s["momentum"], **method, **common},
        {"params": adam, "use_muon": False, **common},
    ]
    chosen = [g for g in groups if g["params"]]
    if "adam_optimizer" not in inspect.signature(MuonWithAuxAdam.__init__).parameters:
        return MuonWithAuxAdam(chosen)  # before 0.19.6: its inline Adam, as its engine runs it
    return MuonWithAuxAdam(chosen, adam_optimizer=torch.optim.AdamW, adam_optimizer_kwargs={"foreach": None})


def _half_dtype(wanted: torch.dtype) -> torch.dtype:
    """DeepSpeed's Newton–Schulz dtype: ``wanted`` where its accelerator takes it, else float32."""
    from deepspeed.accelerator import get_accelerator

    takes = get_accelerator().is_fp16_supported() if wanted == torch.float16 else get_accelerator().is_bf16_supported()
    return wanted if takes else torch.float32


def conventions(config: EngineConfig, release: Version = RELEASE) -> dict[str, Any]:
    """``reference.Muon``'s settings that are this release's Muon arithmetic (``Engine.conventions``),
    read from its ``muon_update``, Newton–Schulz functions and ``MuonWithAuxAdam``: the ema
    momentum and Nesterov blend, the eps 1e-7 added to the norm, five iterations of Keller's
    coefficients, decoupled decay before the step are the reference's defaults already."""
    if config.optimizer != "muon":
        # "torch_adam": torch.optim.AdamW at its default, foreach=None: its foreach kernels on
        # CUDA (a few ULP from its single-tensor ones there), its single-tensor ones on the CPU
        return {"kernels": "default"}
    torch_adam = release >= Version("0.19.6")
    adam = {
        "adamw_betas": (0.9, 0.95),
        "adamw_eps": 1e-10,
        "adamw_form": "torch" if torch_adam else "keller",
        **({"adamw_kernels": "default"} if torch_adam else {}),
    }
    method = config.options.get("ns_method", "gram" if release >= FIRST_WITH_NS_METHOD else "standard")
    if method == "standard":
        # up to 0.18.9 its iteration casts to bf16 whatever the accelerator says
        dtype = torch.bfloat16 if release < FIRST_WITH_NS_METHOD else _half_dtype(torch.bfloat16)
        ns = {"ns_form": "expanded", "ns_dtype": dtype}
    else:
        ns = {
            "ns_form": "gram_addmm" if release < Version("0.19.2") else "gram",
            "ns_dtype": _half_dtype(torch.float16),
            "ns_normalize": "input" if release >= Version("0.19.8") else "ns_dtype",
        }
    # per_head_muon views the update as a stack of heads and runs Newton–Schulz on it batched
    heads = {"ns_blocks": "batched"} if PER_HEAD else {}
    return {**ns, **heads, "lr_scale_on": "update", **adam}


@Engine(
    stages={0, 1, 2, 3},
    optimizers={"muon", "adamw"},
    judged={"muon": "reference", "adamw": "reference"},
    single_device=single_device,
    conventions=conventions,
    shown={"muon"},
    options={"muon": {"ns_method": ("gram", "standard")}} if RELEASE >= FIRST_WITH_NS_METHOD else {},
    reduce_scatter={1: (True, False), 2: (True, False), 3: (True, False), ("muon", 3): (False,)},
    accumulate=(1, 2, 3, 4),
    dtypes={"float32", "bfloat16"},
    reshard=universal,
    reshard_stages={1, 2, 3},
    reshard_optimizers={"adamw"},
    missing_gradient="zeros",
    # each said in the module docstring; the bf16 momentum makes the bf16 Muon cells of stages 1–3
    # differ (examples/findings/deepspeed_muon_bf16_momentum.py; accepted, for 0.19.8, by
    # examples/accepted/deepspeed-0.19.8.toml)
    differences={"muon": ("bf16 momentum at stages 1–3",), "*": ("torch.compile off",)},
    per_head=PER_HEAD_SETTING if PER_HEAD else None,
    # the ZeRO optimizers divide by the clip ratio (unscale_and_clip_grads) and keep the norm;
    # stage 0 clips with deepspeed.runtime.utils.clip_grad_norm_ and drops it
    # (get_global_grad_norm() is None there), so its cells cannot be judged
    clip=lambda config: None if config.stage == 0 else "divide",
    # ZeRO 1-3 reduce buckets of the gradients each rank produced: a parameter that one rank's
    # loss reaches and another's does not desynchronizes them (matrix finding 36,
    # examples/findings/deepspeed_rank_asymmetric_unused_parameter.py)
    needs_same_grads=lambda config: config.stage >= 1,
    package=f"deepspeed=={RELEASE}",
)
def deepspeed_zero(model: nn.Module, config: EngineConfig, group: Any) -> DeepSpeedRun:
    return DeepSpeedRun(model, config, group)
