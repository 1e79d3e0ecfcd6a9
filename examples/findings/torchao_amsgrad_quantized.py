"""torchao 0.18's ``AdamW8bit(amsgrad=True)`` raises on its first step for any parameter whose
state it quantizes (4096 elements or more), on one device as under FSDP2 (torch 2.13, CPU).

Run: ``python examples/findings/torchao_amsgrad_quantized.py`` (torch and ``torchao==0.18.0``
only; exits 1 while the finding holds, 0 once it is gone).

The constructor accepts ``amsgrad`` and keeps ``max_exp_avg_sq`` as an ``OptimState8bit``, but
the step's ``torch.maximum`` has no implementation for that subclass: ``NotImplementedError:
OptimState8bit dispatch: attempting to run unimplemented operator/function: aten.maximum``. A
smaller parameter (unquantized state) steps. The gates found it as an error on ``w0[4096] ·
world 2 · 1 step · amsgrad=True``. A bug in the package (an accepted setting that cannot run).
"""

import sys

import torch
from torchao.optim import AdamW8bit


def main() -> int:
    # torchao compiles every step; compiled it fails too ("Unsupported NotImplementedError ... when
    # running FX node"), eagerly with the subclass's own message, which this shows
    torch.compile = lambda fn, **_: fn
    p = torch.nn.Parameter(torch.randn(4096))
    opt = AdamW8bit([p], amsgrad=True)
    p.grad = torch.randn(4096)
    try:
        opt.step()
    except NotImplementedError as e:
        print(f"torch {torch.__version__}: step failed: {str(e).splitlines()[0][:160]}")
        return 1
    print("step completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
