# my_adamw.py: a factory of your optimizer, and one declaration of what it is
import torch

import reference
from harness.candidates import Candidate

# every convention of reference.AdamW that torch.optim.AdamW fixes (the gates draw any left out)
CONVENTIONS = {"weight_decay_form": "decoupled", "bias_correction": True, "eps_form": "outside", "state_dtype": "param"}
# and one known difference: torch's CPU lerp_ gives a zero moment its sign by the element's place in
# its kernel's blocks, so a shard can hold +0.0 where one device holds -0.0 (judged equal in value)
DIFFERENCES = {"signed_zero"}


@Candidate(reference=reference.AdamW, conventions=CONVENTIONS, differences=DIFFERENCES, layouts={"hsdp"})
def my_adamw(param_groups, **settings):
    # param_groups: FSDP2 DTensor parameters (and "param_names"); settings: every keyword of the reference
    keys = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
    return torch.optim.AdamW(param_groups, foreach=False, **{k: settings[k] for k in keys})
