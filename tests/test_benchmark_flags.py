"""Every ``python -m benchmarks...`` command with one bad value per numeric flag: one ERROR line naming the flag,
exit 2, before any data is generated or any worker starts. An error raised in a worker is one line too.

benchmarks/gpu_proof/ checks its own flags (tests/test_gpu_proof.py) and is left out here, as is
benchmarks/figures/, which draws the README's pictures from stored tables.
"""

import argparse
import concurrent.futures
import importlib
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import benchmarks.cli
from benchmarks.cli import map_in_workers
from utils.errors import UserError
from tests.support.project_files import project_files

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = sorted(str(p.relative_to(ROOT).with_suffix("")).replace("/", ".")
                  for p in project_files(ROOT / "benchmarks", ".py")
                  if "__main__" in p.read_text() and not {"gpu_proof", "figures"} & set(p.parts))
BAD = {"positive": "0", "non_negative": "-1", "fractions": "1", "positive_numbers": "nan"}
INPUT_FILES = ("hyp", "cfg", "data", "weights")  # flags that name a file the command reads


class Captured(Exception):
    """Raised by the capturing parse_checked with the command's parser and rules."""


def _parser_and_rules(module):
    def capture(parser, rules, argv=None):
        raise Captured(parser, rules)

    with pytest.MonkeyPatch.context() as patch:  # undoes these two only, not the no_work fixture's
        patch.setattr(module, "parse_checked", capture, raising=False)
        patch.setattr(benchmarks.cli, "parse_checked", capture)  # for a command that imports it late
        with pytest.raises(Captured) as captured:
            module.main([])
    return captured.value.args


def _numeric_flags(parser: argparse.ArgumentParser) -> list:
    return [a for a in parser._actions if a.type in (int, float) and a.option_strings]


def _required(parser) -> list:
    """A stand-in value for each positional or required flag (checked after the numeric ones); an existing
    file where the flag names an input file."""
    argv = []
    for action in parser._actions:
        if not action.option_strings:
            argv.append("x")
        elif action.required:
            argv += [action.option_strings[0], __file__ if action.dest in INPUT_FILES else "x"]
    return argv


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """Starting a worker or a child process fails the test: the flags must be checked first."""
    def refuse(*args, **kwargs):
        raise AssertionError("work started before the flags were checked")

    for target, name in [(concurrent.futures, "ProcessPoolExecutor"), (benchmarks.cli, "ProcessPoolExecutor"),
                         (subprocess, "run"), (subprocess, "Popen")]:
        monkeypatch.setattr(target, name, refuse)
    monkeypatch.chdir(tmp_path)  # the stand-in "x" of a required --out would be a folder here, not in the repository


def test_every_command_is_walked():
    assert len(COMMANDS) >= 19 and "benchmarks.accuracy.matrix" in COMMANDS and "benchmarks.cli" not in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_one_bad_value_per_numeric_flag_is_one_line_before_any_work(command, capsys, no_work):
    module = importlib.import_module(command)
    parser, rules = _parser_and_rules(module)
    flags = _numeric_flags(parser)
    assert flags, command
    for action in flags:
        rule = next((name for name in BAD if action.dest in getattr(rules, name)), None)
        assert rule is not None, f"{command}: {action.option_strings[0]} has no rule in RULES"
        flag = action.option_strings[0]
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            module.main([*_required(parser), flag, BAD[rule]])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, (command, flag, err)
        assert err[0].startswith(f"ERROR: {flag} "), (command, err)


@pytest.mark.slow
def test_an_error_raised_in_a_worker_is_one_line():
    assert map_in_workers(math.sqrt, [4.0, 9.0], jobs=1) == [2.0, 3.0]
    with pytest.raises(UserError, match=r"^a worker failed: ValueError: math domain error$"):
        map_in_workers(math.sqrt, [4.0, -1.0], jobs=1)


