"""Claims about torch's process-wide arithmetic switches (``harness.ranks.switches``): a case
neither inherits nor leaks them, and the reference steps with torch's defaults whatever the
candidate beside it set (on a GPU, TF32 left on)."""

from __future__ import annotations

import torch
from torch import nn

from harness.ranks import RankPool
from harness.ranks.switches import DEFAULTS, Switches, hold
from harness.runner import RANK_PRELOAD
from harness.tasks import selftest as tasks

LEAKY = Switches("high", False, False, torch.float64, False)


class _Recording(torch.optim.SGD):
    """SGD that records the switches each of its steps saw."""

    seen: list[Switches]

    def step(self, closure=None):  # type: ignore[override]
        self.seen.append(Switches.now())
        return super().step(closure)


def test_the_reference_steps_with_torchs_defaults_and_leaves_the_process_as_it_found_it():
    opt = hold(_Recording([nn.Parameter(torch.ones(2))], lr=0.1))
    opt.seen = []
    opt.param_groups[0]["params"][0].grad = torch.ones(2)
    try:
        LEAKY.use()
        opt.step()
        assert opt.seen == [DEFAULTS]
        assert Switches.now() == LEAKY
    finally:
        DEFAULTS.use()


def test_a_case_starts_from_torchs_defaults_whatever_the_case_before_left():
    with RankPool(2, preload=RANK_PRELOAD, case_timeout_s=30) as pool:
        assert pool.run(tasks.switches_then_set, LEAKY).results == [DEFAULTS, DEFAULTS]
        assert pool.run(tasks.switches_then_set, DEFAULTS).results == [DEFAULTS, DEFAULTS]
