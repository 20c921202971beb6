"""The shared command-line layer (utils/options.py) and the checks every entry script runs through it."""

import argparse
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import audit
import convert_checkpoint
import detect
import export
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


@pytest.mark.parametrize("module", [train, val, detect, export, audit, convert_checkpoint])
def test_version_prints_the_project_version_without_other_flags(module, capsys, monkeypatch):
    """``--version`` answers even though the scripts require --weights, --data, --source, --cfg or files."""
    from utils import __version__, version

    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    monkeypatch.setattr(version, "git_description", lambda *args: "v1.0.0-2-g1a2b3c4-dirty")
    with pytest.raises(SystemExit) as info:
        module.parse_opt(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"python {module.__name__}.py {__version__}+g1a2b3c4.dirty"


def test_version_is_no_keyword_of_the_python_api(tmp_path):
    with pytest.raises(UserError, match="version=: no such option"):
        train.run(version=True, project=str(tmp_path))


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
    """An upstream command line (``detect.py --dnn``, ``train.py --bucket gs://x``) gets advice, not usage text."""
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


def test_a_bare_yaml_name_is_found_in_models_or_data_as_in_yolov5(tmp_path, monkeypatch):
    """``--cfg yolov5n.yaml``, ``--hyp hyp.scratch-low.yaml``, ``--data shapes.yaml`` from any folder."""
    from utils.options import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    opt = argparse.Namespace(cfg="yolov5n.yaml", hyp="hyp.scratch-low.yaml", data="shapes.yaml", weights="",
                             epochs=1, imgsz=64, patience=0, workers=0, save_interval=1.0, cache=None, micro_batch=0)
    check_options(opt, train.TRAIN_RULES)
    assert (opt.cfg, opt.hyp, opt.data) == (str(REPO_ROOT / "models" / "yolov5n.yaml"),
                                            str(REPO_ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"),
                                            str(REPO_ROOT / "data" / "shapes.yaml"))
    (tmp_path / "yolov5n.yaml").write_text("nc: 1\n")  # a file of that name in the working folder wins
    opt.cfg = "yolov5n.yaml"
    assert check_options(opt, train.TRAIN_RULES).cfg == "yolov5n.yaml"


def test_a_name_the_repository_holds_twice_or_not_at_all_is_not_guessed(tmp_path, monkeypatch):
    import utils.options
    from utils.options import find_repo_file

    for folder in ("models", "data/hyps", "data/other"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "models" / "m.yaml").write_text("")
    (tmp_path / "data" / "hyps" / "h.yaml").write_text("")
    (tmp_path / "data" / "other" / "h.yaml").write_text("")
    monkeypatch.setattr(utils.options, "REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path / "data")
    assert find_repo_file("m.yaml", "--cfg") == str(tmp_path / "models" / "m.yaml")
    with pytest.raises(UserError, match=r"^--hyp h\.yaml: no such file here, and the repository has several "
                                        r"\(data/hyps/h\.yaml, data/other/h\.yaml\); give the path of one$"):
        find_repo_file("h.yaml", "--hyp")
    assert find_repo_file("absent.yaml", "--cfg") == "absent.yaml"
    assert find_repo_file("sub/m.yaml", "--cfg") == "sub/m.yaml"  # a path is taken as given
    opt = argparse.Namespace(cfg="absent.yaml")
    with pytest.raises(UserError, match=r"^--cfg absent\.yaml: file not found$"):
        check_options(opt, OptionRules(files=("cfg",), repo_yamls=("cfg",)))


def test_missing_weights_or_data_say_nothing_is_downloaded(tmp_path, monkeypatch):
    """YOLOv5 downloads yolov5s.pt and coco128; here each is one line saying what to do instead."""
    from models.backends import load_backend
    from utils.dataset.data_config import check_dataset

    monkeypatch.chdir(tmp_path)
    opt = argparse.Namespace(weights="yolov5s.pt")
    with pytest.raises(UserError, match=r"^--weights yolov5s\.pt: file not found; nothing is downloaded here: .*"
                                        r"python convert_checkpoint\.py SRC DST\)$"):
        check_options(opt, OptionRules(files=("weights",)))
    for weights in ("yolov5s.pt", ["best.pt", "yolov5s.pt"], "yolov5s.onnx"):
        with pytest.raises(UserError, match=r"^--weights (yolov5s|best)\.(pt|onnx): file not found; nothing is "):
            load_backend(weights)
    with pytest.raises(UserError, match=r"^--data coco128\.yaml: file not found; nothing is downloaded here .*"
                                        r"data/shapes\.yaml for the embedded set$"):
        check_dataset("coco128.yaml")
    assert sorted(tmp_path.iterdir()) == []


def test_the_model_printer_finds_a_bare_cfg_name_too(tmp_path, monkeypatch, log_lines):
    """``python models/yolo.py --cfg yolov5n.yaml`` (YOLOv5's habit) from another folder."""
    from models.yolo import main as yolo_main

    monkeypatch.chdir(tmp_path)
    yolo_main(["--cfg", "yolov5n.yaml", "--imgsz", "64"])
    assert any(line.startswith("yolov5n summary:") for line in log_lines)


def test_train_run_keywords_are_the_flags_by_any_spelling():
    parser = train.build_parser()
    opt = parser.parse_keywords({"img": 96, "batch_size": 4, "cos_lr": True, "data": "x.yaml"}, "train.run")
    assert (opt.imgsz, opt.batch_size, opt.cos_lr, opt.data) == (96, 4, True, "x.yaml")
    assert opt.epochs == parser.parse_args([]).epochs, "what was not given keeps its default"


@pytest.mark.parametrize("keywords, message", [
    ({"epoch": 3}, r"^train\.run: epoch=: no such option; see python train\.py --help"),
    ({"img_size": 64, "imgsz": 64}, r"^train\.run: img_size= and imgsz= set the same option; pass one$"),
    ({"bucket": "gs://b"}, r"^train\.run: bucket=: a YOLOv5 option that python train\.py does not carry: cloud storage"),
    ({"upload_dataset": True}, r"^train\.run: upload_dataset=: a YOLOv5 option .*Weights & Biases"),
])
def test_train_run_refuses_a_keyword_it_would_otherwise_ignore(keywords, message, tmp_path):
    with pytest.raises(UserError, match=message):
        train.run(project=str(tmp_path), **keywords)
    assert not any(tmp_path.iterdir()), "nothing is made"


@pytest.mark.parametrize("keywords, message", [
    ({"epochs": 2.5}, r"^train\.run: epochs=2\.5: expected an integer$"),
    ({"epochs": True}, r"^train\.run: epochs=True: expected an integer$"),
    ({"batch_size": "x8"}, r"^train\.run: batch_size='x8': expected an integer$"),
    ({"imgsz": [64, 64]}, r"^train\.run: imgsz=\[64, 64\]: expected one value, not a list$"),
    ({"weights": None}, r"^train\.run: weights=None: expected a string or a path$"),
    ({"noplots": 1}, r"^train\.run: noplots=1: expected True or False$"),
    ({"optimizer": "sgd"}, r"^train\.run: optimizer='sgd': choose from SGD, Adam, AdamW$"),
    ({"logger": "wandb"}, r"^train\.run: logger='wandb': choose from tensorboard, mlflow$"),
    ({"freeze": []}, r"^train\.run: freeze=\[\]: expected at least one value$"),
    ({"deterministic": False}, r"^train\.run: deterministic=False: choose from off, warn, scoped, strict$"),
])
def test_train_run_checks_a_keywords_value_as_the_command_line_would(keywords, message, tmp_path):
    """epochs=2.5 used to build the data set and a run folder, then fail in range() with a TypeError."""
    with pytest.raises(UserError, match=message):
        train.run(data="data/shapes.yaml", cfg="tests/models/tiny.yaml", project=str(tmp_path), **keywords)
    assert not any(tmp_path.iterdir()), "nothing is made"


def test_train_run_reads_values_as_their_flags_do():
    """Text and numpy numbers go through the flag's type; True on a flag with an optional value is the bare
    flag, False is the flag not given; one value for a flag of several is a list of one."""
    parser = train.build_parser()
    opt = parser.parse_keywords({"epochs": np.int64(3), "batch_size": "8", "label_smoothing": 0, "cache": True,
                                 "evolve": True, "logger": "tensorboard", "freeze": 10, "weights": Path("a.pt")},
                                "train.run")
    bare = parser.parse_args(["--cache", "--evolve"])
    assert (opt.epochs, opt.batch_size, opt.label_smoothing) == (3, 8, 0.0)
    assert type(opt.epochs) is int and type(opt.label_smoothing) is float
    assert (opt.cache, opt.evolve) == (bare.cache, bare.evolve) != (None, None)
    assert (opt.logger, opt.freeze, opt.weights) == (["tensorboard"], [10], "a.pt")
    assert parser.parse_keywords({"cache": False}, "train.run").cache == parser.parse_args([]).cache
