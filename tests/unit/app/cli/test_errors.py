"""Every misuse of `sangama generate`, `assemble` and `coordinator --model` is refused in
one line that names the problem and what would work: a non-zero status, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import core.models
from app.cli.main import main
from core.gguf_slices import slice_model
from tests.support.gguf_fixtures import split_gguf
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit

MODEL_CHOICES = "give 'default', smollm2-135m-instruct, gemma-3-270m, or a path to a GGUF file"


def _write_gguf(path: Path, arch: str) -> Path:
    """A GGUF with a header and one tensor: enough to be judged, nothing to run."""
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """An 8-layer model as gguf-split publishes it: three files, big-0000N-of-00003.gguf."""
    root = tmp_path_factory.mktemp("split")
    whole = write_tiny_model(root / "whole.gguf")
    out = root / "shards"
    out.mkdir()
    paths = split_gguf(whole, out, "big", max_tensors=30)
    assert len(paths) == 3
    return paths


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory, shards: list[Path]) -> dict[str, Path]:
    """Things people pass where a model or pieces belong."""
    root = tmp_path_factory.mktemp("odd")
    not_gguf = root / "model.gguf"
    not_gguf.write_text("<html>Sign in to download</html>\n")
    empty = root / "empty"
    empty.mkdir()
    return {
        "not_gguf": not_gguf,
        "shard": shards[1],
        "unknown_arch": _write_gguf(root / "mystery.gguf", "mamba9"),
        "empty_dir": empty,
        "missing": root / "nowhere" / "model.gguf",
    }


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 layers that may be cut only at 0, 4 and 8 (RoPE skipped every 4th layer)."""
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny-smollm3.gguf", arch="smollm3")


@pytest.fixture(scope="module")
def pieces(smollm3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pieces")
    slice_model(smollm3, out)
    return out


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices land under the test's folder, not the user's cache."""
    monkeypatch.setattr(core.models, "cache_dir", lambda: tmp_path / "cache")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = 2) -> str:
    """Run `sangama argv` in-process; return its one-line complaint."""
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"sangama {argv[0]}: error: "), err
    return err


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """argparse's own refusal: status 2, usage and one error line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ---------------------------------------------------------------- generate


def test_generate_cuts_beyond_the_model(
    capsys: pytest.CaptureFixture[str], tiny_llama: Path
) -> None:
    err = _refused(capsys, ["generate", "--model", str(tiny_llama), "--cuts", "0,5,8,9"])
    assert err.endswith(
        "cuts must run from 0 to 8 for tiny-llama (8 layers); got 0,5,8,9 — e.g. --cuts 0,3,5,8"
    ), err


def test_generate_cuts_short_of_the_model(
    capsys: pytest.CaptureFixture[str], tiny_llama: Path
) -> None:
    err = _refused(capsys, ["generate", "--model", str(tiny_llama), "--cuts", "0,4"])
    assert "cuts must run from 0 to 8" in err and "e.g. --cuts 0,3,5,8" in err, err


def test_generate_cut_the_model_forbids_lists_the_allowed_cuts(
    capsys: pytest.CaptureFixture[str], smollm3: Path
) -> None:
    err = _refused(capsys, ["generate", "--model", str(smollm3), "--cuts", "0,3,8"])
    assert "cannot cut at layer 3" in err, err
    assert "allows cuts only at 0,4,8" in err and "RoPE" in err, err
    assert err.endswith("e.g. --cuts 0,4,8"), err


@pytest.mark.parametrize(
    ("cuts", "says"),
    [
        ("0,6,6,8", "cuts must strictly increase"),
        ("0,6,3,8", "cuts must strictly increase"),
        ("2,8", "cuts start at 0"),
        ("8", "cuts start at 0"),
        ("0,four,8", "cuts must be integers"),
    ],
)
def test_generate_cut_syntax_is_argparse_s(
    capsys: pytest.CaptureFixture[str], cuts: str, says: str
) -> None:
    line = _usage_error(capsys, ["generate", "--cuts", cuts])
    assert line.startswith("sangama generate: error: argument --cuts:") and says in line, line


def test_generate_unknown_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, ["generate", "--model", "gemma3"])
    assert err.endswith(f"no model named 'gemma3': {MODEL_CHOICES}"), err


