"""Command-line options of the entry scripts: the shared flags defined once, one checker, the resume merge.

train.py, val.py and detect.py each build their parser with :func:`add_shared_flags` and check
the parsed namespace with :func:`check_options` against the script's :class:`OptionRules`, so a
bad value gives the same one-line error in every script. :func:`merge_resumed_options` is the
single place where a resumed checkpoint's options meet the flags the user typed.
"""

import argparse
import math
import numbers
from dataclasses import dataclass
from pathlib import Path

from utils.version import add_version_flag
from utils.errors import UserError
from utils.files import check_folder_can_be_made
from utils.logging import LOGGER


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a UserError (one ERROR line, exit 2) instead of usage text.

    The line ends with ``; see PROG --help`` so the user knows where the flags are listed. ``upstream_flags``
    maps flags of YOLOv5's version of the command that this one does not carry to what to do instead: an
    upstream command line gets that advice rather than "unrecognized arguments".
    """

    def __init__(self, *args, upstream_flags: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.upstream_flags = upstream_flags or {}

    def error(self, message):
        raise UserError(self.upstream_advice(message) or f"{message}; see {self.prog} --help")

    def parse_keywords(self, keywords: dict, caller: str) -> argparse.Namespace:
        """The Python API's options (``train.run(img=320, batch_size=8)``): the flags' defaults, with ``keywords``
        set as given and checked as the command line would check them (:func:`keyword_value`). A keyword is any
        spelling of a flag with ``_`` for ``-`` (``img``, ``img_size``, ``imgsz``). An unknown keyword, or two
        spellings of one flag, is one UserError line: a typo would otherwise be ignored and the run trained with
        the default."""
        spellings = {s.lstrip("-").replace("-", "_"): a.dest for a in self._actions for s in a.option_strings
                     if a.dest not in ("help", "version")}
        actions = {a.dest: a for a in self._actions}
        opt, seen = self.parse_args([]), {}
        for key, value in keywords.items():
            if key not in spellings:
                advice = self.upstream_flags.get(f"--{key}") or self.upstream_flags.get(f"--{key.replace('_', '-')}")
                raise UserError(f"{caller}: {key}=: " + (f"a YOLOv5 option that {self.prog} does not carry: {advice}"
                                                        if advice else f"no such option; see {self.prog} --help "
                                                        "(a flag's name with _ for -, such as batch_size)"))
            dest = spellings[key]
            if dest in seen:
                raise UserError(f"{caller}: {seen[dest]}= and {key}= set the same option; pass one")
            seen[dest] = key
            setattr(opt, dest, keyword_value(actions[dest], f"{caller}: {key}={value!r}", value))
        return opt

    def upstream_advice(self, message: str) -> str | None:
        if not message.startswith("unrecognized arguments:"):
            return None
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if flag in self.upstream_flags:
                return f"{flag}: a YOLOv5 flag that {self.prog} does not carry: {self.upstream_flags[flag]}"
        return None


TYPE_NAMES = {int: "an integer", float: "a number", str: "a string or a path"}


def keyword_value(action: argparse.Action, where: str, value):
    """A Python API keyword's ``value`` as the command line would have given the flag of ``action``: a switch
    takes True or False; a flag that takes a value as an option (``--cache``, ``--evolve``) reads True as the
    bare flag and False as not given, where not giving it means off (``deterministic=False`` is refused: its
    default is on); a flag that takes several values takes a list or one value; each value
    goes through the flag's type and choices. Anything else is one UserError line starting with ``where``
    (a float for ``epochs`` failed deep inside training, a string for ``batch_size`` in a comparison)."""
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected True or False")
        return value
    if action.nargs == "?" and isinstance(value, bool) and (value or not action.default):
        return action.const if value else action.default
    many = action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction)
    if isinstance(value, (list, tuple)) and not many:
        raise UserError(f"{where}: expected one value, not a list")
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if many and not items and action.nargs == "+":
        raise UserError(f"{where}: expected at least one value")
    converted = [_typed(action, item, where) for item in items]
    for item in converted:
        if action.choices is not None and item not in action.choices:
            raise UserError(f"{where}: choose from {', '.join(map(str, action.choices))}")
    return converted if many else converted[0]


def _typed(action: argparse.Action, item, where: str):
    """One value through the flag's type, as argparse applies it to text (True is not an integer here)."""
    expected = f"{where}: expected {TYPE_NAMES.get(action.type, 'a value the flag accepts')}"
    if action.type is None or (item is None and action.default is None):
        return item
    if item is None:
        raise UserError(expected)
    if type(item) is action.type or (action.type is float and type(item) is int):
        return action.type(item)
    try:
        return action.type(item if isinstance(item, (str, Path)) else str(item))
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise UserError(expected) from None


