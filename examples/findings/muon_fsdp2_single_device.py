"""muon-fsdp2 0.3.0's single-device path does not run: ``muon_update`` is not defined.

Run: ``python examples/findings/muon_fsdp2_single_device.py`` (only torch and
``muon-fsdp2==0.3.0``; exits 1 while the finding holds, 0 once it is gone).

``Muon`` dispatches a parameter that is not a DTensor to ``SingelDeviceWork``, whose
``start`` calls ``muon_update``, a function of Keller Jordan's ``muon.py`` that this module
never defines or imports: the first step on a plain tensor raises ``NameError``. A bug in
the package (its docstring says it "also support[s] single device variant").
"""

import sys

import torch
from muon_fsdp2 import Muon
from torch import nn


def main() -> int:
    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    model(torch.randn(2, 4)).square().sum().backward()
    try:
        Muon([{"params": list(model.parameters()), "use_muon": True}]).step()
    except NameError as e:
        print(f"step on a plain tensor failed: NameError: {e}")
        return 1
    print("step on a plain tensor completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
