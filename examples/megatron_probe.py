"""Probe: does megatron-core's DDP + DistributedOptimizer, and its Muon, run on CPU with gloo?

Two processes (torch.multiprocessing, FileStore, gloo), a two-``nn.Linear`` MegatronModule; each
step prints ``ok`` or the exception with the megatron-core line that raised it (``PROBE_TB=1``
prints whole tracebacks). Standalone, imported by no test; where megatron-core is not
importable it says so and exits 0. Findings and versions: docs/pages/engines.md, "Megatron-core".

    pip install --no-deps --ignore-requires-python --target /tmp/mcore megatron-core==0.19.2 \
        triton==3.9.0 emerging-optimizers==0.3.0 absl-py
    PYTHONPATH=/tmp/mcore python examples/megatron_probe.py     # about 40 s on 2 CPU cores
"""

import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def where(exc):
    tb = traceback.extract_tb(exc.__traceback__)
    mc = [f for f in tb if "/megatron/" in f.filename or "/emerging_optimizers/" in f.filename]
    f = (mc or tb)[-1]
    path = f.filename[f.filename.rfind("/megatron/core/") + 1 :] if "/megatron/core/" in f.filename else f.filename
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}  @ {path}:{f.lineno}  `{f.line}`"


def stage(rank, name, fn):
    t = time.time()
    try:
        out = fn()
        if rank == 0:
            print(f"[ok  ] {name} ({time.time() - t:.1f}s)", flush=True)
        return True, out
    except BaseException as e:
        if rank == 0:
            print(f"[FAIL] {name}: {where(e)}", flush=True)
            if os.environ.get("PROBE_TB"):
                traceback.print_exc()
        return False, None


def shim():
    import typing

    import typing_extensions

    if not hasattr(typing, "override"):  # emerging_optimizers 0.3 imports typing.override (3.12)
        typing.override = typing_extensions.override


def worker(rank, world, store_path):
    shim()
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)

    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    t0 = time.time()
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    if rank == 0:
        print(
            f"megatron-core {megatron.core.__version__}, torch {torch.__version__}, "
            f"python {sys.version.split()[0]}, import {time.time() - t0:.1f}s",
            flush=True,
        )

    stage(
        rank,
        "parallel_state.initialize_model_parallel(1, 1) on gloo",
        lambda: parallel_state.initialize_model_parallel(1, 1),
    )

    def config():
        return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)

    ok, tcfg = stage(rank, "TransformerConfig(num_layers=1, hidden_size=16, heads=2)", config)

    class Net(MegatronModule):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.fc1 = nn.Linear(16, 24)
            self.fc2 = nn.Linear(24, 16)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def build(ddp_kwargs):
        torch.manual_seed(0)
        net = Net(tcfg)
        cfg = DistributedDataParallelConfig(**ddp_kwargs)
        return DistributedDataParallel(tcfg, cfg, net)

    def train(model, opt):
        x = torch.randn(4, 16)
        model.zero_grad_buffer() if hasattr(model, "zero_grad_buffer") else None
        opt.zero_grad()
        model(x).square().sum().backward()
        if hasattr(model, "finish_grad_sync"):
            model.finish_grad_sync()
        return opt.step()

    ddp_dist = dict(use_distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=200)
    ok, ddp = stage(rank, f"DistributedDataParallel({ddp_dist})", lambda: build(ddp_dist))
    adam = dict(optimizer="adam", lr=1e-2, use_distributed_optimizer=True, clip_grad=0.0)
    if ok:
        ok, opt = stage(
            rank,
            f"get_megatron_optimizer({adam}) on DDP",
            lambda: get_megatron_optimizer(OptimizerConfig(**adam), [ddp]),
        )
        if ok:
            stage(rank, "forward/backward/step (DistributedOptimizer)", lambda: train(ddp, opt))
    ddp_plain = dict(use_distributed_optimizer=False)
    ok, _ddp2 = stage(rank, f"DistributedDataParallel({ddp_plain})", lambda: build(ddp_plain))

    # Without Megatron's DDP: the optimizer factory on the bare MegatronModule.
    def bare():
        torch.manual_seed(0)
        return Net(tcfg)

    adam_plain = dict(optimizer="adam", lr=1e-2, clip_grad=0.0)
    stage(
        rank,
        f"get_megatron_optimizer({adam_plain}) on the bare module (no DDP)",
        lambda: get_megatron_optimizer(OptimizerConfig(**adam_plain), [bare()]),
    )
    muon = dict(optimizer="muon", lr=1e-2, clip_grad=0.0)
    stage(
        rank,
        f"get_megatron_optimizer({muon}) on the bare module (no DDP)",
        lambda: get_megatron_optimizer(OptimizerConfig(**muon), [bare()]),
    )
    muon_lw = dict(optimizer="muon", lr=1e-2, clip_grad=0.0, use_layer_wise_distributed_optimizer=True)
    lw_net = bare()
    ok, lw = stage(
        rank,
        f"get_megatron_optimizer({muon_lw}) on the bare module (no DDP)",
        lambda: get_megatron_optimizer(OptimizerConfig(**muon_lw), [lw_net]),
    )
    if ok:
        if rank == 0:
            print(
                "   ",
                type(lw).__name__,
                [type(o).__name__ for o in getattr(lw, "chained_optimizers", [])],
                [[tuple(p.shape) for g in o.param_groups for p in g["params"]] for o in lw.chained_optimizers],
                flush=True,
            )

        def lw_step():
            torch.manual_seed(1)  # the same batch on every rank: no DDP reduces the gradients
            x = torch.randn(4, 16)
            lw.zero_grad()
            lw_net(x).square().sum().backward()
            for p in lw_net.parameters():  # Megatron's optimizers read main_grad, which DDP sets
                p.main_grad = p.grad
            return lw.step()

        ok, res = stage(rank, "forward/backward/step (LayerWiseDistributedOptimizer, bare module)", lw_step)
        if ok:
            flat = torch.cat([p.detach().reshape(-1) for p in lw_net.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            if rank == 0:
                print(
                    f"    step returned {res}; ranks agree after step: "
                    f"{all(torch.equal(gathered[0], g) for g in gathered)}; "
                    f"params moved: {not torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in bare().parameters()]))}",
                    flush=True,
                )

    muon_lw16 = dict(muon_lw, bf16=True)

    def bf16_lw():
        net = bare().to(torch.bfloat16)
        return get_megatron_optimizer(OptimizerConfig(**muon_lw16), [net])

    stage(rank, f"get_megatron_optimizer({muon_lw16}) on the bare bf16 module (no DDP)", bf16_lw)

    # The raw Emerging-Optimizers Muon, as megatron-core builds it (TensorParallelMuon), on CPU.
    def raw_muon():
        from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon

        torch.manual_seed(0)
        net = Net(tcfg)
        opt = TensorParallelMuon([net.fc1.weight, net.fc2.weight], lr=1e-2, fp32_matmul_prec="highest")
        net(torch.randn(4, 16)).square().sum().backward()
        opt.step()
        return opt

    stage(rank, "emerging TensorParallelMuon step on CPU tensors (no Megatron wrapper)", raw_muon)
    dist.destroy_process_group()


def main():
    import warnings

    warnings.filterwarnings("ignore")
    shim()
    try:
        import megatron.core  # noqa: F401
    except Exception as e:
        print(f"megatron-core not importable here ({type(e).__name__}: {e}); skipping")
        return 0
    world = 2
    with tempfile.TemporaryDirectory() as d:
        t = time.time()
        mp.spawn(worker, args=(world, os.path.join(d, "store")), nprocs=world, join=True)
        print(f"total {time.time() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