def test_generate_missing_file(capsys: pytest.CaptureFixture[str], odd: dict[str, Path]) -> None:
    err = _refused(capsys, ["generate", "--model", str(odd["missing"])])
    assert f"no file at {odd['missing']}: {MODEL_CHOICES}" in err, err


def test_generate_not_a_gguf(capsys: pytest.CaptureFixture[str], odd: dict[str, Path]) -> None:
    err = _refused(capsys, ["generate", "--model", str(odd["not_gguf"])])
    assert "is not a GGUF file" in err and "convert_hf_to_gguf" in err, err


def test_generate_shard(capsys: pytest.CaptureFixture[str], odd: dict[str, Path]) -> None:
    err = _refused(capsys, ["generate", "--model", str(odd["shard"])])
    assert "is shard 2 of 3 of a split GGUF" in err, err
    assert "pass the first shard (big-00001-of-00003.gguf) to `sangama slice`" in err, err


def test_generate_first_shard_points_to_slice(
    capsys: pytest.CaptureFixture[str], shards: list[Path]
) -> None:
    err = _refused(capsys, ["generate", "--model", str(shards[0])])
    assert "is shard 1 of 3 of a split GGUF" in err, err
    assert "pass the first shard (big-00001-of-00003.gguf) to `sangama slice`" in err, err


def test_generate_unknown_architecture(
    capsys: pytest.CaptureFixture[str], odd: dict[str, Path]
) -> None:
    err = _refused(capsys, ["generate", "--model", str(odd["unknown_arch"])])
    assert "is a 'mamba9' model" in err and "llama" in err and "gemma3" in err, err


def test_generate_given_a_folder(capsys: pytest.CaptureFixture[str], odd: dict[str, Path]) -> None:
    err = _refused(capsys, ["generate", "--model", str(odd["empty_dir"])])
    assert f"{odd['empty_dir']} is a folder, not a GGUF file: {MODEL_CHOICES}" in err, err


def test_generate_given_pieces(capsys: pytest.CaptureFixture[str], pieces: Path) -> None:
    err = _refused(capsys, ["generate", "--model", str(pieces)])
    assert "is a folder of pieces, not a GGUF file" in err and "sangama assemble" in err, err


# ---------------------------------------------------------------- assemble


def _assemble(pieces: Path, layers: str, out: Path) -> list[str]:
    # --layers=VALUE: argparse takes a separate "-2:4" for an option, not a value.
    return ["assemble", str(pieces), f"--layers={layers}", "--out", str(out)]


def test_assemble_writes_an_allowed_stage(pieces: Path, tmp_path: Path) -> None:
    out = tmp_path / "stage.gguf"
    assert main(_assemble(pieces, "4:8", out)) == 0
    assert out.stat().st_size > 0


def test_assemble_layers_outside_the_model(
    capsys: pytest.CaptureFixture[str], pieces: Path, tmp_path: Path
) -> None:
    out = tmp_path / "stage.gguf"
    err = _refused(capsys, _assemble(pieces, "4:12", out))
    assert err.endswith(
        "--layers 4:12 is outside tiny-smollm3 (8 layers): STOP may be at most 8 "
        "— e.g. --layers 0:4"
    ), err
    assert not out.exists()


def test_assemble_layers_at_a_forbidden_cut(
    capsys: pytest.CaptureFixture[str], pieces: Path, tmp_path: Path
) -> None:
    err = _refused(capsys, _assemble(pieces, "2:4", tmp_path / "s.gguf"))
    assert "a stage cannot start or end at layer 2" in err, err
    assert "allows cuts only at 0,4,8" in err and "e.g. --layers 0:4" in err, err


@pytest.mark.parametrize("layers", ["6-12", "6", "a:b", "4:4", "8:4", "-2:4", "1:2:3"])
def test_assemble_layer_syntax_is_argparse_s(
    capsys: pytest.CaptureFixture[str], pieces: Path, tmp_path: Path, layers: str
) -> None:
    line = _usage_error(capsys, _assemble(pieces, layers, tmp_path / "s.gguf"))
    assert line.startswith("sangama assemble: error: argument --layers:"), line
    assert "START:STOP" in line and "e.g. 6:12" in line, line


