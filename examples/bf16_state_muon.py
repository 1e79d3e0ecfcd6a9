"""A sharded Muon that keeps a bf16 parameter's momentum in bf16, as ``torch.optim.Muon`` does:
``--impl examples.bf16_state_muon:bf16_state_muon``.

``reference.Muon`` keeps every state tensor in float32 and rounds the parameter once, so
this candidate differs from it by design on bf16 parameters. The gates must say so with
figures (the state compared after a stated cast to float32, and the dtype difference
named), not crash on the dtype inside the rank (``tests/test_crashing_candidates.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from distributed_impl import ShardedMuon


class Bf16StateMuon(ShardedMuon):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for state in self.state.values():
            if state.get("momentum_buffer") is not None and state["momentum_buffer"].dtype == torch.bfloat16:
                state["momentum_buffer"] = state["momentum_buffer"].float()
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p, {})
                if p.dtype == torch.bfloat16 and "momentum_buffer" in state:
                    state["momentum_buffer"] = state["momentum_buffer"].to(torch.bfloat16)
        return loss


def bf16_state_muon(param_groups: list[dict[str, Any]], **settings: Any) -> Bf16StateMuon:
    return Bf16StateMuon(param_groups, **settings)
