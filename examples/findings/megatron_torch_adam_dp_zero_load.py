"""megatron-core 0.19.2's distributed optimizer cannot load its own ``dp_zero`` parameter state
when it steps torch's AdamW (no Transformer Engine and no apex, where it falls back to
``torch.optim.AdamW``): ``load_state_dict`` gives every parameter's state a ``step`` tensor (its
``not HAVE_APEX_OR_TE`` branch), and ``load_parameter_state`` then copies every tensor of that
state from the saved ones, which hold ``param``, ``exp_avg`` and ``exp_avg_sq`` only:
``KeyError: 'step'`` in ``_set_main_param_and_optimizer_states``.

Run: ``python examples/findings/megatron_torch_adam_dp_zero_load.py`` (megatron-core and torch, one
process on one GPU; exits 1 while the finding holds, 0 once it is gone). The sequence is
Megatron's own checkpoint's: the model's and the optimizer's ``state_dict`` and
``save_parameter_state``; then, in a fresh model and optimizer, ``load_state_dict`` and
``load_parameter_state``.
"""

import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29547", CUDA_DEVICE_MAX_CONNECTIONS="1")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import HAVE_APEX_OR_TE  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

parallel_state.initialize_model_parallel(1, 1)


def built(seed: int):
    torch.manual_seed(seed)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    model = DistributedDataParallel(
        config, DistributedDataParallelConfig(use_distributed_optimizer=True), nn.Linear(4, 3).cuda()
    )
    adam = OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=True, clip_grad=0.0)
    return model, get_megatron_optimizer(adam, [model], config_overrides={})


model, optimizer = built(0)
model(torch.ones(2, 4, device="cuda")).square().sum().backward()
model.finish_grad_sync()
optimizer.step()
where = Path(tempfile.mkdtemp())
optimizer.save_parameter_state(str(where / "distrib_optim.pt"))
saved = optimizer.state_dict()

fresh, loading = built(1)
print(
    f"Transformer Engine or apex: {HAVE_APEX_OR_TE}; inner optimizer: {type(loading.chained_optimizers[0].optimizer)}"
)
loading.load_state_dict(saved)
try:
    with torch.no_grad():
        loading.load_parameter_state(str(where / "distrib_optim.pt"))
except KeyError as e:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    print(f"load_parameter_state raised KeyError: {e} at {Path(frame.filename).name}:{frame.lineno}")
    sys.exit(1)
print("the parameter state loaded")
