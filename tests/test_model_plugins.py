"""Claims about ``--model``: a Hugging Face Llama trains bitwise as twins at 2 and 4 ranks
(FSDP2 × TP too, on the library's own plan), a Mixtral with an expert starved on one rank
completes as an empty-expert scenario, and a bad spec or declaration is a usage error."""

from __future__ import annotations

import pytest
from support import run_pytest


def _gates(other_project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return run_pytest(
        other_project, "-p", "harness.plugin", "--pyargs", "gates.test_training_gates", "gates.test_moe_gates", "-m", "gate",
        "-k", "the_models", "-p", "no:randomly", *args, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_a_transformers_llama_trains_as_bitwise_twins_at_two_and_four_ranks(other_project: pytest.Pytester) -> None:
    pytest.importorskip("transformers", reason="the --model examples need the models extra: pip install -e .[models]")
    result = _gates(other_project, "--nproc", "4", "--model", "examples.hf_llama:llama")
    # single process (the reduction_order tier at 4 ranks), twins at 2 and 4, FSDP2 × TP twins;
    # skipped: twins at 8 ranks, and the empty-expert scenario (Llama stages none)
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines_random(
        ["*training:model:twins *bitwise*ref 2/2*", "*training:model:twins:fsdp×tp *bitwise*"]
    )


@pytest.mark.slow
def test_a_transformers_mixtral_with_an_expert_starved_on_one_rank_completes(other_project: pytest.Pytester) -> None:
    pytest.importorskip("transformers", reason="the --model examples need the models extra: pip install -e .[models]")
    result = _gates(other_project, "--nproc", "2", "--model", "examples.hf_mixtral:mixtral", "-k", "empty_expert")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*moe:model*examples.hf_mixtral:mixtral*completed*all equal to the reference*"])


@pytest.mark.slow
def test_a_model_spec_that_does_not_import_or_declares_a_style_it_cannot_take_is_a_usage_error(
    other_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_project.makepyfile(wide="def model():\n    pass\nmodel.muongate_tp_plan = {'layers.*.q': 'sequence'}\n")
    monkeypatch.syspath_prepend(str(other_project.path))
    missing = _gates(other_project, "--model", "no_such_module:model")
    missing.stderr.fnmatch_lines(["*--model no_such_module:model: No module named 'no_such_module'*"])
    wrong = _gates(other_project, "--model", "wide:model")
    wrong.stderr.fnmatch_lines(["*muongate_tp_plan styles {'layers.*.q': 'sequence'} are not one of*"])
