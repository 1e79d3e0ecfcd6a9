"""The benchmark tools themselves: the trace summary's arithmetic, and the optimizer-step
benchmark end to end on two gloo ranks."""

from __future__ import annotations

import pytest
from support import REPO, repo_env, run_python

from benchmarks.optimizer_step import STEP_LABEL
from benchmarks.trace_summary import summarize


def _kernel(name: str, ts: float, dur: float, grid: list[int] | None = None) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": grid or [1, 1, 1]}}


def test_trace_summary_charges_a_matmul_beside_nccl_with_its_slowdown() -> None:
    ms = 1000.0  # trace times are in microseconds
    trace = {
        "traceEvents": [
            _kernel("ncclDevKernel_AllReduce", -20 * ms, 1 * ms),  # the barrier before the step: not counted
            {"ph": "X", "cat": "user_annotation", "name": STEP_LABEL, "ts": 0.0, "dur": 50 * ms},
            _kernel("nvjet_tst_128x256", 100 * ms, 200 * ms),  # alone: 200 ms
            _kernel("ncclDevKernel_SendRecv", 350 * ms, 400 * ms),
            _kernel("nvjet_tst_128x256", 400 * ms, 300 * ms),  # beside NCCL: 300 ms, 100 more
            _kernel("direct_copy_kernel_cuda", 800 * ms, 50 * ms),
            _kernel("vectorized_elementwise_kernel", 900 * ms, 100 * ms),
        ]
    }
    row = summarize(trace)
    assert row["lead"] == 100 * ms
    assert row["wall"] == 1000 * ms  # from entering step() to the last kernel's end
    assert row["busy"] == 650 * ms
    assert row["idle"] == 900 * ms - 650 * ms
    assert (row["matmul"], row["copy"], row["other"]) == (500 * ms, 50 * ms, 100 * ms)
    assert row["nccl"] == 400 * ms
    assert row["mm|nccl"] == 300 * ms
    assert row["mm+"] == 100 * ms
    assert row["gaps"] == "200+100.0 600+100.0 750+50.0"  # from the first kernel, longest first


def test_trace_summary_refuses_a_trace_without_device_kernels() -> None:
    with pytest.raises(ValueError, match="no device kernels"):
        summarize({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]})


@pytest.mark.slow
def test_optimizer_step_benchmark_runs_on_two_gloo_ranks_and_is_bitwise() -> None:
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    step = ["-m", "benchmarks.optimizer_step", "--layers", "1", "--scale", "128", "--warmup", "0", "--iters", "1"]
    done = run_python(*torchrun, *step, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("  ")[0]: line for line in done.stdout.splitlines() if line.startswith(("reference", "ShardedMuon"))
    }
    assert set(rows) == {"reference (1 device)", "ShardedMuon all_ranks (2 ranks)", "ShardedMuon owner_split (2 ranks)"}
    assert all(line.rstrip().endswith("yes") for name, line in rows.items() if name.startswith("ShardedMuon"))


@pytest.mark.slow
def test_main_job_benchmark_names_each_phase_of_a_gate_session_and_how_busy_the_cores_were() -> None:
    run = run_python(
        "-m", "benchmarks.main_job", "--runs", "1", "--", "-n", "0", "-k", "uneven-7x5", timeout=300, cwd=REPO,
        env=repo_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for phase in ("start-up", "collection", "the gates (test calls", "the report", "the rest"):
        assert f"  {phase}" in run.stdout, run.stdout
    assert "test_hand_picked_edge_case_matches_reference_bitwise[uneven-7x5]" in run.stdout, run.stdout
    assert "the machine's cores were busy" in run.stdout


def test_the_main_job_is_recorded_for_the_gates_it_runs_within_its_cpu_budget() -> None:
    """``benchmarks/main_job.json`` is the main job measured on the gates this checkout has: a change
    that adds or removes a gate test fails here until it measures the job again (and the new
    record must stay within the CPU budget of the machine it was taken on), so that the job's cost is never paid
    unmeasured."""
    import json

    from benchmarks.main_job import RECORD, cpu_budget

    record = json.loads(RECORD.read_text(encoding="utf-8"))
    listed = run_python(
        "-m", "pytest", "-m", "gate", "--nproc", "2", "--co", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
        timeout=300, cwd=REPO, env=repo_env(),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    gates = {line for line in listed.stdout.splitlines() if "::" in line}
    added, removed = sorted(gates - set(record["gates"])), sorted(set(record["gates"]) - gates)
    assert not (added or removed), (
        f"the main job's gates changed since {RECORD.name} was recorded (added {added}, removed {removed}): "
        "measure it again with python -m benchmarks.main_job --record benchmarks/main_job.json"
    )
    assert record["median_cpu_s"] <= cpu_budget(record["machine"]), record


def test_a_record_from_a_machine_of_no_known_budget_is_refused_naming_it() -> None:
    from benchmarks.main_job import cpu_budget

    assert cpu_budget("AMD EPYC, AVX2, mkl 2024.2, 2 cores, Python 3.11.7") == 218.0
    with pytest.raises(ValueError, match="no CPU budget for a record taken on 'Arm, NEON, 2 cores'"):
        cpu_budget("Arm, NEON, 2 cores")