@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("missing", "no folder"),
        ("empty_dir", "has no manifest.json, so it is not a folder of pieces"),
        ("not_gguf", "is a file, not a folder of pieces"),
    ],
)
def test_assemble_without_pieces(
    capsys: pytest.CaptureFixture[str],
    odd: dict[str, Path],
    tmp_path: Path,
    which: str,
    says: str,
) -> None:
    err = _refused(capsys, _assemble(odd[which], "0:4", tmp_path / "s.gguf"))
    assert says in err and "`sangama slice MODEL.gguf --out" in err, err


def test_assemble_given_the_gguf_itself(
    capsys: pytest.CaptureFixture[str], smollm3: Path, tmp_path: Path
) -> None:
    err = _refused(capsys, _assemble(smollm3, "0:4", tmp_path / "s.gguf"))
    assert f"cut it first with `sangama slice {smollm3} --out DIR`" in err, err


def test_assemble_given_a_shard(
    capsys: pytest.CaptureFixture[str], odd: dict[str, Path], tmp_path: Path
) -> None:
    err = _refused(capsys, _assemble(odd["shard"], "0:4", tmp_path / "s.gguf"))
    assert "pass the first shard (big-00001-of-00003.gguf) to `sangama slice" in err, err


def test_an_unwritable_output_is_one_line(
    capsys: pytest.CaptureFixture[str], pieces: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = _refused(capsys, _assemble(pieces, "0:4", blocker / "stage.gguf"))
    assert str(blocker) in err, err


# ---------------------------------------------------------------- coordinator --model


@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("missing", "no file at"),
        ("not_gguf", "is not a GGUF file"),
        ("unknown_arch", "is a 'mamba9' model"),
        ("empty_dir", "has no manifest.json, so it is not a folder of pieces"),
        ("shard", "give the first shard (big-00001-of-00003.gguf) instead"),
    ],
)
def test_coordinator_refuses_the_model_before_creating_anything(
    capsys: pytest.CaptureFixture[str],
    odd: dict[str, Path],
    tmp_path: Path,
    which: str,
    says: str,
) -> None:
    data = tmp_path / "data"
    err = _refused(capsys, ["coordinator", "--data", str(data), "--model", str(odd[which])])
    assert f"error: --model {odd[which]}: " in err and says in err, err
    assert not data.exists()


def test_coordinator_unknown_model_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _refused(capsys, ["coordinator", "--data", str(tmp_path / "d"), "--model", "smollm"])
    assert err.endswith(f"--model smollm: no model named 'smollm': {MODEL_CHOICES}"), err


def test_coordinator_takes_a_split_model_by_its_first_shard(
    shards: list[Path], tmp_path: Path
) -> None:
    from coordinator.server.serve import hosted_model

    model = hosted_model(str(shards[0]), tmp_path / "data")
    assert model.manifest.facts.n_layer == 8
    assert model.directory.parent == tmp_path / "data" / "models"


def test_coordinator_serves_a_folder_of_pieces(pieces: Path, tmp_path: Path) -> None:
    from coordinator.server.serve import hosted_model

    model = hosted_model(str(pieces), tmp_path)
    assert model.directory == pieces
    assert model.manifest.facts.allowed_cuts == (0, 4, 8)
    assert not (tmp_path / "models").exists()  # nothing sliced again


# ---------------------------------------------------------------- a real process


def _sangama() -> Path:
    exe = Path(sys.executable).parent / "sangama"
    if not exe.exists():
        pytest.skip("the sangama console script is not installed next to this Python")
    return exe


@pytest.mark.parametrize("command", ["generate", "coordinator"])
def test_a_real_process_prints_one_line_and_fails(
    tmp_path: Path, tiny_llama: Path, odd: dict[str, Path], command: str
) -> None:
    argv = {
        "generate": ["generate", "--model", str(tiny_llama), "--cuts", "0,5,8,9"],
        "coordinator": ["coordinator", "--data", str(tmp_path / "d"), "--model", str(odd["shard"])],
    }[command]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [str(_sangama()), *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sangama {command}: error: "), lines
    assert {
        "generate": "cuts must run from 0 to 8",
        "coordinator": "shard 2 of 3 of a split GGUF (gguf-split) was given",
    }[command] in lines[0]
