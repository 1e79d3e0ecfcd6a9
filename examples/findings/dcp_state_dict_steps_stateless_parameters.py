"""torch's DCP state-dict API (``torch.distributed.checkpoint.state_dict``) gives a parameter that
had no optimizer state when the checkpoint was taken a state of its own on resume: an AdamW
parameter that had not had a gradient yet comes back with ``step`` 1, so its first real step
uses the bias correction of step 2 (torch 2.13).

Run: ``python examples/findings/dcp_state_dict_steps_stateless_parameters.py`` (torch only;
exits 1 while the finding holds, 0 once it is gone).

The usual resume recipe is ``get_optimizer_state_dict(model, fresh_opt)``, ``dcp.load`` into it,
``set_optimizer_state_dict``. The first call runs ``_init_optim_state``: a fresh optimizer with
no state is stepped once, at lr 0, on zero gradients, for every parameter. Adam's ``step`` then
reads 1 for a parameter the checkpoint holds nothing for (a layer unfrozen later, an expert
that got no tokens yet), and nothing in the checkpoint overwrites it. The gates found it as
``adamw:adamw_for_loop`` on ``w0[4, 4], w1[4, 4] grad=late · 2 steps · checkpoint after step
1``: ``w1.step`` 2 where uninterrupted training has 1. A finding about torch's DCP, not the
optimizer: muongate's checkpoint round trip drops the state the checkpoint does not hold
(``harness/tasks/checkpoint.py``), so that its gates judge the optimizer.
"""

import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    return model, torch.optim.AdamW(model.parameters(), foreach=False)


def main() -> int:
    model, opt = model_and_optimizer()
    model[0].weight.grad = torch.ones(4, 4)  # only the first layer has had a gradient
    opt.step()
    path = tempfile.mkdtemp()
    dcp.save({"optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)
    fresh_model, fresh = model_and_optimizer()
    state = {"optim": get_optimizer_state_dict(fresh_model, fresh)}  # the resume recipe's first call
    dcp.load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True))
    set_optimizer_state_dict(fresh_model, fresh, state["optim"])
    later = fresh.state.get(fresh_model[1].weight, {})
    print(
        f"torch {torch.__version__}: a parameter with no state at the checkpoint has state {sorted(later)} "
        f"on resume, step {later.get('step')}"
    )
    return 1 if later else 0


if __name__ == "__main__":
    sys.exit(main())
