"""YOLOv5's callbacks as train.py's extension point, and the guard against a non-finite loss.

The documented logger example, the hook order and the moment results.csv is written are read from one shared run
(``observed_run``) whose callbacks only look; every run that a callback changes (stops, raises, poisons) is its own.
"""

import contextlib
import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from tests.support.launchers import launcher_env
from tests.support.nan_injection import (inf_gradient_at_batch, nan_at_batch, nan_in_micro_batch,
                                        nan_weight_after_batch, stop_at_batch)
from tests.support.run_outputs import results_rows
from utils.callbacks import HOOKS, CallbackError, Callbacks
from utils.errors import UserError
from utils.training.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# 16 training images at batch 8: 2 batches per epoch
TINY = {"imgsz": 64, "batch_size": 8, "epochs": 2, "device": "cpu", "workers": 0, "noplots": True,
        "save_interval": 0}


pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


def tiny_run(shapes_data, tiny_cfg, project, name, callbacks=None, **flags):
    return train.run(callbacks=callbacks, data=str(shapes_data), cfg=str(tiny_cfg), project=str(project), name=name,
                     **{**TINY, **flags})


# ------------------------------------------------------------------------------------------- the API


def test_actions_run_in_registration_order_with_the_arguments_given():
    seen = []
    callbacks = Callbacks()
    callbacks.register_action("on_fit_epoch_end", "first", lambda vals, epoch, best, fi: seen.append(("a", epoch)))
    callbacks.register_action("on_fit_epoch_end", "second", lambda vals, epoch, best, fi: seen.append(("b", fi)))
    callbacks.run("on_fit_epoch_end", [1.0], 3, 0.5, 0.25)
    assert seen == [("a", 3), ("b", 0.25)]
    assert [a["name"] for a in callbacks.get_registered_actions("on_fit_epoch_end")] == ["first", "second"]
    assert set(callbacks.get_registered_actions()) == set(HOOKS)


@pytest.mark.parametrize("hook", ["on_train_batch_end", "on_fit_epoch_end", "on_model_save", "on_train_end",
                                  "on_pretrain_routine_start", "on_pretrain_routine_end"])
def test_yolov5_hook_names_are_accepted(hook):
    callbacks = Callbacks()
    callbacks.register_action(hook, "logger", print)
    assert callbacks.get_registered_actions(hook)[0]["callback"] is print


def test_an_unknown_hook_or_a_non_callable_is_refused_with_the_choices():
    callbacks = Callbacks()
    with pytest.raises(ValueError, match="callback hook 'on_epoch_end' does not exist; use one of: on_pretrain"):
        callbacks.register_action("on_epoch_end", "x", print)
    with pytest.raises(TypeError, match="callback 'x' on hook 'on_train_end' is str, not a callable"):
        callbacks.register_action("on_train_end", "x", "print")


def test_a_raising_callback_is_one_line_naming_the_hook_and_the_callback():
    callbacks = Callbacks()
    callbacks.register_action("on_train_epoch_end", "my-logger", lambda epoch: 1 / 0)
    with pytest.raises(CallbackError) as info:
        callbacks.run("on_train_epoch_end", epoch=0)
    message = str(info.value)
    assert "callback 'my-logger' on hook 'on_train_epoch_end' raised ZeroDivisionError: division by zero" in message
    assert "\n" not in message


def test_extended_merges_without_changing_either_object():
    own, user = Callbacks(), Callbacks()
    own.register_action("on_train_end", "own", print)
    user.register_action("on_train_end", "user", print)
    merged = own.extended(user)
    assert [a["name"] for a in merged.get_registered_actions("on_train_end")] == ["own", "user"]
    assert [len(c.get_registered_actions("on_train_end")) for c in (own, user)] == [1, 1]


