"""benchmarks/accuracy/vs_authors.py's bookkeeping, without training: the patched working copy of the
authors' code, each side's command line, and which runs ``--sides`` asks for. The training itself is the
benchmark's (docs/research/)."""

from pathlib import Path

import pytest

from benchmarks.accuracy import vs_authors
from utils.errors import UserError


def fake_authors_tree(root: Path, drop: str | None = None) -> Path:
    """A folder with the files and the lines vs_authors patches, as the authors' commit has them."""
    for name, original, _ in vs_authors.PATCHES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "" if name == drop else f"import numpy as np\n{original}\nKEEP = 1\n"
        path.write_text(text)
    (root / "train.py").write_text("print('their train.py')\n")
    (root / "runs" / "old").mkdir(parents=True)
    return root


def test_working_copy_replaces_only_the_patched_lines_and_leaves_their_folder_alone(tmp_path):
    authors = fake_authors_tree(tmp_path / "authors")
    before = {p: p.read_text() for p in authors.rglob("*.py")}
    copy = vs_authors.working_copy(authors, tmp_path / "out")
    for name, original, replacement in vs_authors.PATCHES:
        text = (copy / name).read_text()
        assert original not in text and replacement in text and "KEEP = 1" in text
    assert not (copy / "runs").exists()  # their old runs are not copied
    assert (tmp_path / "out" / "authors-config" / "Arial.ttf").stat().st_size > 0
    assert {p: p.read_text() for p in authors.rglob("*.py")} == before


def test_working_copy_refuses_a_folder_that_is_not_their_code(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(UserError, match="--authors .*not the FFCA-YOLO authors' code.*git clone"):
        vs_authors.working_copy(tmp_path / "elsewhere", tmp_path / "out")


def test_working_copy_names_a_line_their_code_no_longer_has(tmp_path):
    authors = fake_authors_tree(tmp_path / "authors", drop="utils/metrics.py")
    with pytest.raises(UserError, match="utils/metrics.py no longer has .*874a00d"):
        vs_authors.working_copy(authors, tmp_path / "out")


def job(side: str, tmp_path: Path) -> dict:
    return {"out": str(tmp_path), "authors_code": str(tmp_path / "authors-code"), "site": None,
            "cfg": "models/ffca-yolo-n.yaml", "kind": "photos", "size": 256, "seed": 1, "epochs": 30,
            "side": vs_authors.SIDES[side], "data": "d.yaml"}


@pytest.mark.parametrize("side, folder_is_theirs, paper_hyp", [
    ("authors", True, True), ("ours-paper", False, True), ("ours-default", False, False)])
def test_each_side_runs_its_train_py_with_its_hyp(tmp_path, side, folder_is_theirs, paper_hyp):
    cmd, folder = vs_authors.train_command(job(side, tmp_path))
    assert (folder == tmp_path / "authors-code") is folder_is_theirs
    assert ("--hyp" in cmd and str(vs_authors.PAPER_HYP) in cmd) is paper_hyp
    assert cmd[cmd.index("--name") + 1] == f"photos-256-s1-ffca-yolo-n-{side}"
    assert cmd[cmd.index("--seed") + 1] == "1" and cmd[cmd.index("--batch-size") + 1] == "16"


def test_sides_selects_the_runs_each_cell_gets(tmp_path, monkeypatch, capsys):
    planned, import_checks = [], []
    monkeypatch.setattr(vs_authors, "working_copy", lambda authors, out: out / "authors-code")
    monkeypatch.setattr(vs_authors, "check_their_imports", lambda code, site: import_checks.append(code))
    monkeypatch.setattr(vs_authors, "make_data", lambda kind, size, seed, n_train, n_val, out: out / f"{kind}{seed}.yaml")
    monkeypatch.setattr(vs_authors, "map_in_workers", lambda fn, jobs, n: planned.extend(jobs) or [])
    vs_authors.main(["--authors", str(tmp_path), "--kinds", "photos", "glyphs", "--seeds", "0", "1",
                     "--sides", "authors", "--out", str(tmp_path / "out")])
    assert sorted((j["kind"], j["seed"], j["side"]) for j in planned) == [
        ("glyphs", 0, "authors"), ("glyphs", 1, "authors"), ("photos", 0, "authors"), ("photos", 1, "authors")]
    planned.clear()
    vs_authors.main(["--authors", str(tmp_path), "--out", str(tmp_path / "out")])
    assert [j["side"] for j in planned] == list(vs_authors.SIDES.values())
    assert len(import_checks) == 2  # their imports are checked whenever their side runs
    vs_authors.main(["--authors", str(tmp_path), "--sides", "ours-paper", "--out", str(tmp_path / "out")])
    assert len(import_checks) == 2


def test_an_unknown_side_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        vs_authors.main(["--authors", str(tmp_path), "--sides", "theirs", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "--sides: invalid choice: 'theirs'" in capsys.readouterr().err


def test_a_missing_site_folder_is_refused_before_anything_is_made(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        vs_authors.main(["--authors", str(tmp_path), "--site", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--site" in err and "nowhere: no such folder" in err and "pip install" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_their_train_py_that_does_not_import_is_one_line_naming_the_module(tmp_path):
    code = tmp_path / "out" / "authors-code"
    code.mkdir(parents=True)
    (code / "train.py").write_text("import a_package_their_code_needs\n")
    with pytest.raises(UserError, match=r"--site \(not given\): .*No module named 'a_package_their_code_needs'.*"
                                        r"pip install --no-deps --target SITE"):
        vs_authors.check_their_imports(code, None)


@pytest.mark.slow
def test_site_is_on_their_path_when_their_train_py_imports(tmp_path):
    site = tmp_path / "site"
    (site / "a_package_their_code_needs").mkdir(parents=True)
    (site / "a_package_their_code_needs" / "__init__.py").write_text("")
    code = tmp_path / "out" / "authors-code"
    code.mkdir(parents=True)
    (code / "train.py").write_text("import a_package_their_code_needs\n")
    vs_authors.check_their_imports(code, str(site))
