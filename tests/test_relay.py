"""Claims about the relay (``harness.ranks.relay``), the process group through which ranks share
a GPU: on CPU tensors, in the same pool the gates use, every collective the gates and the
candidates call gives plain gloo's bits at 2, 4 and 8 ranks, and a relay with a planted fault
is caught by the same check. A verdict given on one GPU rests on this code."""

from __future__ import annotations

import pytest
import torch
from support import run_pytest
from test_hangs import progress_then_sleep, size_mismatch_deep

from harness.ranks import RankPool
from harness.ranks.relay import BACKEND, Relay, arrangement
from harness.ranks.stacks import Frame, collective
from harness.runner import RANK_PRELOAD
from harness.tasks import relay as check
from harness.tasks import selftest

GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU: the relay on CUDA tensors runs on the GPU machine"
)


@pytest.mark.parametrize(
    ("device", "nproc"), [("cpu", 2), ("cpu", 4), ("cpu", 8), *[pytest.param("cuda", n, marks=GPU) for n in (2, 4)]]
)
def test_every_collective_through_the_relay_gives_plain_gloos_bits(device: str, nproc: int) -> None:
    """On a GPU the ranks share ``cuda:0``, and gloo's side runs on CPU copies."""
    with RankPool(
        nproc,
        preload=RANK_PRELOAD,
        backend=BACKEND,
        devices=[f"{device}:0" if device == "cuda" else device] * nproc,
        case_timeout_s=120,
    ) as pool:
        outcome = pool.run(check.against_gloo, None)
    assert outcome.ok, outcome.failure and outcome.failure.describe()
    for rank, found in enumerate(outcome.results):
        assert set(check.CHECKS) | {"FSDP2"} <= set(found), f"rank {rank} skipped a check"
        assert not any(found.values()), f"rank {rank}: { ({k: v for k, v in found.items() if v}) }"
        unchecked = {name for name, said in found.items() if said is None}
        assert unchecked <= {"all_to_all"}, f"plain gloo lacks {unchecked}: only torch 2.11's list all_to_all may"
    grids = {name for name in outcome.results[0] if name.startswith(("DTensor (", "HSDP"))}
    if nproc == 8:
        assert {"DTensor (2, 4)", "DTensor (2, 2, 2)", "HSDP (2, 4)"} <= grids, grids


@pytest.fixture(scope="module")
def relay_pool():
    with RankPool(2, preload=RANK_PRELOAD, backend=BACKEND, case_timeout_s=60) as pool:
        yield pool


def test_a_relay_that_all_reduces_in_bf16_is_caught_by_the_check(relay_pool: RankPool) -> None:
    outcome = relay_pool.run(selftest.relay_with_a_planted_fault, "bf16 all_reduce")
    assert outcome.ok, outcome.failure and outcome.failure.describe()
    caught = {name for name, found in outcome.results[0].items() if found}
    assert {"all_reduce sum", "all_reduce avg", "functional", "DTensor 1-D"} <= caught, caught
    assert "all_gather" not in caught, "a gather has nothing to round"


def test_a_relay_that_never_writes_the_results_back_is_caught_by_the_check(relay_pool: RankPool) -> None:
    outcome = relay_pool.run(selftest.relay_with_a_planted_fault, "no copy back")
    caught = outcome.failure.headline() if outcome.failure else {n for n, f in outcome.results[0].items() if f}
    assert caught, "the check passed a relay whose outputs are never written"


def test_relayed_ranks_that_all_raised_get_fresh_groups_and_the_next_case_its_own_bits(relay_pool: RankPool) -> None:
    """(The relay completes each collective before it returns: an unmatched one is a hang there.)"""
    regroups = relay_pool.regroups
    outcome = relay_pool.run(selftest.raise_on_every_rank)
    assert outcome.failure is not None and outcome.failure.kind == "error", outcome.failure
    assert relay_pool.regroups == regroups + 1
    assert relay_pool.run(selftest.sum_of_ranks).results == [1.0, 1.0]


def test_a_rank_that_waits_forever_in_a_relayed_collective_is_a_hang_named_by_its_collective(
    relay_pool: RankPool,
) -> None:
    """The relay's frames count as a collective's wait: the stall is seen soon after the deadline,
    not after the four times as long a computing rank is given."""
    outcome = relay_pool.run(progress_then_sleep, 0.5, timeout_s=2)
    assert outcome.failure is not None and outcome.failure.kind == "hang", outcome.failure
    assert "rank 0 waits in" in outcome.failure.message and "all_reduce" in outcome.failure.message
    assert outcome.seconds < 5.0


def test_ranks_that_disagree_about_a_relayed_collective_are_aborted_with_gloos_reason(relay_pool: RankPool) -> None:
    outcome = relay_pool.run(size_mismatch_deep, 10)
    assert outcome.failure is not None and outcome.failure.status == "collective mismatch", outcome.failure
    assert "doesn't match expected size" in outcome.failure.headline()


