"""benchmarks/gpu_proof/on_device.sh: a bad OUT_DIR is exit 2 with one line, and the last line names a record only
when this run wrote one (exit 1 stays "a claim failed", as the script's header says); a module the proof needs
that cannot be imported is one line (benchmarks/gpu_proof/start.py, shared with multi_gpu.sh)."""

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.gpu_proof import start

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_proof" / "on_device.sh"


def on_device(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.slow
@pytest.mark.parametrize("first, named", [("--device", "'--device'"), ("a-file", "'a-file'"), ("", "usage")])
def test_an_out_dir_that_is_a_flag_or_a_file_is_exit_2_with_one_line(tmp_path, first, named):
    (tmp_path / "a-file").write_text("kept\n")
    proc = on_device(first, "--device", "cpu", "--quick", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
    assert "mkdir" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and (tmp_path / "a-file").read_text() == "kept\n"


@pytest.mark.slow
def test_a_proof_that_writes_no_record_is_not_said_to_have_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "proof.json").write_text('{"an": "earlier record"}\n')
    proc = on_device(str(out), "--no-such-flag", cwd=tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 2 and "no record written" in last and "proof.json" not in last, proc.stdout
    assert (out / "proof.json").read_text() == '{"an": "earlier record"}\n'


@pytest.mark.slow
def test_a_module_the_proof_needs_that_does_not_import_is_one_line_and_no_record(tmp_path):
    """torch made unimportable by a module on PYTHONPATH that raises ImportError, as in a bare image."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "torch.py").write_text('raise ImportError("torch is not installed in this test")\n')
    out = tmp_path / "out"
    proc = on_device(str(out), "--quick", cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(blocked)})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stdout + proc.stderr
    assert lines[0].startswith("ERROR: the proof needs the module 'torch'") and "not installed in this test" in lines[0]
    assert lines[1].startswith("proof exit code 2; no record written")
    assert "Traceback" not in proc.stdout + proc.stderr and sorted(p.name for p in out.iterdir()) == ["proof.log"]


def test_the_import_check_names_the_first_module_that_does_not_import_and_passes_when_all_do(tmp_path, monkeypatch):
    assert start.first_unimportable(("json", "no_such_module_for_this_test", "also_absent")).startswith(
        "ERROR: the proof needs the module 'no_such_module_for_this_test', which this Python cannot import (No module")
    assert start.first_unimportable(("json", "os")) is None
    # as opencv does where the image lacks libGL: not an ImportError, and a message of several lines
    (tmp_path / "loads_a_missing_library.py").write_text('raise OSError("libGL.so.1: cannot open\\nsecond line")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert start.first_unimportable(("loads_a_missing_library",)) == (
        "ERROR: the proof needs the module 'loads_a_missing_library', which this Python cannot import "
        "(libGL.so.1: cannot open): install it, or run the proof in an image that has it")


@pytest.mark.parametrize("argv", [[], ["--quick"]])
def test_start_without_a_module_is_its_usage_line(argv, capsys):
    assert start.main(argv) == 2
    assert capsys.readouterr().err.strip() == start.USAGE
