"""DeepSpeed 0.19.8 cannot convert a checkpoint of its own Muon into a universal checkpoint, the
format it loads at another world size: ``ds_to_universal`` fails with ``KeyError: 'exp_avg'``.

Run: ``python examples/findings/deepspeed_universal_checkpoint_muon.py`` (deepspeed and torch
only, one process on the CPU; exits 1 while the finding holds, 0 once it is gone).

The converter reads each ZeRO shard's optimizer state under the names AdamW keeps,
``exp_avg`` and ``exp_avg_sq`` (``extract_zero_shards``). A Muon group keeps ``momentum_buffer``
instead, so a ZeRO stage 1 or 2 checkpoint of ``"type": "muon"`` stops there. The same
checkpoint of ``"type": "adamw"`` converts, and muongate's engine gate resumes it bit for bit on
1 and on 4 ranks. A limit of DeepSpeed's converter, which its Muon does not work around: a run
trained with its Muon cannot change its world size through a universal checkpoint.
"""

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")

import deepspeed
import deepspeed.ops
import torch
from deepspeed.checkpoint import ds_to_universal

deepspeed.ops.__compatible_ops__ = {}  # no shared-memory op built at start-up (inference only)
torch._dynamo.config.disable = True  # DeepSpeed's Muon is torch.compile'd; eager is enough here


def converts(optimizer: str, where: Path) -> str:
    """``converted``, or the error ``ds_to_universal`` raised, for one step of ``optimizer`` at stage 1."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": optimizer, "params": {"lr": 0.02, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "gradient_clipping": 0.0,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.ones(1, 4)).sum())
    engine.step()
    engine.save_checkpoint(str(where / "saved"), tag="step1")
    args = SimpleNamespace(
        input_folder=str(where / "saved" / "step1"),
        output_folder=str(where / "universal" / "step1"),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ds_to_universal.main(args)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "converted"


def main() -> int:
    results = {}
    for optimizer in ("adamw", "muon"):
        with tempfile.TemporaryDirectory() as where:
            results[optimizer] = converts(optimizer, Path(where))
        print(f"deepspeed {deepspeed.__version__}, stage 1, {optimizer}: ds_to_universal: {results[optimizer]}")
    return 0 if results["muon"] == "converted" else 1


if __name__ == "__main__":
    sys.exit(main())
