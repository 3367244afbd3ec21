"""The README's code blocks run as written, so the documentation cannot drift from the code.

Every ```python block is executed, in order, in a folder holding what the README assumes a
user has: `model.tflite` (a file TensorFlow's converter wrote, with the dynamic batch every Keras
model has), a predictor trained with `latpred train` in `predictors/cpu`, and a list of
`candidate_graphs`. Every `latpred ...` line of the other blocks must name a real command and
only options that command has; the `inspect` lines run for real.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import latpred
from latpred.cli import main
from latpred.predictors import LatencyModel

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simdata  # noqa: E402


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README) if lang == language]


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """What the README's Python example assumes exists, in a fresh folder."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copy(FIXTURES / "small_cnn_dynamic.tflite", root / "model.tflite")
    dataset = simdata.simulate(root / "data", n_models=40)
    model = LatencyModel.fit(dataset, "host/cpu/fp32/t1", family="lasso", search="paper")
    model.save(root / "predictors" / "cpu")
    return root


def test_readme_has_python_blocks() -> None:
    assert _blocks("python"), "the README lost its Python example"


def test_readme_python_blocks_run(user_folder: Path, monkeypatch) -> None:
    monkeypatch.chdir(user_folder)
    candidates = [latpred.read_tflite(FIXTURES / "small_cnn.tflite"),
                  latpred.read_tflite(FIXTURES / "small_cnn_dynamic.tflite")]
    namespace: dict = {"candidate_graphs": candidates}
    _standin_phone(user_folder, "PIXEL4", monkeypatch)
    has_ray = importlib.util.find_spec("ray") is not None
    for block in _blocks("python"):
        if ("profile_on_ray" in block or "on_ray(" in block) and not has_ray:
            continue  # the optional extra latpred[ray] is not installed
        exec(compile(block, "README.md", "exec"), namespace)
    # The example's own names hold what it says they hold.
    assert namespace["p"].total_ms > 0
    assert len(namespace["totals"]) == len(candidates)
    assert [p.total_ms for p in namespace["both"]] == namespace["totals"]
    assert [p.peak_bytes for p in namespace["both"]] == \
        latpred.memory.memory_totals(candidates, "host/cpu/fp32/t1").tolist()
    assert namespace["kernels"] and (user_folder / "mine.tflite").is_file()
    from latpred.dataset import Dataset

    phone = Dataset.open(user_folder / "pixel4-data").models("pixel4/cpu/fp32/1L")
    assert list(phone["status"]) == ["ok"]
    if has_ray:
        farm = Dataset.open(user_folder / "farm-data").models("host/cpu/fp32/t1")
        assert list(farm["status"]) == ["ok"] and namespace["report"].devices >= 1
        assert namespace["farm_model"].types    # trained on the cluster the block started


def _standin_phone(root: Path, serial: str, monkeypatch) -> None:
    """The README's `--adb` example talks to the stand-in adb of tests/adb_standin (no phone
    is reachable in tests): its folder first on PATH, a fake Pixel 4 named `serial`."""
    here = Path(__file__).resolve().parent
    dev = root / "phones" / serial
    for cpu, khz in enumerate([1785600] * 4 + [2419200] * 3 + [2841600]):
        f = dev / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{khz}\n")
    (dev / "data/local/tmp").mkdir(parents=True, exist_ok=True)
    (dev / "data/local/tmp/benchmark_model").write_bytes(b"stand-in")
    monkeypatch.setenv("PATH", os.pathsep.join([str(here / "adb_standin"),
                                                str(Path(sys.executable).parent),
                                                os.environ["PATH"]]))
    monkeypatch.setenv("LATPRED_ADB_STANDIN_ROOT", str(root / "phones"))


def _command_lines() -> list[list[str]]:
    lines = []
    for lang, body in BLOCK.findall(README):
        if lang == "python":
            continue
        for line in body.splitlines():
            for part in line.split("#")[0].split(";"):
                words = shlex.split(part.strip())
                if words[:1] == ["latpred"]:
                    lines.append(words[1:])
    return lines


def test_readme_command_lines_name_real_commands_and_options() -> None:
    lines = _command_lines()
    assert len(lines) >= 10
    for words in lines:
        command = main
        while isinstance(command, click.Group) and words and words[0] in command.commands:
            command, words = command.commands[words[0]], words[1:]
        assert command is not main, f"README names an unknown command: latpred {' '.join(words)}"
        known = {opt for p in command.params for opt in getattr(p, "opts", [])}
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"{command.name} has no option {word}"


@pytest.mark.parametrize("extra", [[], ["--json"], ["--target", "pixel4/gpu/fp16"]])
def test_readme_inspect_lines_run_on_a_converter_file(extra) -> None:
    result = CliRunner().invoke(main, ["inspect", str(FIXTURES / "small_cnn_dynamic.tflite"),
                                       *extra])
    assert result.exit_code == 0, result.output