def pid_of_a_process_whose_command_was_killed(code: str, pid_file: Path) -> int:
    """Run ``python -c code pid_file``; once the process it starts has written its pid there, SIGKILL the
    command and return that pid."""
    command = subprocess.Popen([sys.executable, "-c", code, str(pid_file)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and command.poll() is None, "the process never started"
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        assert is_alive(pid)
    finally:
        command.kill()
        command.wait()
    return pid


def stops_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not is_alive(pid)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="workers stop with their command on Linux only (prctl)")
def test_workers_stop_when_their_command_is_killed(tmp_path):
    """SIGKILL of a command running map_in_workers leaves no worker behind (they trained on, in the same run
    folders as the rerun, before)."""
    worker = pid_of_a_process_whose_command_was_killed(
        "import sys; from benchmarks.cli import map_in_workers; from tests.support.pool_tasks import "
        "report_pid_and_wait; map_in_workers(report_pid_and_wait, [sys.argv[1]], 1)", tmp_path / "worker.pid")
    assert stops_within(worker, 20)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="children stop with their command on Linux only (prctl)")
def test_a_child_command_stops_when_its_benchmark_is_killed(tmp_path):
    """The preexec_fn that vs_authors and module_stats give the training commands they start."""
    child = pid_of_a_process_whose_command_was_killed(
        "import subprocess, sys, time; from benchmarks.cli import request_stop_with_parent; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "preexec_fn=request_stop_with_parent); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(60)",
        tmp_path / "child.pid")
    assert stops_within(child, 20)


def is_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, dead but not yet reaped, counts as stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("argv, flag", [(["--epochs", "0"], "--epochs"), (["--jobs", "0"], "--jobs")])
def test_the_matrix_refuses_before_generating_data(argv, flag, tmp_path, capsys, monkeypatch, no_work):
    from benchmarks.accuracy import matrix

    monkeypatch.setattr(matrix, "make_data", lambda *a, **k: pytest.fail("data generated before the check"))
    with pytest.raises(SystemExit) as exit_info:
        matrix.main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err == [f"ERROR: {flag} 0: must be a positive integer"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, argv", [
    ("benchmarks.accuracy.matrix", ["--kinds", "photos", "--sizes", "160", "17"]),
    ("benchmarks.accuracy.matrix", ["--sizes", "200"]),
    ("benchmarks.accuracy.long_matrix", ["--size", "32"]),
    ("benchmarks.accuracy.vs_authors", ["--authors", "x", "--size", "100"])])
def test_an_image_size_the_generators_or_models_cannot_take_is_one_line(command, argv, tmp_path, capsys, no_work):
    bad = argv[-1]
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(command).main([*argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"ERROR: {argv[-2] if argv[-2].startswith('--') else '--sizes'} {bad}: must be a multiple "
                             "of 32") and "at least 64" in err[0]
    assert not (tmp_path / "out").exists()


def test_every_kind_generates_at_the_smallest_size_the_check_lets_through(tmp_path):
    from benchmarks.accuracy.matrix import KINDS, MIN_SIZE, check_image_sizes, make_data

    check_image_sizes("--sizes", [MIN_SIZE, 160, 256, 320])
    for kind in KINDS:
        data = make_data(kind, MIN_SIZE, 0, 2, 1, tmp_path)
        labels = sorted((data.parent / data.stem / "labels").rglob("*.txt"))
        assert len(labels) == 3 and all(f.read_text().strip() for f in labels), kind  # objects in every image


def _flags_named(parser, dests) -> list:
    return [a for a in parser._actions if a.dest in dests and a.option_strings]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_input_file_or_an_unusable_out_is_one_line_before_any_work(command, tmp_path, capsys, no_work):
    module = importlib.import_module(command)
    parser, _ = _parser_and_rules(module)
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("kept")
    bad = [(a, str(tmp_path / "missing.yaml"), "file not found") for a in _flags_named(parser, INPUT_FILES)]
    bad += [(a, str(not_a_folder), "is a file, not a folder") for a in _flags_named(parser, ("out",))]
    bad += [(a, "/proc/no-such/out", "cannot write in /proc") for a in _flags_named(parser, ("out",))]
    for action, value, message in bad:
        flag = action.option_strings[0]
        with pytest.raises(SystemExit) as exit_info:
            module.main([*_required(parser), flag, value])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, (command, flag, err)
        assert err[0].startswith(f"ERROR: {flag} {value}: {message}"), (command, err)
    assert not_a_folder.read_text() == "kept"
