"""Claim: under torchrun the gates run on the launcher's ranks, on one node or several,
and exactly one report is written (by global rank 0).

Two torchrun invocations rendezvous on loopback through c10d, as two nodes of 2 ranks
would; the edge cases include a 2-D HSDP mesh (replicate across the nodes' groups,
shard within), which only runs with 4 ranks, and the checkpoint gate needs the ranks of
both nodes to agree on one checkpoint directory.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, repo_env

from gates.test_optimizer_gates import EDGE_CASES
from reports.records import CaseResult, Header
from reports.stream import read_stream


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: a plug-in that reorders tests differently in every process, as pytest-randomly does
SHUFFLE_PER_PROCESS = """
import os
import random


def pytest_collection_modifyitems(items):
    random.Random(os.getpid()).shuffle(items)
"""


@pytest.mark.slow
def test_two_simulated_nodes_run_the_gates_and_write_one_report(tmp_path: Path) -> None:
    """Four ranks on two simulated nodes, each rank its own pytest session, with a plug-in
    that shuffles each session's tests its own way: the ranks still run them in one order."""
    port = _free_port()
    report = tmp_path / "report"
    (tmp_path / "shuffle_per_process.py").write_text(SHUFFLE_PER_PROCESS, encoding="utf-8")
    env = repo_env(tmp_path)
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "muongate-selftest",
        "-m", "pytest", str(REPO / "gates"), "-m", "gate", "-k", "hand_picked_edge or checkpoint_round_trip", "-q",
        "-p", "no:cacheprovider", "--rootdir", str(REPO), "--gate-report", str(report), "--hypothesis-profile", "dev",
        "-p", "shuffle_per_process",
    ]  # fmt: skip
    nodes = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, output in zip(nodes, outputs, strict=True):
        # pytest's errors come first and torchrun's traceback last: show both
        assert node.returncode == 0, output[:4000] + "\n…\n" + output[-2000:]
    edge_cases = len(EDGE_CASES)  # every one runs with 4 ranks, the HSDP ones included
    # and the checkpoint gate: one DCP directory shared by the ranks of both nodes
    assert any(f"{edge_cases + 1} passed" in out and "muongate report" in out for out in outputs), outputs[0][-2000:]
    records = list(read_stream(report / "results.jsonl"))
    assert isinstance(records[0], Header) and records[0].nproc == 4
    cases = [r for r in records if isinstance(r, CaseResult)]
    assert all(r.passed for r in cases)
    assert len([r for r in cases if r.gate.startswith("edge:")]) == edge_cases
    assert any(r.gate == "checkpoint" for r in cases)
    assert {r.gate for r in cases} >= {"edge:hsdp-2x2-uneven", "edge:hsdp-2x2-owner-split"}
    assert sorted(p.name for p in report.iterdir()) == [
        "equivalence.html",
        "equivalence.md",
        "figures.json",
        "results.jsonl",
    ]


@pytest.mark.slow
def test_a_torchrun_rank_exits_with_its_session_s_status_when_a_gate_fails(tmp_path: Path) -> None:
    """The ranks leave with ``os._exit`` (matrix finding 35): a red gate still makes torchrun red."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "pytest", str(REPO / "gates" / "test_optimizer_gates.py"), "-m", "gate", "-k", "hand_picked_edge",
        "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO), "--gate-report", str(tmp_path / "report"),
        "--impl", "gates.negative_controls:LocalRowsMuon",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=tmp_path, env=repo_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "failed" in run.stdout and "muongate report" in run.stdout, run.stdout[-3000:]
    assert "terminate called" not in run.stderr, run.stderr[-3000:]
