"""benchmarks/gpu_proof/on_device.sh: a bad OUT_DIR is exit 2 with one line, and the last line names a record only
when this run wrote one (exit 1 stays "a claim failed", as the script's header says)."""

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_proof" / "on_device.sh"


def on_device(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


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
