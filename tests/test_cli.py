"""The command line: every stage's --help lists its own options, --version, import hygiene."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from transformer_nmt.cli import STAGES, main

SRC = Path(__file__).resolve().parents[1] / "src" / "transformer_nmt"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_help_lists_its_own_options(stage: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([stage, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: transformer_nmt {stage}")
    options = {word for word in out.split() if word.startswith("--") and word != "--help"}
    assert options, f"{stage} --help lists no options:\n{out}"


def test_translate_help_lists_the_model_and_the_paper_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["translate", "--help"])
    out = capsys.readouterr().out
    assert "--model" in out and "--spm-model" in out
    assert "beam size (4)" in out and "α (0.6)" in out


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("transformer_nmt ")


def _all_modules() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# The third-party packages the modules import, loaded once before the forks: what the test
# checks is the order in which this package's own modules import one another.
THIRD_PARTY = ("numpy", "yaml", "torch", "lightning", "mlflow", "sacrebleu", "sentencepiece",
               "sacremoses", "ctranslate2", "snakemake")  # fmt: skip


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """No import cycle: each module of the package imports first, in a process of its own (a
    fork of one interpreter that has loaded the third-party packages and none of this one)."""
    script = (
        "import importlib, os, sys, traceback\n"
        "for lib in sys.argv[1].split(','):\n"
        "    try: importlib.import_module(lib)\n"
        "    except ImportError: pass\n"
        "assert not [m for m in sys.modules if m.startswith('transformer_nmt')]\n"
        "failed = []\n"
        "for name in sys.argv[2:]:\n"
        "    read, write = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(read)\n"
        "        try: importlib.import_module(name)\n"
        "        except BaseException:\n"
        "            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    os.close(write)\n"
        "    with os.fdopen(read) as pipe: error = pipe.read()\n"
        "    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]):\n"
        "        failed.append(f'{name}: {error}')\n"
        "print('\\n'.join(failed))\n"
    )
    modules = _all_modules()
    assert "transformer_nmt.training.run" in modules and "transformer_nmt.data.batch" in modules
    result = subprocess.run(
        [sys.executable, "-c", script, ",".join(THIRD_PARTY), *modules],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == ""


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet); its stdout."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_inference_does_not_import_training_code() -> None:
    """translate needs no Lightning, sacreBLEU or sacremoses (nor any training module)."""
    code = (
        "import sys, transformer_nmt.inference.translator, transformer_nmt.cli.translate\n"
        "heavy = ['lightning', 'sacrebleu', 'sacremoses']\n"
        "print([m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith('transformer_nmt.training')])\n"
    )
    assert _fresh_python(code) == "[]"


def test_text_only_stages_start_without_torch() -> None:
    """score and report read text and JSON: their commands, the search settings their
    arguments share with translate and the report's figures (the paper's Table 3 from the model
    config) load without torch, ~1.3 s of each DAG job's start; the names that need torch load
    on first use, as the objects of the modules that define them."""
    code = (
        "import sys, transformer_nmt.cli.score, transformer_nmt.cli.report\n"
        "import transformer_nmt.evaluation.figures, transformer_nmt.evaluation.report\n"
        "from transformer_nmt.search import SearchSettings, length_penalty\n"
        "from transformer_nmt.model import TABLE3, ModelConfig\n"
        "print('torch' in sys.modules, length_penalty.__name__)\n"
        "from transformer_nmt.search import beam_search\n"
        "from transformer_nmt.model import Transformer\n"
        "import transformer_nmt.model.transformer as home\n"
        "print('torch' in sys.modules, beam_search.__module__, Transformer is home.Transformer)\n"
    )
    assert _fresh_python(code) == ("False length_penalty\nTrue transformer_nmt.search.beam True")


def test_package_import_stays_light() -> None:
    code = (
        "import sys, transformer_nmt\n"
        "assert 'torch' not in sys.modules, 'import transformer_nmt pulled in torch'\n"
        "from transformer_nmt import Translator\n"
        "print(Translator.__module__)\n"
    )
    assert _fresh_python(code) == "transformer_nmt.inference.translator"
