"""Data set YAML (YOLOv5's schema): parse, validate, resolve paths, generate the embedded data set.

Schema: ``path`` (root), ``train``, ``val``, optional ``test`` (each a folder of images, a ``.txt``
list of image paths, or a list of these, relative to the root unless absolute), ``names`` (a list
or an ``{id: name}`` mapping), optional ``nc`` (alone, it names the classes class0, class1, ... as
YOLOv5 does). A relative ``path`` resolves against the YAML's own folder first, then the working
directory, then the repository's root (YOLOv5's rule). ``generate: shapes`` builds this project's
synthetic data set when it is missing; a ``download:`` key is never executed.
"""

import numbers
from pathlib import Path

from utils.dataset.synthetic.shapes import make_shapes
from utils.errors import UserError
from utils.files import yaml_load
from utils.logging import LOGGER
from utils.options import REPO_ROOT, find_repo_file

SPLITS = ("train", "val", "test")
# generators this project ships, by the name a YAML's ``generate:`` key uses; each is called with the root folder
GENERATORS = {"shapes": make_shapes}


def _parse_names(names, yaml_file) -> list:
    """``names`` as a list or an ``{0: a, 1: b}`` mapping -> list of str (ids must be 0..n-1)."""
    if isinstance(names, dict):
        try:
            ids = sorted(int(k) for k in names)
        except (TypeError, ValueError):
            raise UserError(f"{yaml_file}: 'names' keys must be integer class ids, got {list(names)}") from None
        if ids != list(range(len(ids))):
            raise UserError(f"{yaml_file}: 'names' ids must be 0..{len(ids) - 1} without gaps, got {ids}")
        names = [names[k] if k in names else names[str(k)] for k in ids]
    if not isinstance(names, list) or not names:
        raise UserError(f"{yaml_file}: 'names' must be a non-empty list or an {{id: name}} mapping, got {names!r}")
    return [str(n) for n in names]


def _parse_max_det(max_det, yaml_file):
    """The optional ``max_det`` (detections kept per image in evaluation) as a positive int, or None."""
    if max_det is None:
        return None
    if isinstance(max_det, numbers.Integral) and not isinstance(max_det, bool) and max_det >= 1:
        return int(max_det)
    raise UserError(f"{yaml_file}: 'max_det' must be a positive whole number (detections kept per image in "
                    f"evaluation), got {max_det!r}; write e.g. max_det: 1500 or leave it out")


def _parse_nc(nc, yaml_file):
    """The optional ``nc`` as an int (None when absent). A string of digits such as "2" is read as that
    number with a note; anything else (a fraction, a bool, a word, a list) is a UserError."""
    if nc is None:
        return None
    if isinstance(nc, numbers.Integral) and not isinstance(nc, bool):  # bool is an int subclass: nc: true is no count
        return int(nc)
    if isinstance(nc, str) and nc.strip().isascii() and nc.strip().isdigit():
        LOGGER.warning(f"{yaml_file}: nc is the string {nc!r}; read as the number {int(nc)} (write nc: {int(nc)})")
        return int(nc)
    raise UserError(f"{yaml_file}: 'nc' must be a whole number (the number of names), got {nc!r}; "
                    f"write e.g. nc: 2 or leave it out")


def _resolve_root(root, yaml_file: Path) -> Path:
    """The data set root: absolute as given; relative -> the first that exists of the YAML's folder, the working
    directory and the repository's root (where YOLOv5 resolves it, so an upstream ``path: ../datasets/coco128``
    finds the folder beside the repository from anywhere).

    When none exists the YAML-relative location is returned, so a generator builds it there.
    """
    root = Path(root if root is not None else "")
    if root.is_absolute():
        return root
    candidates = [(folder / root).resolve() for folder in (yaml_file.parent, Path.cwd(), REPO_ROOT)]
    return next((c for c in candidates if c.exists()), candidates[0])


