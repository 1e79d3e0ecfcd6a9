"""Text that ships with Python, for training: nothing is downloaded.

The documentation topics in the standard library's ``pydoc_data.topics`` (about 460 KB of
English and code), as UTF-8 bytes. The first 90% train, the last 10% are held out. The
text differs slightly between Python versions; both sides of a comparison always run on
the same one.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch import Tensor


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