_ONNX_INSTEAD = ("OpenCV DNN inference is not built in; export with python export.py --include onnx and pass the "
                 ".onnx file to --weights (it runs on ONNX Runtime)")
_WANDB = "Weights & Biases is not built in; --logger tensorboard or --logger mlflow log the same metrics"
_NO_NMS_IN_GRAPH = ("the exported graph ends before NMS (TensorFlow NMS is not built in); detect.py and val.py apply "
                    "NMS to an exported model with --conf-thres and --iou-thres")
_NO_INT8 = "int8 quantisation is not built in; export fp32 (or --half on CUDA) and quantise with your runtime's tools"
_FORMATS_HERE = "TensorFlow, CoreML and TensorRT exports are not built in; --include takes onnx torchscript openvino"
DETECT_UPSTREAM_FLAGS = {
    "--dnn": _ONNX_INSTEAD,
    "--update": "not needed: checkpoints here are plain data that load with weights_only=True (convert an upstream "
                "one with python convert_checkpoint.py SRC DST)",
}
VAL_UPSTREAM_FLAGS = {"--dnn": _ONNX_INSTEAD}
TRAIN_UPSTREAM_FLAGS = {
    "--bucket": "cloud storage is not built in (nothing is downloaded or uploaded); copy the files to a local path",
    **dict.fromkeys(("--entity", "--upload_dataset", "--bbox_interval", "--artifact_alias"), _WANDB),
    **dict.fromkeys(("--evolve_population", "--resume_evolve"),
                    "to continue an evolution, rerun the same --evolve command with --exist-ok: it continues from "
                    "the evolve.csv of its run folder"),
    **dict.fromkeys(("--ndjson-console", "--ndjson-file"),
                    "every epoch's metrics are in the run folder's results.csv (and in --logger tensorboard "
                    "or mlflow)"),
}
EXPORT_UPSTREAM_FLAGS = {
    **dict.fromkeys(("--int8", "--per-tensor", "--data"), _NO_INT8),
    **dict.fromkeys(("--keras", "--optimize", "--mlmodel", "--workspace"), _FORMATS_HERE),
    **dict.fromkeys(("--nms", "--agnostic-nms", "--topk-per-class", "--topk-all", "--iou-thres", "--conf-thres"),
                    _NO_NMS_IN_GRAPH),
}


def add_shared_flags(parser: argparse.ArgumentParser, *, project, weights_help: str, many_weights: bool = True,
                     imgsz_help: str = "image size (pixels)", imgsz_hw: bool = False) -> None:
    """``--weights``, ``--imgsz`` (aliases ``--img``, ``--img-size``), ``--device``, ``--project/--name/--exist-ok``,
    ``--version`` and ``--modules``.

    ``many_weights``: several files (an ensemble) and required, as in val/detect; otherwise one
    optional file ('' = from scratch), as in train. ``imgsz_hw``: accept ``h w`` (detect).
    """
    if many_weights:
        parser.add_argument("--weights", nargs="+", type=str, required=True, help=weights_help)
    else:
        parser.add_argument("--weights", type=str, default="", help=weights_help)
    size = dict(nargs="+", default=[640]) if imgsz_hw else dict(default=640)
    parser.add_argument("--imgsz", "--img", "--img-size", type=int, help=imgsz_help, **size)
    parser.add_argument("--device", default="",
                        help="cuda device, i.e. 0 or 0,1,2,3 or cpu; cuda: the default GPU, never falling back to "
                             "the CPU")
    parser.add_argument("--project", default=str(project), help="save to project/name")
    parser.add_argument("--name", default="exp", help="save to project/name")
    parser.add_argument("--exist-ok", action="store_true", help="existing project/name ok, do not increment")
    add_version_flag(parser)
    add_modules_flag(parser)


def add_modules_flag(parser: argparse.ArgumentParser) -> None:
    """``--modules FILE.py`` (repeatable): Python files whose ``@register_module`` blocks the model uses."""
    parser.add_argument("--modules", action="append", default=[], metavar="FILE.py",
                        help="import this Python file first, so the blocks it registers with @register_module "
                             "work in a model YAML (repeatable; see docs/models.md)")


@dataclass(frozen=True)
class OptionRules:
    """What a script's parsed options must satisfy (attribute names, e.g. ``"batch_size"``)."""

    positive: tuple = ()
    non_negative: tuple = ()  # integers or finite numbers
    fractions: tuple = ()  # finite numbers from 0 up to, not including, 1
    positive_numbers: tuple = ()  # finite numbers above 0
    files: tuple = ()  # paths that must exist when given (an empty value means "not given")
    folders: tuple = ()  # output folders: a missing one is made later, an existing file is refused
    choices: tuple = ()  # (name, allowed values) pairs for values that argparse cannot restrict
    repo_yamls: tuple = ()  # a bare file name not in the working folder is looked up in models/ and data/


