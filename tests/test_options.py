"""The shared command-line layer (utils/options.py) and the checks every entry script runs through it."""

import argparse
import re

import pytest
import torch

import detect
import train
import val
from models.yolo import Model
from utils.errors import UserError
from utils.options import OptionRules, add_shared_flags, check_options, merge_resumed_options, typed_flags

SHARED = {"--weights", "--imgsz", "--img", "--img-size", "--device", "--project", "--name", "--exist-ok"}


def option_strings(parser) -> set:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_entry_script_defines_the_shared_flags_once():
    train_parser = train.build_parser()
    assert SHARED <= option_strings(train_parser)
    for module, argv in ((val, ["--data", "d.yaml", "--weights", "w.pt"]),
                         (detect, ["--weights", "w.pt", "--source", "x.jpg"])):
        opt = module.parse_opt(argv + ["--img", "320", "--exist-ok"])
        assert opt.exist_ok and (opt.imgsz == 320 or opt.imgsz == [320])


@pytest.mark.parametrize("module, argv", [
    (val, ["--data", "d.yaml", "--weights", "w.pt"]),
    (detect, ["--weights", "w.pt", "--source", "x.jpg"]),
])
@pytest.mark.parametrize("imgsz", ["0", "-64"])
def test_val_and_detect_reject_non_positive_image_sizes(module, argv, imgsz):
    with pytest.raises(UserError, match=f"--imgsz .*{imgsz}.*: must be a positive integer"):
        module.parse_opt(argv + ["--imgsz", imgsz])


def test_check_options_names_the_flag_and_accepts_good_values(tmp_path):
    rules = OptionRules(positive=("batch_size",), non_negative=("workers",), files=("cfg",), folders=("out",),
                        choices=(("cache", (None, "ram")),))
    good = argparse.Namespace(batch_size=2, workers=0, cfg="", cache=None, out=str(tmp_path / "new"))
    assert check_options(good, rules) is good and not (tmp_path / "new").exists()  # made by the command, later
    assert check_options(argparse.Namespace(**{**vars(good), "out": str(tmp_path)}), rules).out == str(tmp_path)
    (tmp_path / "a-file").write_text("kept")
    cases = [({"batch_size": 0}, "--batch-size 0: must be a positive integer"),
             ({"workers": -2}, "--workers -2: must be 0 or more"),
             ({"cfg": str(tmp_path / "none.yaml")}, "--cfg .*none.yaml: file not found"),
             ({"cache": "gpu"}, "--cache gpu: use one of None, ram"),
             ({"out": str(tmp_path / "a-file")}, "--out .*a-file: is a file, not a folder"),
             ({"out": str(tmp_path / "a-file" / "sub")}, "--out .*a-file/sub: .*a-file is a file, not a folder"),
             ({"out": "/proc/no-such/out"}, r"--out /proc/no-such/out: cannot write in /proc \(.+\); choose a writable")]
    for change, message in cases:
        with pytest.raises(UserError, match=message):
            check_options(argparse.Namespace(**{**vars(good), **change}), rules)
    assert (tmp_path / "a-file").read_text() == "kept"


def test_resume_merge_keeps_the_checkpoint_and_lets_only_allowed_flags_differ(log_lines):
    saved = {"epochs": 10, "device": "cpu", "workers": 8, "seed": 0}
    typed = {"epochs": 20, "device": "0", "workers": 2}
    merged = merge_resumed_options(saved, typed, may_differ={"device", "workers"})
    assert (merged.epochs, merged.device, merged.workers, merged.seed) == (10, "0", 2, 0)
    assert any("--epochs 20 conflicts with the checkpoint's 10" in line for line in log_lines)


def test_typed_flags_sees_only_what_was_typed():
    parser = argparse.ArgumentParser()
    add_shared_flags(parser, project="runs", weights_help="w", many_weights=False)
    parser.add_argument("--epochs", type=int, default=100)
    assert typed_flags(parser, ["--img", "320"]) == {"imgsz": 320}


def test_half_copy_for_validation_leaves_the_ema_weights_untouched(tiny_cfg):
    torch.manual_seed(0)
    ema = Model(str(tiny_cfg), nc=2)
    before = {k: v.clone() for k, v in ema.state_dict().items()}
    copy = val.half_copy(ema)
    assert next(copy.parameters()).dtype == torch.float16
    after = ema.state_dict()
    assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before)


def test_val_stops_when_weights_and_data_disagree_on_the_class_count(tiny_cfg, shapes_data):
    model = Model(str(tiny_cfg), nc=2)  # the shapes data set has 4 classes
    data = {"nc": 4, "names": ["a", "b", "c", "d"], "yaml_file": str(shapes_data)}
    with pytest.raises(UserError, match="predicts 2 classes but --data .* has 4; use the data set"):
        val._check_class_counts(model, data, "w.pt", single_cls=False)
    val._check_class_counts(model, data, "w.pt", single_cls=True)  # --single-cls scores them as one


UPSTREAM_TABLES = {"train": "TRAIN_UPSTREAM_FLAGS", "val": "VAL_UPSTREAM_FLAGS", "detect": "DETECT_UPSTREAM_FLAGS",
                   "export": "EXPORT_UPSTREAM_FLAGS"}
REQUIRED = {"train": [], "val": ["--data", "d.yaml", "--weights", "w.pt"],
            "detect": ["--weights", "w.pt", "--source", "x.jpg"], "export": ["--weights", "w.pt"]}


def entry_parse(script: str):
    import importlib

    module = importlib.import_module(script)
    return module.parse_opt


@pytest.mark.parametrize("script", sorted(UPSTREAM_TABLES))
def test_a_yolov5_flag_the_script_lacks_gets_what_to_do_in_one_line(script):
    """An upstream command line (``detect.py --dnn``, ``train.py --bucket gs://x``) gets advice, not argparse's usage."""
    import utils.options

    table = getattr(utils.options, UPSTREAM_TABLES[script])
    assert table
    for flag, advice in table.items():
        for argv in ([flag], [f"{flag}=1"], [flag, "value"]):
            with pytest.raises(UserError) as info:
                entry_parse(script)(REQUIRED[script] + argv)
            message = str(info.value)
            assert message == f"{flag}: a YOLOv5 flag that python {script}.py does not carry: {advice}"
            assert "\n" not in message


@pytest.mark.parametrize("script", sorted(UPSTREAM_TABLES))
def test_the_advice_tables_name_only_flags_the_script_really_lacks(script, capsys):
    """A flag added to a script later must leave its table: its advice would claim it is missing."""
    import utils.options

    with pytest.raises(SystemExit) as info:
        entry_parse(script)(["--help"])
    listed = set(re.findall(r"--[a-z][a-z_-]*", capsys.readouterr().out))
    assert info.value.code == 0 and "--help" in listed
    assert not set(getattr(utils.options, UPSTREAM_TABLES[script])) & listed


@pytest.mark.parametrize("script", ["train", "val", "detect", "export", "convert_checkpoint"])
def test_any_other_bad_command_line_is_one_line_naming_the_help(script):
    with pytest.raises(UserError, match=rf"^unrecognized arguments: --frobnicate 3; see python {script}\.py --help$"):
        entry_parse(script)(REQUIRED.get(script, ["a.pt", "b.pt"]) + ["--frobnicate", "3"])
    if script != "train":
        with pytest.raises(UserError, match=rf"^the following arguments are required: .*; see python {script}\.py"):
            entry_parse(script)([])
