"""Claims about what the gates found in other teams' optimizers: each finding's standalone
reproducer (only torch and the package, no muongate) still shows it. When a package fixes
one, its test fails, and the README's line about it must change."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support import buffered, run_python, torchrun

#: each reproducer is a program of its own, with one of the peers extra's packages
pytestmark = [pytest.mark.slow, pytest.mark.peers]

FINDINGS = Path(__file__).resolve().parents[1] / "examples" / "findings"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = buffered({**os.environ, "PYTHONPATH": ""})  # the package and torch, never muongate
    return run_python(*args, env=env, timeout=180)


def _torchrun(script: str, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(*torchrun(nproc), str(FINDINGS / script), *args)


def test_muon_fsdp2_single_device_path_raises_name_error() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _run(str(FINDINGS / "muon_fsdp2_single_device.py"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "NameError: name 'muon_update' is not defined" in run.stdout


def test_muon_fsdp2_step_on_unevenly_sharded_rows_breaks_the_gather() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("muon_fsdp2_uneven_shards.py", 2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 1: weight (3, 4), local rows 1" in run.stdout, run.stdout[-2000:]
    assert "Received data size doesn't match expected size" in run.stdout + run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize(
    ("package", "script"),
    [
        ("muon_fsdp2", "muon_fsdp2_moves_without_gradient.py"),
        ("pytorch_optimizer", "distributed_muon_moves_without_gradient.py"),
    ],
)
def test_a_muon_that_gives_a_missing_gradient_zeros_moves_the_parameter(package: str, script: str) -> None:
    pytest.importorskip(package, reason="the peers extra: pip install -e .[peers]")
    run = _torchrun(script, 1)
    assert run.returncode != 0, run.stdout[-2000:]
    moved = re.search(r"largest change of a weight without a gradient: (\S+)", run.stdout)
    assert moved is not None and float(moved[1]) > 0, run.stdout[-2000:]


def test_muon_fsdp2_overwrites_its_momentum_buffer_with_the_update_when_nesterov_is_off() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("muon_fsdp2_nesterov_off_buffer_overwritten.py", 1)
    assert run.returncode != 0, run.stdout[-2000:]
    off = re.search(r"momentum buffer after one step, Nesterov off: off by (\S+)", run.stdout)
    assert off is not None and float(off[1]) > 0.01, run.stdout[-2000:]


@pytest.mark.parametrize(
    ("package", "module", "said"),
    [
        ("torch", "torch", "torch: a [2, 4, 4] stack refused: ValueError: Muon only supports 2D parameters"),
        ("pytorch_optimizer", "pytorch_optimizer", "pytorch_optimizer: a [2, 4, 4] stack against its matrices stepped one by one: max|diff| 0.0"),
        ("keller", "muon", "keller: a [2, 4, 4] stack against its matrices stepped one by one: max|diff| 0\n"),
        ("muon_fsdp2", "muon_fsdp2", "muon_fsdp2: a [2, 4, 4] stack against its matrices stepped one by one: max|diff| 0.000"),
        ("emerging", "emerging_optimizers", "emerging: a [2, 4, 4] stack refused: ValueError: Only 2D parameters are supported."),
    ],
)  # fmt: skip
def test_what_each_muon_does_with_a_stack_of_matrices(package: str, module: str, said: str) -> None:
    """torch and emerging-optimizers refuse a 3-D parameter, pytorch-optimizer orthogonalizes its flattened view,
    muon-optimizer each matrix, muon-fsdp2 each matrix up to its batched kernel's rounding."""
    pytest.importorskip(module, reason="the peers extra: pip install -e .[peers]")
    run = _run(str(FINDINGS / "muons_on_a_3d_parameter.py"), package)
    assert run.returncode == (0 if package == "keller" else 1), run.stdout + run.stderr
    assert said in run.stdout, run.stdout


def test_muon_fsdp2_steps_another_matrix_when_a_weight_is_split_by_columns() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("muon_fsdp2_column_shards.py", 2)
    assert run.returncode != 0, run.stdout[-2000:]
    off = re.search(r"rank 0: one step split by columns against split by rows: max\|diff\| (\S+)", run.stdout)
    assert off is not None and float(off[1]) > 1e-4, run.stdout[-2000:]


