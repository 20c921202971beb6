"""Command-line options of the entry scripts: the shared flags defined once, one checker, the resume merge.

train.py, val.py and detect.py each build their parser with :func:`add_shared_flags` and check
the parsed namespace with :func:`check_options` against the script's :class:`OptionRules`, so a
bad value gives the same one-line error in every script. :func:`merge_resumed_options` is the
single place where a resumed checkpoint's options meet the flags the user typed.
"""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from utils.errors import UserError
from utils.files import check_folder_can_be_made
from utils.logging import LOGGER


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a UserError (one ERROR line, exit 2) instead of usage text.

    The line ends with ``; see PROG --help`` so the user knows where the flags are listed.
    """

    def error(self, message):
        raise UserError(f"{message}; see {self.prog} --help")


def add_shared_flags(parser: argparse.ArgumentParser, *, project, weights_help: str, many_weights: bool = True,
                     imgsz_help: str = "image size (pixels)", imgsz_hw: bool = False) -> None:
    """``--weights``, ``--imgsz`` (aliases ``--img``, ``--img-size``), ``--device`` and ``--project/--name/--exist-ok``.

    ``many_weights``: several files (an ensemble) and required, as in val/detect; otherwise one
    optional file ('' = from scratch), as in train. ``imgsz_hw``: accept ``h w`` (detect).
    """
    if many_weights:
        parser.add_argument("--weights", nargs="+", type=str, required=True, help=weights_help)
    else:
        parser.add_argument("--weights", type=str, default="", help=weights_help)
    size = dict(nargs="+", default=[640]) if imgsz_hw else dict(default=640)
    parser.add_argument("--imgsz", "--img", "--img-size", type=int, help=imgsz_help, **size)
    parser.add_argument("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    parser.add_argument("--project", default=str(project), help="save to project/name")
    parser.add_argument("--name", default="exp", help="save to project/name")
    parser.add_argument("--exist-ok", action="store_true", help="existing project/name ok, do not increment")


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


def flag_name(attribute: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + attribute.replace("_", "-")


def _values(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_options(opt: argparse.Namespace, rules: OptionRules) -> argparse.Namespace:
    """Raise one :class:`UserError` line for the first option that breaks ``rules``; return ``opt``."""
    for name in rules.positive:
        value = getattr(opt, name)
        if value is not None and any(v < 1 for v in _values(value)):
            raise UserError(f"{flag_name(name)} {value}: must be a positive integer")
    for name in rules.non_negative:
        value = getattr(opt, name)
        if value is not None and any(not 0 <= v < math.inf for v in _values(value)):
            raise UserError(f"{flag_name(name)} {value}: must be 0 or more")
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
                raise UserError(f"{flag_name(name)} {value}: file not found")
    for name in rules.folders:
        value = getattr(opt, name)
        if value:
            check_folder_can_be_made(value, f"{flag_name(name)} {value}")
    for name, allowed in rules.choices:
        value = getattr(opt, name)
        if value not in allowed:
            raise UserError(f"{flag_name(name)} {value}: use one of {', '.join(map(str, allowed))}")
    return opt


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
