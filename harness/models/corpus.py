"""Text that ships with Python, for training: nothing is downloaded.

The documentation topics in the standard library's ``pydoc_data.topics`` (about 460 KB of
English and code), as UTF-8 bytes. The first 90% train, the last 10% are held out. The
text differs slightly between Python versions; both sides of a comparison always run on
the same one.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.cases.tensors import generator


@functools.cache
def corpus() -> bytes:
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics)).encode("utf-8")


@functools.cache
def split(part: Literal["train", "held_out"]) -> Tensor:
    """The part's bytes as token ids, built once per process (every loss call reads it; never written)."""
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()
    cut = int(len(data) * 0.9)
    return data[:cut] if part == "train" else data[cut:]


def windows(seed: int, rank: int, step: int, batch: int, seq: int, device: torch.device) -> Tensor:
    """``rank``'s ``batch`` windows of ``seq + 1`` training bytes for ``step``, at offsets drawn
    from (seed, step, rank): ``[batch, seq + 1]`` token ids, inputs ``[:, :-1]``, targets ``[:, 1:]``."""
    data = split("train")
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator(seed, rank, step))
    return torch.stack([data[s : s + seq + 1] for s in starts.tolist()]).to(device)


def byte_loss(logits: object, targets: Tensor) -> Tensor:
    """Cross-entropy (nats per byte) of ``logits`` (or an object holding them as ``.logits``, as
    Hugging Face models return them) over 256 bytes against ``targets``."""
    out = _logits(logits)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))


def next_byte_loss(
    model: nn.Module, seed: int, rank: int, step: int, batch: int, seq: int, device: torch.device
) -> Tensor:
    """Cross-entropy (nats per byte) of ``model`` predicting each next byte of ``rank``'s
    micro-batch of ``step`` (``windows``). ``model(tokens)`` returns logits over 256 bytes, or an
    object holding them as ``.logits``."""
    w = windows(seed, rank, step, batch, seq, device)
    return byte_loss(model(w[:, :-1]), w[:, 1:])


@torch.no_grad()
def held_out_bits(model: nn.Module, seq: int, device: torch.device) -> float:
    """Bits per byte on the first 16 windows of the held-out bytes."""
    held = split("held_out")[: 16 * (seq + 1)].view(16, seq + 1).to(device)
    return float(byte_loss(model(held[:, :-1]), held[:, 1:])) / math.log(2)


def _logits(out: object) -> Tensor:
    return out if isinstance(out, Tensor) else out.logits  # type: ignore[attr-defined]
