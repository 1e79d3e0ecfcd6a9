"""DeepSpeed 0.19.8 at ZeRO stages 1 and 2: a parameter that one rank's loss does not reach while
another rank's does (a layer some ranks' tokens skip, an expert with no tokens on one rank)
desynchronizes the ranks' gradient reductions, with ``reduce_scatter`` on or off, and gloo
aborts the job: ``op.preamble.length <= op.nbytes ... Is there a distributed collective
mismatch``. Stages 0 and 3 train.

Run: ``python examples/findings/deepspeed_rank_asymmetric_unused_parameter.py`` (deepspeed and
torch only, two processes on the CPU over gloo; exits 1 while the finding holds, 0 once it is
gone).

Each rank's backward hooks fill DeepSpeed's reduction buckets with the gradients that rank
produced, so a rank without the parameter's gradient reduces buckets of another size than its
peer. The same model with every parameter reached on every rank trains. DeepSpeed's ``ignore_unused_parameters`` (on by default) documents
unused parameters as ignored, without saying they must be unused on every rank alike, as
PyTorch's DDP asks for ``find_unused_parameters=True``. Found by muongate's engine gate
``test_engine_steps_a_parameter_that_has_a_gradient_on_some_ranks_only`` (``stage 1 adamw,
reduce_scatter=on, p0[1, 3] p1[2, 2]; p0 without a gradient on rank 0``). Undocumented: a limit
of DeepSpeed the muongate adapter now declares (``needs_same_grads``), not a wrong value.
"""

import os
import sys

import torch
import torch.multiprocessing as mp

TIMEOUT_S = 90


def rank_main(rank: int, port: int, stage: int, scatter: bool, asymmetric: bool) -> None:
    os.environ.update(
        DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p0 = torch.nn.Parameter(torch.ones(1, 3))
            self.p1 = torch.nn.Parameter(torch.ones(2, 2))

        def forward(self, uses_p0: bool) -> torch.Tensor:
            loss = (self.p1 * 0.5).sum()
            return loss + (self.p0 * 0.25).sum() if uses_p0 else loss

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "adamw", "params": {"lr": 0.02, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "reduce_scatter": scatter},
        "gradient_clipping": 0.0,
    }
    model = Two()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(uses_p0=not (asymmetric and rank == 0)))
    engine.step()
    # done: leave before the interpreter's teardown, where gloo's threads can abort a finished
    # job on their own (torch's, matrix finding 35), which is not this finding
    os._exit(0)


def run(stage: int, scatter: bool, asymmetric: bool, port: int) -> str:
    context = mp.get_context("spawn")
    procs = [context.Process(target=rank_main, args=(r, port, stage, scatter, asymmetric)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    if codes == [0, 0]:
        return "trains"
    return "hangs" if None in codes else f"fails (exit codes {codes})"


def main() -> int:
    import deepspeed

    wrong = False
    for port, (stage, scatter, asymmetric) in enumerate(
        ((1, True, False), (0, False, True), (1, False, True), (1, True, True), (2, True, True), (3, False, True)),
        start=29611,
    ):
        outcome = run(stage, scatter, asymmetric, port)
        fed = "p0 reached on rank 1 only" if asymmetric else "every parameter on both ranks"
        print(
            f"deepspeed {deepspeed.__version__}, stage {stage}, reduce_scatter {'on' if scatter else 'off'}, {fed}: {outcome}"
        )
        wrong = wrong or outcome != "trains"
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