#: the names torch's C++ side calls back on a process group written in Python: 2.11's header
#: (docs/pages/torchrun-gpus.md) and 2.13's
CALLBACKS = {
    "2.11": ["allgather", "allgather_into_tensor_coalesced", "allreduce", "allreduce_coalesced", "alltoall_base",
             "barrier", "broadcast", "reduce_scatter", "reduce_scatter_tensor_coalesced", "send", "recv",
             "_allgather_base", "_reduce_scatter_base"],
    "2.13": ["all_gather_single", "all_gather_single_coalesced", "reduce_scatter_single",
             "reduce_scatter_single_coalesced", "all_to_all_single", "allreduce", "allgather", "broadcast",
             "barrier", "reduce_scatter", "send", "recv", "gather", "scatter", "alltoall", "reduce"],
}  # fmt: skip


@pytest.mark.parametrize("release", sorted(CALLBACKS))
def test_the_relay_answers_every_callback_of_torch(release: str) -> None:
    missing = [name for name in CALLBACKS[release] if name not in Relay.__dict__]
    assert not missing, f"torch {release} calls back {missing}, which the relay does not define"


class _Recorder:
    """Stands in for the relay's gloo group: records what each call was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str):
        def call(*args):
            self.calls.append((name, len(args)))
            return _Done()

        return call


class _Done:
    def wait(self) -> bool:
        return True


def test_options_torch_hands_over_as_none_reach_gloo_as_its_default() -> None:
    """torch 2.11's coalescing manager calls a Python group's coalesced all-gather with ``None``
    options, which gloo's binding refuses (Megatron-core's distributed optimizer on one GPU, the
    relay's first run there): the relay leaves them out, so gloo takes its default."""
    relay = Relay.__new__(Relay)
    relay._gloo = _Recorder()
    out, x = torch.zeros(4), torch.ones(2)
    relay.allgather_into_tensor_coalesced([out], [x], None)
    relay.reduce_scatter_tensor_coalesced([torch.zeros(1)], [x], None)
    relay.allreduce([x], None)
    assert relay._gloo.calls == [("_allgather_base", 2), ("_reduce_scatter_base", 2), ("allreduce", 1)]


def test_the_arrangement_is_said_only_where_ranks_share_through_the_relay() -> None:
    assert arrangement("gloo", ["cpu", "cpu"]) == "" and arrangement("nccl", ["cuda:0", "cuda:1"]) == ""
    said = arrangement(BACKEND, ["cuda:0"] * 4)
    assert said == "4 ranks on 1 GPU (cuda:0); collectives relayed over gloo on the CPU, not NCCL"
    assert "relayed" in arrangement(BACKEND, ["cpu"] * 2)


def test_a_wait_inside_the_relay_is_a_collective_also_where_code_outside_torch_called_it() -> None:
    """A group that subclasses the relay (the planted ones above) calls it from outside torch."""
    frames = [
        Frame("/repo/harness/ranks/relay.py", 90, "_relay"),
        Frame("/repo/harness/tasks/selftest.py", 250, "allreduce"),
        Frame("/repo/harness/ranks/pool.py", 240, "_worker_main"),
    ]
    assert collective(frames) == "_relay, called from selftest.py:250 in allreduce"


def test_a_gate_session_through_the_relay_says_so_and_judges_as_on_gloo(other_project: pytest.Pytester) -> None:
    """``--gate-comm relay`` on CPU: what ranks sharing a GPU run, here on the CPU's arithmetic,
    so the verdicts are gloo's. The header and the terminal name the arrangement."""
    result = run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", "gates.test_optimizer_gates", "-k", "one_step",
        "--nproc", "2", "--gate-comm", "relay", "-p", "no:randomly", timeout=300,
    )  # fmt: skip
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    result.stdout.fnmatch_lines(
        [
            "*backend muongate_relay on cpu, nproc 2*",
            "*muongate ranks: 2 ranks on the CPU; collectives relayed through CPU copies over gloo*",
            "*1 passed*",
        ]
    )
    report = (other_project.path / "gate-report" / "equivalence.md").read_text()
    assert "muongate_relay on cpu (2 ranks on the CPU; collectives relayed" in report


def test_a_torch_without_what_the_relay_needs_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """It ran on torch 2.11 and 2.13; a torch without gloo (or without the calls it makes) is
    refused by the session in one line naming what is missing (``harness.plugin.devices``)."""
    import torch.distributed as dist

    from harness.ranks.relay import missing

    assert missing() is None
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    said = missing()
    assert (
        said is not None
        and "\n" not in said
        and said.endswith("was built without gloo, which the relay runs its collectives on")
    )
