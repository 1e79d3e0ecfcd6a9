"""Claims about accepted findings (``--accept FILE``, ``harness/plugin/accepted.py``): a gate whose
every failure an accepted finding covers, for the release installed, is xfailed and shown as
accepted (never bitwise); a failure no finding covers, or a finding written for another release,
stays red; a bad file is refused at once in one line naming the entry and the field."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch
from support import ENGINES, REPO, repo_env, run_python

from harness.plugin.accepted import AcceptedError, AcceptedFinding, load_accepted

BROKEN = "examples.broken_muon:broken_muon"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "accepted.toml"
    path.write_text(text)
    return path


ENTRY = 'finding = "f"\ngates = ["several_steps"]\nreason = "known"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"holds \[\[accepted\]\] entries only, at least one"),
        ("[[accepted]\n", "not TOML"),
        ("[[accepted]]\n" + ENTRY + 'gate = "x"\n', r"accepted\[0\]: unknown field\(s\) \['gate'\]"),
        ('[[accepted]]\nfinding = "f"\nreason = "r"\n', r"accepted\[0\]: lacks 'gates'"),
        ('[[accepted]]\nfinding = "f"\ngates = []\nreason = "r"\n', r"accepted\[0\]: 'gates' is a list of gate names"),
        ("[[accepted]]\n" + ENTRY.replace('"known"', '" "'), r"accepted\[0\]: 'reason' is a string that says"),
        (
            "[[accepted]]\n" + ENTRY + 'applies_to = "deepspeed>=0.19"\n',
            "applies_to='deepspeed>=0.19' is PACKAGE==RELEASE",
        ),
        ("[[accepted]]\n" + ENTRY + "[[accepted]]\nfinding = 3\n", r"accepted\[1\]: lacks 'gates'"),
    ],
)
def test_a_bad_file_of_accepted_findings_is_refused_naming_the_entry_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(AcceptedError, match=message):
        load_accepted(_file(tmp_path, text))


def test_a_finding_applies_only_to_the_release_it_names() -> None:
    assert AcceptedFinding("f", ("g",), "r").installed() is None, "no release named: it applies"
    assert AcceptedFinding("f", ("g",), "r", f"torch=={torch.__version__}").installed() is None
    assert AcceptedFinding("f", ("g",), "r", "torch==0.0.1").installed() == (
        f"it applies to torch==0.0.1, and torch {torch.__version__} is installed"
    )
    assert "no-such-package is not installed" in str(
        AcceptedFinding("f", ("g",), "r", "no-such-package==1").installed()
    )
    assert AcceptedFinding("f", ("engine:stage [123] muon *",), "r").covers("engine:stage 2 muon ×4 bfloat16")


def _session(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python(
        "-m", "pytest", "--pyargs", "gates", "-m", "gate", "--nproc", "2", "-q", "-p", "no:cacheprovider",
        f"--gate-report={tmp_path / 'report'}", "--hypothesis-profile", "dev", "--hypothesis-seed", "0", *args,
        cwd=tmp_path, env=repo_env(tmp_path), timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_an_accepted_finding_keeps_exactly_its_gate_green_as_accepted_and_another_release_red(tmp_path: Path) -> None:
    """A broken Muon (``examples/broken_muon.py``) red in ``several_steps``: accepted, the session
    passes with that gate xfailed and reported as accepted, not bitwise; the same finding written
    for another torch is not applied, and the session is red."""
    accepted = _file(tmp_path, "[[accepted]]\n" + ENTRY + f'applies_to = "torch=={torch.__version__}"\n')
    run = _session(tmp_path, "-k", "several_steps", "--impl", BROKEN, f"--accept={accepted}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 xfailed" in run.stdout and "1 accepted, 0 not judged, 0 differ" in run.stdout, run.stdout[-3000:]
    assert "ACCEPTED (f: known) several_steps: differs from reference" in run.stdout
    gates = json.loads((tmp_path / "report" / "figures.json").read_text())["gates"]
    assert gates["several_steps"]["failed_cases"] > 0, "accepted, and still counted as failing cases"
    assert "**ACCEPTED (f: known)** `several_steps`" in (tmp_path / "report" / "equivalence.md").read_text()

    other = _file(tmp_path, "[[accepted]]\n" + ENTRY + 'applies_to = "torch==0.0.1"\n')
    run = _session(tmp_path, "-k", "several_steps", "--impl", BROKEN, f"--accept={other}")
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"accepted finding 'f' of {other} not applied: it applies to torch==0.0.1" in run.stdout


@pytest.mark.slow
def test_deepspeed_0_19_8_with_its_documented_findings_accepted_is_green_naming_each(tmp_path: Path) -> None:
    """``examples/accepted/deepspeed-0.19.8.toml`` on DeepSpeed's cells that its findings turn red
    (per-head at stage 0, Muon's clipping at 1–3, stage 0 in bf16) and on cells they do not."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip(f"needs {ENGINES}")
    accepted = REPO / "examples" / "accepted" / "deepspeed-0.19.8.toml"
    run = run_python(
        "-m", "pytest", "--pyargs", "gates.test_engine_gates", "-m", "gate", "--nproc", "2", "-q",
        "-p", "no:cacheprovider", "--hypothesis-profile", "dev", "--hypothesis-seed", "0",
        f"--gate-report={tmp_path / 'report'}", "--engine", "examples.deepspeed_adapter:deepspeed_zero",
        f"--accept={accepted}", "-k", "each_head or clips_by or (steps_like and stage0 and muon)",
        cwd=tmp_path, env=repo_env(), timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    for finding in ("deepspeed-per-head-muon-dropped", "deepspeed-muon-clips-the-update"):
        assert f"ACCEPTED ({finding}: " in run.stdout, run.stdout[-3000:]
    assert " differ\n" in run.stdout and ", 0 differ" in run.stdout