REPO_ROOT = Path(__file__).resolve().parents[1]
SEARCHED_FOLDERS = ("models", "data")  # where YOLOv5 finds --cfg yolov5n.yaml or --hyp hyp.scratch-low.yaml
MISSING_FILE_HINTS = {
    "weights": "; nothing is downloaded here: put the file on disk first (a YOLOv5 or FFCA-YOLO release .pt "
               "converts with python convert_checkpoint.py SRC DST)",
}


def flag_name(attribute: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + attribute.replace("_", "-")


def _values(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _is_number(value) -> bool:
    """An int or float, numpy's included; not a bool, string or None (values from the Python API get the rule's
    one line, not a TypeError in a comparison)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_positive_integer(value) -> bool:
    return _is_number(value) and value >= 1 and float(value).is_integer()


def _is_non_negative(value) -> bool:
    return _is_number(value) and 0 <= value < math.inf


def check_options(opt: argparse.Namespace, rules: OptionRules) -> argparse.Namespace:
    """Raise one :class:`UserError` line for the first option that breaks ``rules``; return ``opt``, with the
    bare names of ``rules.repo_yamls`` resolved to the repository's file of that name."""
    for name in rules.repo_yamls:
        setattr(opt, name, find_repo_file(getattr(opt, name), flag_name(name)))
    for name in rules.positive:
        value = getattr(opt, name)
        if value is not None and not all(map(_is_positive_integer, _values(value))):
            raise UserError(f"{flag_name(name)} {value!r}: must be a positive integer")
    for name in rules.non_negative:
        value = getattr(opt, name)
        if value is not None and not all(map(_is_non_negative, _values(value))):
            raise UserError(f"{flag_name(name)} {value!r}: must be 0 or more")
    for name in rules.fractions:
        if any(not 0 <= v < 1 for v in _values(getattr(opt, name))):
            raise UserError(f"{flag_name(name)} {getattr(opt, name)}: must be at least 0 and below 1")
    for name in rules.positive_numbers:
        value = getattr(opt, name)
        if value is not None and any(not 0 < v < math.inf for v in _values(value)):
            raise UserError(f"{flag_name(name)} {value}: must be a positive number")
    for name in rules.files:
        for value in _values(getattr(opt, name)):
            if value and not Path(value).is_file():
                raise UserError(f"{flag_name(name)} {value}: file not found{MISSING_FILE_HINTS.get(name, '')}")
    for name in rules.folders:
        value = getattr(opt, name)
        if value:
            check_folder_can_be_made(value, f"{flag_name(name)} {value}")
    for name, allowed in rules.choices:
        value = getattr(opt, name)
        if value not in allowed:
            raise UserError(f"{flag_name(name)} {value}: use one of {', '.join(map(str, allowed))}")
    return opt


def find_repo_file(value, flag: str):
    """``value`` when it exists or is more than a bare file name; else the one file of that name under the
    repository's models/ or data/, as YOLOv5 resolves ``--cfg yolov5n.yaml`` (else ``value``, left for the
    existence checks to report)."""
    if not value or Path(value).exists() or Path(value).name != str(value):
        return value
    found = sorted(p for folder in SEARCHED_FOLDERS for p in (REPO_ROOT / folder).rglob(str(value)) if p.is_file())
    if len(found) > 1:
        raise UserError(f"{flag} {value}: no such file here, and the repository has several "
                        f"({', '.join(str(p.relative_to(REPO_ROOT)) for p in found)}); give the path of one")
    return str(found[0]) if found else value


def typed_flags(parser: argparse.ArgumentParser, argv: list) -> dict:
    """The options the user actually typed in ``argv`` (defaults left out), by attribute name."""
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_known_args(argv)[0])


def merge_resumed_options(saved: dict, typed: dict, may_differ: set) -> argparse.Namespace:
    """A resumed run's options: the checkpoint's, except ``may_differ`` flags the user typed.

    Any other typed flag that disagrees with the checkpoint is reported and ignored, so a resumed
    run continues exactly the run that was saved.
    """
    merged = argparse.Namespace(**saved)
    for key, value in typed.items():
        if key in may_differ:
            setattr(merged, key, value)
        elif key in saved and saved[key] != value:
            LOGGER.warning(f"--resume: {flag_name(key)} {value} conflicts with the checkpoint's {saved[key]!r}; "
                           "the checkpoint's value is used")
    return merged
