# my_adamw.py: a factory of your optimizer, and one declaration of what it is
import torch

import reference
from harness.candidates import Candidate

# every convention of reference.AdamW that torch.optim.AdamW fixes (the gates draw any left out), and
# maximize, not passed on: on a zero gradient, torch's CPU lerp_ gives a shard's moment +0.0 where one
# device has -0.0 (examples/findings/torch_cpu_lerp_signed_zero.py)
CONVENTIONS = {
    "weight_decay_form": "decoupled",
    "bias_correction": True,
    "eps_form": "outside",
    "state_dtype": "param",
    "maximize": False,
}


@Candidate(reference=reference.AdamW, conventions=CONVENTIONS, layouts={"hsdp"})
def my_adamw(param_groups, **settings):
    # param_groups: FSDP2 DTensor parameters (and "param_names"); settings: every keyword of the reference
    keys = ("lr", "betas", "eps", "weight_decay", "amsgrad")
    return torch.optim.AdamW(param_groups, foreach=False, **{k: settings[k] for k in keys})