def test_muon_fsdp2_fails_on_a_mesh_that_is_a_slice_of_the_world() -> None:
    pytest.importorskip("muon_fsdp2", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("muon_fsdp2_submesh_rank.py", 2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 1 (mesh [1]): step failed: ValueError: Argument ``gather_list`` must be specified" in run.stdout


@pytest.mark.parametrize("package", ["keller", "pytorch_optimizer", "optimuon"])
def test_ddp_style_muons_cannot_gather_matrices_of_different_shapes_on_gloo(package: str) -> None:
    module = {"keller": "muon"}.get(package, package)
    pytest.importorskip(module, reason="the peers extra")
    run = _torchrun("ddp_muon_mixed_shapes.py", 2, package)
    assert run.returncode != 0, run.stdout[-2000:]
    # Both ranks meet it; torchrun stops the other once one fails, so either may be the one that
    # says so (rank 1 alone, once in CI on 2026-12-03).
    found = f"{package} step failed: RuntimeError: ProcessGroupGloo::allgather: invalid tensor size"
    assert re.search(rf"rank [01]: {re.escape(found)}", run.stdout), run.stdout[-2000:]


def test_keller_muon_pads_too_few_matrices_beyond_two_ranks() -> None:
    pytest.importorskip("muon", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("keller_muon_padding.py", 4)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "invalid output tensor list at index 0 (expected length 4, got 2)" in run.stdout, run.stdout[-2000:]


def test_pytorch_optimizer_muon_leaves_a_rank_waiting_for_a_gradient_it_lacks() -> None:
    pytest.importorskip("pytorch_optimizer", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("pytorch_optimizer_gradient_on_one_rank.py", 2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 1: step completed" in run.stdout and "rank 0: step failed" in run.stdout, run.stdout[-2000:]


def test_pytorch_optimizer_normuon_cannot_step_an_fsdp2_parameter_that_its_muon_steps() -> None:
    pytest.importorskip("pytorch_optimizer", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("pytorch_optimizer_normuon_dtensor.py", 2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 0: Muon stepped" in run.stdout, run.stdout[-2000:]
    assert "rank 0: NorMuon raised RuntimeError" in run.stdout, run.stdout[-2000:]


def test_pytorch_optimizer_muon_clip_cannot_clip_a_projection_under_fsdp2_over_tensor_parallelism() -> None:
    pytest.importorskip("pytorch_optimizer", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("pytorch_optimizer_muon_clip_fsdp_tp.py", 4)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "rank 0: (Shard(dim=0),): clipped, max|diff| from one device 0\n" in run.stdout, run.stdout[-2000:]
    assert "rank 0: (_StridedShard(dim=0, sf=2), Shard(dim=0)): raised The size of tensor a" in run.stdout


def test_torchtitan_dist_muon_needs_a_cuda_device() -> None:
    pytest.importorskip("torchtitan", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("torchtitan_dist_muon_cuda_only.py", 1)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "build_dist_muon failed: DistMuon requires one CUDA device per process" in run.stdout


def test_keller_muon_raises_on_a_parameter_without_a_gradient() -> None:
    pytest.importorskip("muon", reason="the peers extra: pip install -e .[peers]")
    run = _torchrun("keller_muon_missing_gradient.py", 1)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "step failed: TypeError: lerp_() received an invalid combination of arguments" in run.stdout, run.stdout


def test_keller_muon_is_bitwise_its_own_plain_form_and_not_the_addmm_form() -> None:
    pytest.importorskip("muon", reason="the peers extra: pip install -e .[peers]")
    run = _run(str(FINDINGS / "keller_muon_arithmetic.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "against Keller's own form: max|diff| 0\n" in run.stdout, run.stdout
    addmm = re.search(r"against the addmm form, lr scale in the lr: max\|diff\| (\S+)", run.stdout)
    assert addmm is not None and float(addmm[1]) > 0, run.stdout


def _on_a_gpu_with(package: str) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip(f"{package}'s finding shows on a CUDA device only")
    pytest.importorskip(package, reason=f"{package} installed with --no-deps")


def test_dtensor_muon_differs_by_its_compiled_plain_form_and_scales_weight_decay_with_the_update() -> None:
    _on_a_gpu_with("dtensor_muon")
    run = _run(str(FINDINGS / "dtensor_muon_arithmetic.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    addmm = re.search(r"5 iterations, against the addmm form: max\|diff\| (\S+)", run.stdout)
    assert addmm is not None and float(addmm[1]) > 0, run.stdout
    assert "0 iterations, against the plain form, fused: max|diff| 0\n" in run.stdout, run.stdout
    decay = re.search(r"wd 0.1 makes: (\S+); decoupled decay would make (\S+)", run.stdout)
    assert decay is not None and float(decay[1]) > 1.9 * float(decay[2]), run.stdout


def test_dtensor_muon_loads_a_bf16_parameters_float32_momentum_back_as_bf16() -> None:
    _on_a_gpu_with("dtensor_muon")
    run = _run(str(FINDINGS / "dtensor_muon_checkpoint_bf16_momentum.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "torch.float32 before the checkpoint, torch.bfloat16 after load_state_dict" in run.stdout, run.stdout
    moved = re.search(r"momentum_buffer max\|diff\| (\S+) \(dtype torch.bfloat16\)", run.stdout)
    assert moved is not None and float(moved[1]) > 0, run.stdout


def test_torchtitan_dist_muon_refuses_a_missing_gradient_and_batches_expert_stacks() -> None:
    _on_a_gpu_with("torchtitan")
    run = _torchrun("torchtitan_dist_muon_contract.py", 1)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "DistMuon requires every configured gradient before step(); missing gradients: ['idle']" in run.stdout
    assert "2. w [4, 4]: max|diff| against one matrix at a time 0\n" in run.stdout, run.stdout
    assert not re.search(r"2\. stack \[2, 6, 6\]: max\|diff\| against one matrix at a time 0\n", run.stdout)


def test_emerging_optimizers_muon_refuses_zero_steps_and_bf16_and_normalizes_before_casting() -> None:
    pytest.importorskip("emerging_optimizers", reason="emerging-optimizers needs Python >= 3.12")
    run = _run(str(FINDINGS / "emerging_optimizers_muon_arithmetic.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1. num_ns_steps=0: ValueError: num_ns_steps must be at least 1, got 0" in run.stdout
    assert "normalized in float32, then bf16: max|diff| 0\n" in run.stdout, run.stdout
    assert not re.search(r"bf16, then normalized \(the reference\): max\|diff\| 0\n", run.stdout), run.stdout
    assert "3. a bf16 parameter: TypeError: Input tensor x must be in float32, got torch.bfloat16" in run.stdout


def test_gram_newton_schulz_iterates_in_float16_and_crashes_on_zero_iterations_of_a_wide_matrix() -> None:
    pytest.importorskip("gram_newton_schulz", reason="examples/peers-no-deps.txt: pip install --no-deps -r …")
    run = _run(str(FINDINGS / "gram_newton_schulz_float16.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every value a float16 value: True" in run.stdout, run.stdout
    assert "input times 1e-30: max|output| 0," in run.stdout, run.stdout
    assert "zero iterations, [4, 6]: TypeError" in run.stdout, run.stdout


@pytest.mark.parametrize("nproc", [1, 2])
def test_emerging_optimizers_distributed_tp_mode_is_other_arithmetic_than_its_duplicated_mode(nproc: int) -> None:
    pytest.importorskip("emerging_optimizers", reason="emerging-optimizers needs Python >= 3.12")
    run = _torchrun("emerging_optimizers_tp_distributed.py", nproc)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.count("duplicated vs one device max|diff| 0,") == 4 * nproc, run.stdout
    square = re.search(rf"rank 0 of {nproc}: \[8, 8\] split on dim 0: .* distributed vs duplicated (\S+)", run.stdout)
    assert square is not None and float(square[1]) > 0, run.stdout


def test_optimuon_ddp_path_cannot_gather_a_float32_and_a_bf16_matrix() -> None:
    pytest.importorskip("optimuon", reason="the peers extra")
    run = _torchrun("optimuon_ddp_path.py", 2, "dtypes")
    assert run.returncode != 0, run.stdout[-2000:]
    assert "DDP step failed: ValueError: Invalid usage of tensors with different dtypes" in run.stdout


def test_optimuon_ddp_path_loses_the_momentum_of_a_matrix_that_changes_owner() -> None:
    pytest.importorskip("optimuon", reason="the peers extra")
    run = _torchrun("optimuon_ddp_path.py", 2, "unfrozen")
    assert run.returncode != 0, run.stdout[-2000:]
    assert "matrix 0: DDP path == single-device path" in run.stdout
    assert "matrix 2: DDP path != single-device path" in run.stdout, run.stdout[-2000:]


def test_optimuon_single_device_defaults_are_other_bits_than_its_loop() -> None:
    """A convention, not a bug: the reason the adapter compares the DDP path with the loop."""
    pytest.importorskip("optimuon", reason="the peers extra")
    run = _run(str(FINDINGS / "optimuon_paths_differ.py"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "bf16 [4, 4], foreach: default != loop" in run.stdout
    assert "two float32 [7, 5], batched Newton–Schulz: default != loop" in run.stdout


def test_a_strided_bf16_gradient_rounds_otherwise_which_is_why_the_full_copies_bridge_hands_whole_tensors_contiguous() -> (
    None
):
    """The optimuon cell's 1–3 ULP on rowwise TP (torch 2.11): full_tensor's strided view there,
    and the CPU's bf16 add(alpha) that rounds otherwise on it. The bridge now makes it contiguous."""
    run = _torchrun("full_tensor_uneven_columns_strided.py", 2)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert re.search(r"1\. torch \S+: full_tensor of \[21, 17\] Shard\(1\): equal True", run.stdout), run.stdout
    assert "2. bf16 mul_(0.95).add_(g, alpha=0.05), g contiguous against strided: bitwise False" in run.stdout


def _deepspeed_0_18() -> str:
    """Where DeepSpeed 0.18 imports from, for the 0.18 reproducers: the folder named by
    ``MUONGATE_DEEPSPEED_0_18`` (``pip install --no-deps --target DIR deepspeed==0.18.9``), put
    first on their ``PYTHONPATH``, else the installed DeepSpeed if it is a 0.18 release ("" then).
    CI installs 0.19.8, where these findings are fixed, so they skip there."""
    from importlib import metadata

    folder = os.environ.get("MUONGATE_DEEPSPEED_0_18", "")
    found = [d.version for d in metadata.distributions(name="deepspeed", path=[folder])] if folder else []
    if not folder:
        try:
            found = [metadata.version("deepspeed")]
        except metadata.PackageNotFoundError:
            found = []
    if not found or not found[0].startswith("0.18."):
        where = f"{folder} holds {found or 'none'}" if folder else f"installed: {found or 'none'}"
        pytest.skip(f"needs DeepSpeed 0.18 ({where}): MUONGATE_DEEPSPEED_0_18=DIR, a pip --target folder of 0.18.9")
    return folder


def _run_on_deepspeed_0_18(script: str) -> subprocess.CompletedProcess[str]:
    """A 0.18 reproducer, which starts its own 2 ranks, with DeepSpeed 0.18 and torch, never muongate."""
    env = {**os.environ, "PYTHONPATH": _deepspeed_0_18()}
    return run_python(str(FINDINGS / script), env=env, timeout=300)


def test_deepspeed_0_18_muon_steps_matrices_as_sgd_at_stage_0() -> None:
    run = _run_on_deepspeed_0_18("deepspeed_0_18_muon_stage0_sgd.py")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for who in ("engine", "MuonWithAuxAdam"):
        assert f"  {who}: state [], p0 " in run.stdout, run.stdout
    assert run.stdout.count("against plain SGD 0\n") == 2, run.stdout


def test_deepspeed_0_18_muon_orthogonalizes_a_partly_reduced_gradient_with_reduce_scatter() -> None:
    run = _run_on_deepspeed_0_18("deepspeed_0_18_muon_reduce_scatter.py")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for stage in (1, 2):
        on = re.search(
            rf"stage {stage}, reduce_scatter True:(?:\n    .*)*?max\|diff\| momentum (\S+), p0 (\S+)", run.stdout
        )
        assert on is not None and float(on[1]) > 0 and float(on[2]) > 1e-3, run.stdout
        off = re.search(
            rf"stage {stage}, reduce_scatter False:(?:\n    .*)*?max\|diff\| momentum 0, p0 0\n", run.stdout
        )
        assert off is not None, run.stdout


def test_deepspeed_0_18_muon_at_stage_3_steps_once_per_micro_batch() -> None:
    run = _run_on_deepspeed_0_18("deepspeed_0_18_muon_stage3_accumulation.py")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert re.search(r"accumulation 1: .*max\|diff\| momentum 0, p0 0\n", run.stdout), run.stdout
    for accumulation, moved in ((2, "0.027500"), (4, "0.055000")):
        assert f"accumulation {accumulation}: " in run.stdout and f"(moved {moved}, expected 0.013750)" in run.stdout


def test_deepspeed_0_18_reads_an_adamw_state_as_the_float32_master_after_a_universal_load() -> None:
    run = _run_on_deepspeed_0_18("deepspeed_0_18_universal_load_fp32_param.py")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.count("the model's p0: max|diff| 0 from the expected p0") == 4, run.stdout
    masters = re.findall(r"max\|diff\| (\S+) from the expected p0; element by element its \[(.*)\]", run.stdout)
    assert len(masters) == 4 and all(float(off) > 0.5 and "neither" not in which for off, which in masters), run.stdout