def test_run_takes_yolov5_s_thread_keyword_and_runs_the_callbacks_before_returning():
    seen = []
    callbacks = Callbacks()
    callbacks.register_action("on_model_save", "strict", lambda last, epoch, final, best, fi: seen.append(epoch))
    callbacks.run("on_model_save", "last.pt", 0, False, 0.0, None, thread=False)
    callbacks.run("on_model_save", "last.pt", 1, False, 0.0, None, thread=True)
    assert seen == [0, 1], "thread=True runs synchronously too: its effects never depend on timing"


def test_stop_training_is_yolov5_s_flag_and_names_who_set_it():
    user = Callbacks()
    assert user.stop_training is False and user.stop_request is None

    def stop(epoch):
        user.stop_training = True  # a YOLOv5 callback holds the object it was registered on

    user.register_action("on_train_epoch_end", "enough", stop)
    merged = Callbacks().extended(Callbacks().extended(user))  # as train.py merges its own and the user's
    merged.run("on_train_epoch_end", epoch=0)
    assert merged.stop_training and merged.stop_request == "callback 'enough' on hook 'on_train_epoch_end'"
    merged.stop_training = False
    assert not user.stop_training and merged.stop_request is None
    user.stop_training = True
    assert merged.stop_request == "the caller"


def test_train_run_refuses_callbacks_of_another_type(tmp_path):
    with pytest.raises(UserError, match="callbacks=dict: expected a utils.callbacks.Callbacks object"):
        train.run(callbacks={"on_train_end": print}, project=str(tmp_path))
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------- a run


def recorder(calls: list) -> Callbacks:
    """Callbacks that record every hook they receive, with the arguments that identify the moment."""
    callbacks = Callbacks()

    def record(hook):
        def callback(*args, **kwargs):
            if hook == "on_train_batch_end":
                calls.append((hook, args[1]))
            elif hook in ("on_fit_epoch_end", "on_train_epoch_end"):
                calls.append((hook, kwargs.get("epoch", args[1] if len(args) > 1 else None)))
            elif hook == "on_model_save":
                calls.append((hook, args[1], args[2]))
            elif hook == "on_pretrain_routine_end":
                calls.append((hook, args[0].shape[1], tuple(args[1])))
            elif hook == "on_train_end":
                calls.append((hook, Path(args[0]).name, Path(args[1]).name, args[2], len(args[3])))
            else:
                calls.append((hook,))
        return callback

    for hook in HOOKS:
        callbacks.register_action(hook, f"record {hook}", record(hook))
    return callbacks


