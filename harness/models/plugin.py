"""A team's own model through the training gates: ``--model MODULE:FACTORY``.

``FACTORY()`` returns a freshly initialised ``nn.Module`` (the gates seed torch's generator
first, so two calls give the same weights) that maps byte tokens ``[batch, seq]`` to logits
over at least 256 classes, or to an object holding them as ``.logits`` (Hugging Face's
models). It trains on the same byte-level text as muongate's own transformer
(``harness.models.corpus``). The factory may declare, as attributes:

- ``muongate_blocks``: the dotted path of the ``nn.ModuleList`` of repeated blocks; FSDP2
  wraps each block, then the whole model (default: the model's first ``ModuleList``);
- ``muongate_adamw_modules``: names of modules whose matrices AdamW takes instead of Muon
  (default: the embeddings and the output head, found by type and by name);
- ``muongate_tp_plan``: ``{module path: "colwise" | "rowwise"}`` (``*`` wildcards as
  ``parallelize_module`` takes them), for the FSDP2 × TP twins; without it they skip;
- ``muongate_on_rank(model, rank)``: sets any per-rank state before each of that rank's
  forward passes (the MoE example uses it to leave an expert without tokens on one rank);
- ``muongate_no_tokens``: what ``muongate_on_rank`` leaves without tokens, in words (e.g.
  ``("rank 1 sends no tokens to expert 0",)``): the model then also runs as an empty-expert
  scenario (``gates/test_moe_gates.py``), and ``muongate_wrapping`` says how FSDP2 wraps it;
- ``muongate_precision``: the step's mixed precision as ``harness.models.step.Precision``'s
  fields (``{"param": "bfloat16", "reduce": "float32"}``, ``{"autocast": "bfloat16"}``): FSDP2
  lays the model out with that ``MixedPrecisionPolicy``, and the one-device side follows it.

``ModelCase`` is a ``harness.tasks.training.TrainingSpec``: picklable (the factory travels
by reference), so every rank builds the same model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard

from harness.algorithms import MUON
from harness.candidates.loading import load_object
from harness.cases.case import candidate_name
from harness.models.corpus import held_out_bits, next_byte_loss
from harness.models.step import FULL, Precision
from harness.models.transformer import TransformerCase

_STYLES = ("colwise", "rowwise")


@dataclass(frozen=True)
class ModelCase:
    """A ``--model`` factory's model, trained as ``TransformerCase`` trains muongate's own."""

    spec: str
    factory: Any = field(compare=False, repr=False)
    world_size: int = 2
    steps: int = 4
    seed: int = 0
    seq: int = 32
    batch: int = 4
    candidate: Any = None
    settings: tuple[tuple[str, Any], ...] = TransformerCase("defaults").settings
    #: explicit AdamW modules (``None``: embeddings and the output head, found in ``build``)
    adamw_names: tuple[str, ...] | None = None
    blocks: str | None = None
    tp_styles: tuple[tuple[str, str], ...] = ()
    #: the empty-expert scenario it stages, in words (``muongate_no_tokens``), and its wrapping
    empty: tuple[str, ...] = ()
    wrapping: str = "each block, then the whole model"
    variant: str = "as written"
    #: what the step computes and reduces in (FSDP2's mixed-precision policy, autocast)
    precision: Precision = FULL

    @property
    def reference(self) -> Any:
        """The family it trains against: Muon, whose settings it carries, alone."""
        return MUON.factory

    @classmethod
    def load(cls, spec: str) -> ModelCase:
        """Imports ``MODULE:FACTORY`` and reads its declarations; errors name what is wrong."""
        factory = load_object(spec)
        if not callable(factory):
            raise TypeError(f"--model {spec}: {factory!r} is not callable")
        plan = dict(getattr(factory, "muongate_tp_plan", {}))
        wrong = {k: v for k, v in plan.items() if v not in _STYLES}
        if wrong:
            raise ValueError(f"--model {spec}: muongate_tp_plan styles {wrong} are not one of {_STYLES}")
        adamw = getattr(factory, "muongate_adamw_modules", None)
        try:
            precision = Precision(**getattr(factory, "muongate_precision", {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"--model {spec}: muongate_precision: {e}") from None
        return cls(
            spec,
            factory,
            adamw_names=None if adamw is None else tuple(adamw),
            blocks=getattr(factory, "muongate_blocks", None),
            tp_styles=tuple(sorted(plan.items())),
            empty=tuple(getattr(factory, "muongate_no_tokens", ())),
            wrapping=getattr(factory, "muongate_wrapping", cls.wrapping),
            precision=precision,
        )

    @property
    def name(self) -> str:
        return self.spec

    @functools.cached_property
    def adamw_modules(self) -> tuple[str, ...]:
        """What AdamW takes (``harness.tasks.training.model_groups``); found once, on a model built for it."""
        if self.adamw_names is not None:
            return self.adamw_names
        return _embeddings_and_head(self.build())

    def on(self, world_size: int, **changes: Any) -> ModelCase:
        return replace(self, world_size=world_size, **changes)

    def with_variant(self, variant: str) -> ModelCase:
        """The model has no fixed variant of muongate's making: the scenario runs it as written."""
        return self

    def describe(self) -> str:
        return (
            f"ModelCase({self.spec}: world={self.world_size}, steps={self.steps}, batch {self.batch}x{self.seq} "
            f"bytes per rank, seed={self.seed}, candidate={candidate_name(self.candidate, self.reference)}"
            f"{self.precision.clause()})"
        )

    # -- harness.tasks.training.TrainingSpec --
    def build(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = self.factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"--model {self.spec}: the factory returned {type(model).__name__}, not an nn.Module")
        return model

    def shard(self, model: nn.Module, mesh: Any) -> None:
        policy = self.precision.policy()
        for block in _blocks(model, self.blocks, self.spec):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)

    def tp_plan(self) -> dict[str, Any]:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if not self.tp_styles:
            raise ValueError(f"--model {self.spec}: no muongate_tp_plan declared")
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        return {path: styles[style]() for path, style in self.tp_styles}

    def loss(self, model: nn.Module, rank: int, step: int, device: torch.device) -> Tensor:
        on_rank = getattr(self.factory, "muongate_on_rank", None)
        if on_rank is not None:
            on_rank(model, rank)
        return next_byte_loss(model, self.seed, rank, step, self.batch, self.seq, device)

    def evaluate(self, model: nn.Module, device: torch.device) -> float:
        return held_out_bits(model, self.seq, device)


def _blocks(model: nn.Module, path: str | None, spec: str) -> nn.ModuleList:
    if path is not None:
        blocks = model.get_submodule(path)
        if not isinstance(blocks, nn.ModuleList):
            raise TypeError(f"--model {spec}: muongate_blocks {path!r} is a {type(blocks).__name__}, not a ModuleList")
        return blocks
    found = next((m for m in model.modules() if isinstance(m, nn.ModuleList)), None)
    if found is None:
        raise ValueError(f"--model {spec}: no nn.ModuleList of blocks found; declare muongate_blocks")
    return found


def _embeddings_and_head(model: nn.Module) -> tuple[str, ...]:
    """The embeddings, and the output head: the last ``nn.Linear`` whose output is the vocabulary."""
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features in vocab]
    return tuple(names + heads[-1:])
