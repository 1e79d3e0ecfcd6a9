"""Claims about what the gates found beyond Muon: each finding's standalone reproducer (only torch
and the package, no muongate) still shows it. When torch or a package fixes one, its test fails,
and the README's line about it must change. The low-bit packages' tests skip, naming the extra."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest
from support import ENGINES, buffered, run_python, torchrun

FINDINGS = Path(__file__).resolve().parents[1] / "examples" / "findings"
LOWBIT = "the lowbit extra, without a torch of its own: pip install --no-deps torchao==0.18.0 bitsandbytes==0.50.2"


def _needs_deepspeed() -> None:
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")


def _run(script: str, *args: str, nproc: int = 0) -> subprocess.CompletedProcess[str]:
    env = buffered({**os.environ, "PYTHONPATH": ""})  # the package and torch, never muongate
    return run_python(*(torchrun(nproc) if nproc else []), FINDINGS / script, *args, env=env, timeout=300)


def test_torch_adam_l2_decay_gives_a_bf16_shard_other_bits() -> None:
    run = _run("torch_adam_l2_bf16_shard_bits.py")
    assert run.returncode == 1 and "of 70 elements of exp_avg and the parameter differ" in run.stdout, run.stdout


def test_torch_cpu_lerp_gives_a_signed_zero_by_length() -> None:
    run = _run("torch_cpu_lerp_signed_zero.py")
    assert run.returncode == 1 and "zeros(16).lerp_(-zeros(16), 1.0) is -0.0" in run.stdout, run.stdout


def test_torch_muon_normalizes_a_bf16_momentum_buffer_in_place_without_nesterov() -> None:
    run = _run("torch_muon_bf16_buffer_normalized.py")
    assert run.returncode == 1, run.stdout
    assert "bfloat16 parameter, nesterov=False: momentum buffer off by 0.479492" in run.stdout, run.stdout
    assert "bfloat16 parameter, nesterov=True: momentum buffer off by 0\n" in run.stdout, run.stdout
    assert "float32 parameter, nesterov=False: momentum buffer off by 0\n" in run.stdout, run.stdout


def test_dcp_resume_gives_state_to_a_parameter_the_checkpoint_holds_none_for() -> None:
    run = _run("dcp_state_dict_steps_stateless_parameters.py")
    assert run.returncode == 1 and "has state ['exp_avg', 'exp_avg_sq', 'step'] on resume, step 1.0" in run.stdout


@pytest.mark.slow
def test_torch_adafactor_cannot_step_fsdp2_dtensors() -> None:
    run = _run("torch_adafactor_dtensor.py", nproc=2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "aten.pow_.Scalar: in-place operations that require placement changes" in run.stdout, run.stdout[-2000:]


@pytest.mark.slow
def test_torch_muon_on_fsdp2_parameters_directly_differs_from_one_device_and_fails_on_an_empty_piece() -> None:
    run = _run("torch_muon_fsdp2_direct.py", nproc=2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "[4, 4]: FSDP2 != one device" in run.stdout, run.stdout[-2000:]
    assert "[1, 7]: RuntimeError: aten.add_.Tensor: in-place operations that require placement changes" in run.stdout


@pytest.mark.slow
@pytest.mark.peers
def test_torchao_quantizes_per_local_shard() -> None:
    pytest.importorskip("torchao", reason=LOWBIT)
    run = _run("torchao_quantizes_per_shard.py", nproc=2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "exp_avg of the [4096] weight is a Tensor" in run.stdout and "differs from the one-device" in run.stdout


@pytest.mark.slow
@pytest.mark.peers
def test_bitsandbytes_cannot_step_fsdp2_dtensors() -> None:
    pytest.importorskip("bitsandbytes", reason=LOWBIT)
    run = _run("bitsandbytes_dtensor_parameters.py", nproc=2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "got mixed torch.Tensor and DTensor" in run.stdout, run.stdout[-2000:]


def test_deepspeed_stage_0_bf16_steps_its_optimizer_once_before_training() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_bf16_stage0_extra_step.py")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "stage 0, bf16: after one step the state counts 2 step(s); the weight moved 0.015625" in run.stdout
    assert "stage 0, float32: after one step the state counts 1 step(s)" in run.stdout
    assert "stage 1, bf16: after one step the state counts 1 step(s)" in run.stdout


@pytest.mark.slow
def test_deepspeed_zero_1_to_3_abort_on_a_parameter_that_some_ranks_losses_do_not_reach() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_rank_asymmetric_unused_parameter.py")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "stage 1, reduce_scatter on, every parameter on both ranks: trains" in run.stdout, run.stdout
    assert "stage 0, reduce_scatter off, p0 reached on rank 1 only: trains" in run.stdout, run.stdout
    for stage, scatter in ((1, "off"), (1, "on"), (2, "on"), (3, "off")):
        assert f"stage {stage}, reduce_scatter {scatter}, p0 reached on rank 1 only: fails" in run.stdout, run.stdout
    assert "collective mismatch" in run.stderr, run.stderr[-2000:]


def test_deepspeed_drops_per_head_muon_at_stage_0_and_with_parameter_alignment() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_per_head_muon_dropped.py")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    for where, which in (
        ("stage 0", "whole-matrix"),
        ("stage 1", "per-head"),
        ("stage 1, parameter_alignment", "whole-matrix"),
        ("stage 2, parameter_alignment", "whole-matrix"),
        ("stage 3", "per-head"),
    ):
        assert f"{where}: q_proj stepped with {which} Newton-Schulz (max|diff| " in run.stdout, run.stdout


def test_deepspeed_cannot_convert_its_muon_checkpoint_into_a_universal_one() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_universal_checkpoint_muon.py")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "stage 1, adamw: ds_to_universal: converted" in run.stdout
    assert "stage 1, muon: ds_to_universal: KeyError: 'exp_avg'" in run.stdout


def test_deepspeed_cannot_read_its_muon_s_adamw_state_at_zero_1_and_2() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_muon_adamw_state_unreadable.py")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    for stage in (1, 2):
        assert f"stage {stage}, adamw: the bias's exp_avg: [0.1" in run.stdout, run.stdout
        assert (
            f"stage {stage}, muon: the bias's exp_avg: ValueError: exp_avg not found in optimizer state fragment "
            "(the optimizer holds exp_avg: True)"
        ) in run.stdout, run.stdout


def test_deepspeed_rounds_its_muon_s_momentum_to_bf16_at_zero_1_to_3() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_muon_bf16_momentum.py", nproc=2)
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    for stage, dtype in ((1, "bfloat16"), (2, "bfloat16"), (3, "float32")):
        assert f"stage {stage}, bf16 model: Muon momentum 0.050048828125 (torch.{dtype})" in run.stdout, run.stdout


@pytest.mark.slow
def test_torch_clip_grad_norm_inf_fails_on_an_empty_fsdp2_piece() -> None:
    run = _run("torch_clip_inf_norm_empty_shard.py", nproc=2)
    assert run.returncode != 0, run.stdout[-2000:]
    assert (
        "rank 1: clip_grad_norm_(inf) under FSDP2 fails: _foreach_norm cannot compute the infinity norm" in run.stdout
    )


@pytest.mark.slow
def test_torch_gloo_threads_outlive_destroy_process_group_after_fully_shard() -> None:
    run = _run("torch_gloo_threads_outlive_destroy.py")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "a plain job []; after fully_shard ['gloo_tcp_loop', 'pt_gloo_runloop', 'pt_gloo_runloop']" in run.stdout, (
        run.stdout
    )


def test_deepspeed_clips_muon_s_orthogonalized_update_at_zero_stages_1_to_3() -> None:
    _needs_deepspeed()
    run = _run("deepspeed_muon_clips_the_update.py")
    assert run.returncode == 1, run.stdout[-2000:]
    assert "stage 0: gradient norm 0.0500, clip 1.0; reported norm None" in run.stdout, run.stdout[-2000:]
    # the mechanism, not this CPU's digits (3.6780 where it was written, 3.6707 on an AMD EPYC):
    # the norm DeepSpeed reports is the orthogonalized update's, and the update is cut to the clip
    line = r"stage {}: gradient norm 0\.0500, clip 1\.0; reported norm ([\d.]+); update norm ([\d.]+) unclipped, ([\d.]+) clipped"
    for stage in (1, 2, 3):
        found = re.search(line.format(stage), run.stdout)
        assert found, run.stdout[-2000:]
        reported, update, clipped = map(float, found.groups())
        assert reported > 20 * 0.05 and abs(reported - update) <= 2e-4 and abs(clipped - 1.0) <= 2e-4, found.group(0)
