"""Command line of the converters: ``python data/scripts/convert.py FORMAT --src DIR --out DIR [options]``."""

import argparse
import sys

from utils.converters import coco, dota, vedai, visdrone, voc
from utils.errors import UserError, exit_on_user_error
from utils.options import OneLineErrorParser

FORMATS = {
    "visdrone": (visdrone, "VisDrone2019-DET (annotations/*.txt)"),
    "aitod": (coco, "AI-TOD (COCO-format JSON)"),
    "coco": (coco, "any COCO-format instances JSON"),
    "vedai": (vedai, "VEDAI 512/1024 colour or infrared tiles"),
    "dota": (dota, "DOTA v1.0/1.5/2.0 oriented polygons -> axis-aligned boxes"),
    "voc": (voc, "Pascal VOC XML"),
}



def build_parser() -> argparse.ArgumentParser:
    """The parser with one sub-command per format."""
    parser = OneLineErrorParser(prog="convert.py", description="Convert a data set you have to YOLO format, offline.")
    sub = parser.add_subparsers(dest="format", required=True, metavar="FORMAT", parser_class=OneLineErrorParser)
    for name, (module, text) in FORMATS.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--src", required=True, help="the data set as downloaded (see docs/datasets.md)")
        p.add_argument("--out", required=True, help="new folder for the YOLO data set (replaced if an earlier "
                                                    "conversion wrote it)")
        p.add_argument("--name", default="", help="data YAML name (default: the data set's name)")
        p.add_argument("--link", action="store_true", help="hard-link images instead of copying them")
        module.add_arguments(p)
    return parser


def run(argv=None) -> None:
    """Parse the command line and run the chosen converter (a UserError propagates).

    A file-system fault (full disk, read-only folder, unreadable file) is a UserError too: the writer has then
    removed its staging folder, so ``--out`` holds what it held before."""
    opt = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        FORMATS[opt.format][0].convert(opt)
    except OSError as e:
        raise UserError(f"--out {opt.out}: the conversion stopped: {e.strerror or e} ({e.filename}); --out is "
                        "unchanged and nothing half-written is left; free disk space or fix the folder, then "
                        "rerun") from None


main = exit_on_user_error(run)  # the entry point: a UserError becomes one ERROR line and exit code 2