def documented_example() -> str:
    """The Python block of docs/training.md's "Callbacks" section."""
    text = (ROOT / "docs" / "training.md").read_text()
    return text.split("## Callbacks", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def observed_run(shapes_data, tiny_cfg, tmp_path_factory) -> dict:
    """docs/training.md's logger example run as written, except that its ``train.run`` trains the TINY run on the
    shapes set (the keywords it passed: 'flags'; its printout: 'out'). Two more callbacks that only look are added
    to the example's: a recorder of every hook ('calls'), and a reader of results.csv at each ``on_fit_epoch_end``
    ('csv': per epoch, the rows on disk, the values the hook got and the columns of the first row). The example's
    logger would stop the run at mAP50 0.9, which 2 tiny epochs do not reach. Three tests read this one run."""
    project, calls, csv, flags_given = tmp_path_factory.mktemp("observed"), [], [], []

    def read_results(vals, epoch, best_fitness, fi):
        rows = results_rows(project / "doc")
        csv.append((len(rows), len(vals), len(rows[0]) if rows else 0))

    observers = recorder(calls)
    observers.register_action("on_fit_epoch_end", "reader", read_results)
    real_run = train.run

    def run_tiny(callbacks=None, **flags):
        flags_given.append(set(flags))
        return real_run(callbacks=callbacks.extended(observers), data=str(shapes_data), cfg=str(tiny_cfg),
                        project=str(project), name="doc", **TINY)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.setattr(train, "run", run_tiny)
        exec(compile(documented_example(), "docs/training.md", "exec"), {"__name__": "example"})
    return {"calls": calls, "csv": csv, "flags": flags_given, "out": out.getvalue(), "run": project / "doc"}


def test_a_user_callback_receives_every_documented_hook_in_order(observed_run):
    calls = observed_run["calls"]
    epoch = lambda e: [("on_train_epoch_start",),  # noqa: E731
                       ("on_train_batch_start",), ("on_train_batch_end", 2 * e),
                       ("on_train_batch_start",), ("on_train_batch_end", 2 * e + 1),
                       ("on_train_epoch_end", e), ("on_fit_epoch_end", e), ("on_model_save", e, e == 1)]
    assert calls == [("on_pretrain_routine_start",),
                     ("on_pretrain_routine_end", 5, ("circle", "square", "triangle", "cross")),
                     ("on_train_start",), *epoch(0), *epoch(1),
                     ("on_train_end", "last.pt", "best.pt", 1, 7)]


def test_results_csv_is_written_before_the_user_s_epoch_callback(observed_run):
    assert [rows for rows, _, _ in observed_run["csv"]] == [1, 2]
    assert all(values == columns - 1 for _, values, columns in observed_run["csv"])  # every column but the epoch


def test_a_raising_callback_stops_the_run_and_keeps_the_last_complete_state(shapes_data, tiny_cfg, tmp_path):
    def fail_in_epoch_1(vals, epoch, best_fitness, fi):
        if epoch == 1:
            raise RuntimeError("tracker server unreachable\nsecond line")

    callbacks = Callbacks()
    callbacks.register_action("on_fit_epoch_end", "my-tracker", fail_in_epoch_1)
    with pytest.raises(CallbackError, match="callback 'my-tracker' on hook 'on_fit_epoch_end' raised RuntimeError: "
                                            "tracker server unreachable; the run stopped there"):
        tiny_run(shapes_data, tiny_cfg, tmp_path, "raise", callbacks=callbacks)
    ckpt = load_checkpoint(tmp_path / "raise" / "weights" / "last.pt")
    assert ckpt["next_position"] == [1, 0] and ckpt["optimizer"] is not None
    resumed = tiny_run(shapes_data, tiny_cfg, tmp_path, "unused", resume=str(tmp_path / "raise" / "weights" /
                                                                              "last.pt"))
    assert len(resumed) == 7


@pytest.mark.slow
def test_stop_training_ends_the_run_at_that_step_with_a_resumable_last_pt(shapes_data, tiny_cfg, tmp_path,
                                                                          log_lines):
    tiny_run(shapes_data, tiny_cfg, tmp_path, "stop", callbacks=stop_at_batch(2), epochs=3)
    last = tmp_path / "stop" / "weights" / "last.pt"
    assert load_checkpoint(last)["next_position"] == [1, 1], "stopped right after global batch 2"
    assert len(results_rows(tmp_path / "stop")) == 1
    lines = [line for line in log_lines if "set stop_training" in line]
    assert len(lines) == 1 and "callback 'enough' on hook 'on_train_batch_end' set stop_training" in lines[0]
    assert "last.pt at epoch 1 batch 1 (resumable)" in lines[0] and f"--resume {last}" in lines[0]
    resumed = tiny_run(shapes_data, tiny_cfg, tmp_path, "unused", resume=str(last))
    assert len(resumed) == 7 and len(results_rows(tmp_path / "stop")) == 3


# ------------------------------------------------------------------------------------------- non-finite loss


def all_finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_a_nan_loss_stops_with_one_line_and_keeps_the_state_before_the_batch(shapes_data, tiny_cfg, tmp_path,
                                                                             capsys):
    before = {}
    opt = train.parse_opt(["--data", str(shapes_data), "--cfg", str(tiny_cfg), "--project", str(tmp_path),
                           "--name", "nan", "--imgsz", "64", "--batch-size", "8", "--epochs", "2", "--device",
                           "cpu", "--workers", "0", "--noplots", "--save-interval", "0"])
    wrapped = train.exit_on_user_error(lambda: train.main(opt, callbacks=nan_at_batch(3, before)))
    with pytest.raises(SystemExit) as exit_info:
        wrapped()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    error = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(error) == 1, err[-2000:]
    assert "ERROR: non-finite loss at epoch 1 batch 1 (box nan, obj nan, cls nan)" in error[0]
    assert "--nan-policy skip" in error[0] and "learning rate" in error[0]
    ckpt = load_checkpoint(tmp_path / "nan" / "weights" / "last.pt")
    assert ckpt["next_position"] == [1, 1]
    assert all_finite(ckpt["model"]) and all_finite(ckpt["ema"])
    assert all(torch.equal(ckpt["model"][k], v) for k, v in before["model"].items()), "not the state before batch 3"
    assert len(results_rows(tmp_path / "nan")) == 1, "epoch 1 never finished"
    resumed = tiny_run(shapes_data, tiny_cfg, tmp_path, "unused", resume=str(tmp_path / "nan" / "weights" / "last.pt"))
    assert len(resumed) == 7 and all(math.isfinite(v) for v in resumed)
    assert len(results_rows(tmp_path / "nan")) == 2


def test_skipping_a_nan_batch_is_counted_and_deterministic(shapes_data, tiny_cfg, tmp_path):
    for name in ("skip-a", "skip-b"):
        tiny_run(shapes_data, tiny_cfg, tmp_path, name, callbacks=nan_at_batch(1), nan_policy="skip")
    a, b = (load_checkpoint(tmp_path / name / "weights" / "last.pt")["model"] for name in ("skip-a", "skip-b"))
    assert all_finite(a) and all(torch.equal(a[k], b[k]) for k in a)
    rows = results_rows(tmp_path / "skip-a")
    assert [float(r["train/skipped"]) for r in rows] == [1.0, 0.0]


def stopped_run(shapes_data, tiny_cfg, project, name, callbacks, capsys) -> str:
    """A tiny run through the command line's error handling that must end with exit 1; its one ERROR line."""
    opt = train.parse_opt(["--data", str(shapes_data), "--cfg", str(tiny_cfg), "--project", str(project),
                           "--name", name, "--imgsz", "64", "--batch-size", "8", "--epochs", "2", "--device",
                           "cpu", "--workers", "0", "--noplots", "--save-interval", "0"])
    with pytest.raises(SystemExit) as exit_info:
        train.exit_on_user_error(lambda: train.main(opt, callbacks=callbacks))()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, err[-2000:]
    return errors[0]


@pytest.mark.slow
def test_an_infinite_gradient_is_not_stepped_and_last_pt_holds_the_state_before_it(shapes_data, tiny_cfg,
                                                                                   tmp_path, capsys):
    before = {}
    error = stopped_run(shapes_data, tiny_cfg, tmp_path, "grad", inf_gradient_at_batch(3, before), capsys)
    assert error.startswith("ERROR: non-finite gradient (global norm inf) at epoch 1 batch 1: not stepped")
    last = tmp_path / "grad" / "weights" / "last.pt"
    assert "last.pt at epoch 1 batch 1 (resumable)" in error and f"python train.py --resume {last}" in error
    ckpt = load_checkpoint(last)
    assert ckpt["next_position"] == [1, 1] and all_finite(ckpt["model"]) and all_finite(ckpt["ema"])
    assert all(torch.equal(ckpt["model"][k], v) for k, v in before["model"].items()), "not the state before it"
    assert all(g is None for g in ckpt["grads"]), "the non-finite accumulated gradient was kept"
    resumed = tiny_run(shapes_data, tiny_cfg, tmp_path, "unused", resume=str(last))
    assert all(math.isfinite(v) for v in resumed)


@pytest.mark.slow
def test_non_finite_weights_never_replace_a_finite_last_pt_and_the_line_says_what_is_there(shapes_data, tiny_cfg,
                                                                                         tmp_path, capsys):
    error = stopped_run(shapes_data, tiny_cfg, tmp_path, "poisoned", nan_weight_after_batch(2), capsys)
    assert error.startswith("ERROR: non-finite loss at epoch 1 batch 1 (box nan")
    last = tmp_path / "poisoned" / "weights" / "last.pt"
    assert "last.pt after epoch 0 (resumable); best.pt from epoch 0." in error, error
    assert f"python train.py --resume {last}" in error
    ckpt = load_checkpoint(last)
    assert ckpt["next_position"] == [1, 0] and all_finite(ckpt["model"]) and all_finite(ckpt["ema"])


@pytest.mark.slow
def test_the_micro_batch_skip_warning_quotes_the_non_finite_micro_batch(shapes_data, tiny_cfg, tmp_path, log_lines):
    tiny_run(shapes_data, tiny_cfg, tmp_path, "micro", callbacks=nan_in_micro_batch(1, micro=1), micro_batch=2,
             nan_policy="skip", epochs=1)
    warnings = [line for line in log_lines if "non-finite loss at epoch" in line]
    assert len(warnings) == 1 and "non-finite loss at epoch 0 batch 1 in micro-batch 1 (box nan" in warnings[0]


def test_nan_policy_is_a_checked_choice():
    with pytest.raises(UserError, match="--nan-policy"):
        train.parse_opt(["--nan-policy", "ignore"])
    assert train.parse_opt([]).nan_policy == "stop"


def torchrun_injected(spec: str, shapes_data, tiny_cfg, project, name: str) -> subprocess.CompletedProcess:
    """tests/support/nan_injection.py ``spec`` on 2 gloo ranks: 16 images at batch 8, 2 steps an epoch."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "tests/support/nan_injection.py", spec, "--data", str(shapes_data), "--cfg", str(tiny_cfg),
           "--project", str(project), "--name", name, "--imgsz", "64", "--batch-size", "8", "--epochs", "2",
           "--device", "cpu", "--workers", "0", "--noplots", "--save-interval", "0"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400, env=launcher_env())


@pytest.mark.slow
def test_a_nan_on_rank_1_alone_stops_both_ranks_with_true_lines(shapes_data, tiny_cfg, tmp_path):
    proc = torchrun_injected("3@1", shapes_data, tiny_cfg, tmp_path, "ddp")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "ERROR: non-finite loss at epoch" in line]
    last = tmp_path / "ddp" / "weights" / "last.pt"
    # the first rank to exit makes torchrun end the other, which may not have printed yet
    assert errors, proc.stderr[-3000:]
    for error in errors:
        assert "epoch 1 batch 1 on rank 1 (box nan, obj nan, cls nan)" in error, error
        assert "last.pt at epoch 1 batch 1 (resumable); best.pt from epoch 0." in error, error
        assert f"torchrun --nproc_per_node 2 train.py --resume {last}" in error, error
    assert "utils/training" not in proc.stderr, "a rank printed a traceback"  # torchrun's own summary may follow
    ckpt = load_checkpoint(last)
    assert ckpt["next_position"] == [1, 1] and all_finite(ckpt["model"])


@pytest.mark.slow
def test_stop_training_on_rank_0_stops_every_rank_at_that_step(shapes_data, tiny_cfg, tmp_path):
    proc = torchrun_injected("stop@2", shapes_data, tiny_cfg, tmp_path, "stop")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "set stop_training" in line]
    assert len(lines) == 1 and "callback 'enough' on hook 'on_train_batch_end'" in lines[0], proc.stderr[-3000:]
    assert "last.pt at epoch 1 batch 1 (resumable)" in lines[0]
    assert "torchrun --nproc_per_node 2 train.py --resume" in lines[0]
    assert load_checkpoint(tmp_path / "stop" / "weights" / "last.pt")["next_position"] == [1, 1]


def test_the_documented_logger_example_runs(observed_run):
    """docs/training.md's YOLOv5-shaped logger, run as written except for a tiny data set and model."""
    assert observed_run["flags"] == [{"data", "cfg", "imgsz", "epochs"}]
    out = observed_run["out"]
    assert "epoch 0: mAP50 " in out and "epoch 1: mAP50 " in out and "fitness" in out
    assert f"finished after epoch 1: {observed_run['run'] / 'weights' / 'best.pt'}" in out