def _resolve_split(value, root: Path, key: str, yaml_file: Path):
    """A split entry (str or list of str) -> absolute path string(s)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise UserError(f"{yaml_file}: '{key}' is an empty list; give a folder of images or a .txt list")
        return [str(_absolute(v, root, key, yaml_file)) for v in value]
    return str(_absolute(value, root, key, yaml_file))


def _absolute(value, root: Path, key: str, yaml_file: Path) -> Path:
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise UserError(f"{yaml_file}: '{key}' must be a folder, a .txt file or a list of them, got {value!r}")
    p = Path(str(value).strip())
    return p if p.is_absolute() else (root / p).resolve()


def _missing_paths(data: dict) -> list:
    """``[(key, path), ...]`` for every split path that does not exist."""
    missing = []
    for key in SPLITS:
        value = data.get(key)
        if value is None:
            continue
        for p in value if isinstance(value, list) else [value]:
            if not Path(p).exists():
                missing.append((key, p))
    return missing


def _run_generator(name, root: Path, data: dict, yaml_file: Path) -> None:
    """Build a data set with one of this project's own generators (never an arbitrary command)."""
    generate = GENERATORS.get(str(name))
    if generate is None:
        raise UserError(f"{yaml_file}: 'generate: {name}' is not a known generator; use one of {sorted(GENERATORS)}")
    LOGGER.info(f"Data set {root} not found, generating it with the '{name}' generator (offline, once) ...")
    try:
        generate(root)
    except FileExistsError as e:
        if _missing_paths(data):  # not just another process that generated it first
            raise UserError(f"{yaml_file}: cannot generate the data set: {e}") from None


def check_dataset(path) -> dict:
    """Load and validate a data set YAML (or an already-loaded dict); generate its data if declared.

    Returns the YAML's dict with ``path`` (absolute str), ``train``, ``val``, optional ``test``
    (absolute path strings or lists of them), ``nc`` (int), ``names`` (list of str),
    ``yaml_file`` (str) and, when the YAML sets it, ``max_det`` (positive int). Every problem is a
    UserError naming the file, the key and the path.
    """
    if isinstance(path, dict):
        data, yaml_file = dict(path), Path(path.get("yaml_file") or Path.cwd() / "data.yaml")
    elif not isinstance(path, (str, Path)):
        raise UserError(f"--data {path!r}: expected a data set .yaml file (or its dict), e.g. data/shapes.yaml")
    else:
        yaml_file = Path(find_repo_file(path, "--data")).resolve()  # val.run(data="shapes.yaml") as the CLI does
        if yaml_file.suffix not in (".yaml", ".yml"):
            raise UserError(f"--data {path}: expected a data set .yaml file")
        if not yaml_file.is_file():
            raise UserError(f"--data {path}: file not found; nothing is downloaded here (YOLOv5 fetches coco128 and "
                            "others): give your data set's YAML (docs/data.md), or data/shapes.yaml for the "
                            "embedded set")
        data = yaml_load(yaml_file)
    nc = _parse_nc(data.get("nc"), yaml_file)
    if data.get("names") in (None, "") and nc is not None and nc > 0:  # YOLOv5 names the classes of an nc-only YAML
        data["names"] = [f"class{i}" for i in range(nc)]
        LOGGER.info(f"{yaml_file}: no 'names', so the {nc} classes are named class0..class{nc - 1}")
    for key in ("train", "val", "names"):
        if data.get(key) in (None, ""):
            raise UserError(f"{yaml_file}: missing key '{key}' (see docs/data.md for the data set YAML schema)")
    names = _parse_names(data["names"], yaml_file)
    if nc is not None and nc != len(names):
        raise UserError(f"{yaml_file}: nc={nc} but 'names' has {len(names)} entries; make them agree")
    if data.get("max_det") is not None:
        data["max_det"] = _parse_max_det(data["max_det"], yaml_file)
    root = _resolve_root(data.get("path"), yaml_file)
    data.update(path=str(root), nc=len(names), names=names, yaml_file=str(yaml_file))
    for key in SPLITS:
        if data.get(key) not in (None, ""):
            data[key] = _resolve_split(data[key], root, key, yaml_file)
        else:
            data.pop(key, None)

    missing = _missing_paths(data)
    if missing and data.get("generate"):
        _run_generator(data["generate"], root, data, yaml_file)
        missing = _missing_paths(data)
    if missing:
        key, p = missing[0]
        if data.get("download"):
            raise UserError(f"{yaml_file}: '{key}' path {p} not found; this YAML has a 'download:' entry, which is "
                            f"never run automatically: download the data set yourself into {root}")
        shipped = yaml_file.parent == REPO_ROOT / "data"  # VisDrone.yaml, AI-TOD.yaml, ...: data sets to convert
        what_to_do = ("get and convert the data set as the YAML's header says (docs/datasets.md), then set 'path' "
                      "to the converter's --out folder" if shipped else "fix the YAML or create the folder")
        raise UserError(f"{yaml_file}: '{key}' path {p} does not exist (root 'path' resolved to {root}); {what_to_do}")
    return data
