"""On the CPU, ``torch.lerp_`` gives ``-0.0`` or ``+0.0`` for the same element depending on the
tensor's length (torch 2.13), so ``torch.optim.AdamW`` under FSDP2 can hold a moment of ``+0.0``
where one device holds ``-0.0``.

Run: ``python examples/findings/torch_cpu_lerp_signed_zero.py`` (torch only; exits 1 while the
finding holds, 0 once it is gone).

``zeros(n).lerp_(-zeros(n), 1.0)`` is ``-0.0`` for ``n = 16`` (the vectorised loop) and ``+0.0``
for ``n = 8`` or ``4`` (the scalar tail), although every element is the same computation. Adam's
``exp_avg.lerp_(grad, 1 - beta1)`` meets it with ``beta1`` 0 or 0.5 and a gradient of negative
zeros (``maximize=True`` on a zero gradient): the gates found it as ``w2.exp_avg``, ``expected -0.0
got 0.0``, on ``w2[4, 4] grad=zero · world 2 · betas=(0.0, 0.5) · maximize=True`` (16 elements on
one device, 8 per rank). The values are equal, the bits are not, and muongate's bitwise verdict
says so. A finding about torch's CPU kernels (like ``torch_adam_l2_bf16_shard_bits.py``), not the
optimizer: the AdamW negative controls avoid that one setting so that they test the gates.
"""

import sys

import torch


def main() -> int:
    signs = {n: torch.signbit(torch.zeros(n).lerp_(-torch.zeros(n), 1.0)).tolist() for n in (4, 8, 16)}
    for n, bits in signs.items():
        print(f"torch {torch.__version__}: zeros({n}).lerp_(-zeros({n}), 1.0) is {'-0.0' if bits[0] else '+0.0'}")
    return 1 if len({bits[0] for bits in signs.values()}) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
