"""train.py end to end on a tiny model and a tiny generated data set (CPU, 64 px)."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from tests.support.run_outputs import results_rows
from tests.support.training_runs import train_run
from utils.training.checkpoints import load_checkpoint
from utils.errors import UserError

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, shapes_data, tiny_cfg) -> Path:
    """One complete 2-epoch run with plots and --save-period 1, shared by several tests."""
    return train_run(tmp_path_factory.mktemp("train"), shapes_data, tiny_cfg, save_period=1)


@pytest.mark.slow
def test_two_epoch_run_writes_every_output(finished_run):
    weights = finished_run / "weights"
    for name in ("last.pt", "best.pt", "epoch0.pt", "epoch1.pt", "sha256.txt"):
        assert (weights / name).is_file(), name
    for name in ("hyp.yaml", "opt.yaml", "environment.yaml", "determinism.json", "results.csv", "results.png",
                 "labels.jpg", "train_batch0.jpg", "confusion_matrix.png"):
        assert (finished_run / name).is_file(), name
    rows = results_rows(finished_run)
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert {"train/box_loss", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "x/lr0"} <= set(rows[0])
    assert all(float(r["train/box_loss"]) > 0 for r in rows)


@pytest.mark.slow
def test_checkpoints_are_plain_data_and_stripped(finished_run):
    last = torch.load(finished_run / "weights" / "last.pt", weights_only=True)
    assert last["finished"] is True and last["optimizer"] is None and last["ema"] is None
    assert all(v.dtype == torch.float16 for v in last["model"].values() if v.is_floating_point())
    full = torch.load(finished_run / "weights" / "epoch0.pt", weights_only=True)
    assert full["optimizer"] is not None and full["next_position"] == [1, 0]
    assert all(v.dtype == torch.float32 for v in full["ema"].values() if v.is_floating_point())
    assert set(full["rng"]) >= {"python", "numpy", "torch"}


@pytest.mark.slow
def test_resume_from_epoch_checkpoint_matches_uninterrupted_run(finished_run, shapes_data, tmp_path, log_lines):
    """Resuming the epoch-0 checkpoint in a copy of the run ends with the same EMA checksum. Its determinism.json
    says the first part ran under another thread count: the resume warns once, naming both counts."""
    copy = tmp_path / "copy"
    (copy / "weights").mkdir(parents=True)
    for f in ("hyp.yaml", "opt.yaml", "results.csv"):
        (copy / f).write_bytes((finished_run / f).read_bytes())
    record = json.loads((finished_run / "determinism.json").read_text())
    threads = torch.get_num_threads()
    (copy / "determinism.json").write_text(json.dumps({**record, "threads": threads + 1}))
    (copy / "weights" / "last.pt").write_bytes((finished_run / "weights" / "epoch0.pt").read_bytes())
    train.run(resume=str(copy / "weights" / "last.pt"))
    warnings = [line for line in log_lines if "--resume on another machine setup" in line]
    assert len(warnings) == 1 and f"thread count {threads + 1} -> {threads}." in warnings[0]
    record = json.loads((copy / "determinism.json").read_text())
    assert record["machine_changes"] == [{"resumed_at": [1, 0], "changes": {"thread count": [threads + 1, threads]}}]
    expected = (finished_run / "weights" / "sha256.txt").read_text().split()[0]
    assert (copy / "weights" / "sha256.txt").read_text().split()[0] == expected
    assert [r["epoch"] for r in results_rows(copy)] == ["0", "1"]
    assert results_rows(copy) == results_rows(finished_run)


@pytest.mark.slow
def test_resume_of_finished_run_says_nothing_to_resume(finished_run):
    with pytest.raises(UserError, match="nothing to resume"):
        train.run(resume=str(finished_run / "weights" / "last.pt"))


@pytest.mark.slow
def test_transfer_reports_matched_layers_and_freeze_keeps_weights(finished_run, shapes_data, tiny_cfg, tmp_path,
                                                                  log_lines):
    source = finished_run / "weights" / "last.pt"
    run_dir = train_run(tmp_path, shapes_data, tiny_cfg, weights=str(source), epochs=1, freeze=[2],
                        save_period=1, noplots=True)
    assert re.search(r"Transferred \d+/\d+ items from " + re.escape(str(source)), "\n".join(log_lines))
    start = load_checkpoint(source)["model"]
    trained = load_checkpoint(run_dir / "weights" / "epoch0.pt")["model"]
    frozen = [k for k in trained if k.startswith(("model.0.", "model.1.")) and k.endswith("weight")]
    assert frozen, "the tiny model should have weights in layers 0 and 1"
    for key in frozen:
        assert torch.equal(trained[key], start[key].float()), key
    moved = [k for k in trained if k.startswith("model.2.") and k.endswith("weight")
             and not torch.equal(trained[k], start[k].float())]
    assert moved, "unfrozen layers should train"


@pytest.mark.slow
def test_early_stopping_ends_before_last_epoch(shapes_data, tiny_cfg, tmp_path, monkeypatch):
    """Fitness that only falls after epoch 0 stops the run after --patience epochs."""
    falling = iter([0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01, 0.0])

    def fake_validation(*args, **kwargs):
        m = next(falling)
        return train.validate.ValResult(m, m, m, m, 0.1, 0.1, 0.1, maps=None, times=(0.0, 0.0, 0.0))

    monkeypatch.setattr(train.validate, "run", fake_validation)
    run_dir = train_run(tmp_path, shapes_data, tiny_cfg, epochs=6, patience=2, noplots=True)
    assert [r["metrics/mAP_0.5"] for r in results_rows(run_dir)] == ["0.5", "0.4", "0.3"]


@pytest.mark.slow
def test_strict_stops_before_training_on_nondeterministic_op_and_scoped_trains(shapes_data, tmp_path):
    from tests.support.nondeterministic_module import write_put_model_yaml

    cfg = write_put_model_yaml(tmp_path)
    with pytest.raises(UserError) as err:
        train_run(tmp_path, shapes_data, cfg, name="strict", deterministic="strict", epochs=1, noplots=True)
    message = str(err.value)
    assert "put" in message and "backward" in message and "--deterministic scoped" in message
    assert not (tmp_path / "strict" / "results.csv").exists(), "strict must stop before the first epoch"
    run_dir = train_run(tmp_path, shapes_data, cfg, name="scoped", deterministic="scoped", epochs=1, noplots=True)
    assert len(results_rows(run_dir)) == 1
    assert not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled() \
        is False


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--cfg", ""], "--cfg is required"),
    (["--cfg", "models/nope.yaml"], "--cfg models/nope.yaml: file not found"),
    (["--epochs", "0"], "--epochs 0"),
    (["--batch-size", "-3"], "--batch-size -3"),
    (["--hyp", "nope.yaml"], "--hyp nope.yaml: file not found"),
    (["--patience", "-1"], "--patience -1"),
    (["--imgsz", "0"], "--imgsz 0: must be a positive integer"),
    (["--imgsz", "-64"], "--imgsz -64: must be a positive integer"),
    (["--workers", "-1"], "--workers -1: must be 0 or more"),
    (["--save-interval", "-5"], "--save-interval -5.0: must be 0 or more"),
    (["--cache", "gpu"], "--cache gpu: use one of"),
    (["--quad", "--batch-size", "6"], "--quad needs a per-device batch size divisible by 4, got 6"),
])
def test_bad_flags_raise_a_user_error_naming_the_flag(flags, message, tiny_cfg, shapes_data, tmp_path):
    opt = train.parse_opt(["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--project", str(tmp_path),
                           "--device", "cpu", *flags])
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        train.main(opt, argv=[])


@pytest.mark.slow
def test_bad_flag_on_the_command_line_prints_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--cfg", "models/nope.yaml", "--project", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ERROR: --cfg models/nope.yaml: file not found"


@pytest.mark.slow
def test_corrupt_resume_checkpoint_gives_clear_error(tmp_path):
    bad = tmp_path / "exp" / "weights" / "last.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    proc = subprocess.run([sys.executable, "train.py", "--resume", str(bad)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("ERROR:") and str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_image_size_rounded_up_to_stride_multiple(shapes_data, tiny_cfg, tmp_path, log_lines):
    run_dir = train_run(tmp_path, shapes_data, tiny_cfg, imgsz=70, epochs=1, noplots=True)
    assert "WARNING ⚠️ --imgsz 70 must be a multiple of max stride 32, updating to 96" in "\n".join(log_lines)
    assert "Image sizes 96 train, 96 val" in "\n".join(log_lines)
    assert len(results_rows(run_dir)) == 1
    weights, last = run_dir / "weights" / "best.pt", "\n".join(log_lines).splitlines()[-3:]
    assert last[0].startswith(f"Trained weights: {weights}  (mAP50 ")  # the run ends with what to do next
    assert last[1] == f"Next:  python val.py --weights {weights} --data {shapes_data} --imgsz 96"
    assert last[2].strip().startswith(f"python detect.py --weights {weights} --source ")


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_loadable_checkpoint_and_resume_finishes(shapes_data, tiny_cfg, tmp_path):
    cmd = [sys.executable, "train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
           "--batch-size", "2", "--epochs", "2", "--workers", "0", "--device", "cpu", "--noplots",
           "--project", str(tmp_path), "--name", "exp"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # the handler is installed when this line is printed; 16 batches remain
        seen.append(line)
        if line.startswith("Starting training"):
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    out = "".join(seen) + out
    assert proc.returncode == 128 + signal.SIGTERM, out
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert f"--resume {last}" in out
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["optimizer"] is not None and ckpt["next_position"] < [2, 0]
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(last)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert [r["epoch"] for r in results_rows(tmp_path / "exp")] == ["0", "1"]


@pytest.mark.slow
def test_resume_reports_conflicting_flags_and_keeps_the_checkpoints(finished_run, tmp_path, log_lines):
    copy = tmp_path / "copy"
    (copy / "weights").mkdir(parents=True)
    (copy / "weights" / "last.pt").write_bytes((finished_run / "weights" / "epoch0.pt").read_bytes())
    opt, ckpt = train.resume_options(train.parse_opt(["--resume", str(copy / "weights" / "last.pt"),
                                                      "--epochs", "9"]),
                                     argv=["--resume", str(copy / "weights" / "last.pt"), "--epochs", "9"])
    assert opt.epochs == 2 and ckpt["next_position"] == [1, 0]
    assert "--epochs 9 conflicts with the checkpoint's 2; the checkpoint's value is used" in "\n".join(log_lines)


@pytest.mark.slow
def test_resume_may_change_patience_but_not_to_a_bad_value(finished_run, tmp_path, log_lines):
    last = tmp_path / "copy" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes((finished_run / "weights" / "epoch0.pt").read_bytes())
    argv = ["--resume", str(last), "--patience", "0"]
    opt, _ = train.resume_options(train.parse_opt(argv), argv=argv)
    assert opt.patience == 0 and "conflicts" not in "\n".join(log_lines)
    for flag, value, rule in [("--patience", "-1", "must be 0 or more"), ("--save-interval", "-5.0", "must be 0 or more"),
                              ("--workers", "-2", "must be 0 or more")]:
        argv = ["--resume", str(last), flag, value]
        with pytest.raises(UserError, match=f"^{flag} {value}: {rule}$"):
            train.resume_options(train.parse_opt(argv), argv=argv)
    assert last.read_bytes() == (finished_run / "weights" / "epoch0.pt").read_bytes()


@pytest.mark.slow
def test_resume_gives_flags_newer_than_the_checkpoint_their_defaults(finished_run, tmp_path):
    from utils.training.checkpoints import save_checkpoint

    ckpt = torch.load(finished_run / "weights" / "epoch0.pt", weights_only=True)
    del ckpt["opt"]["reduced_decode"]  # as written before --reduced-decode existed
    last = tmp_path / "old" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    save_checkpoint(ckpt, last)
    opt, _ = train.resume_options(train.parse_opt(["--resume", str(last)]), argv=["--resume", str(last)])
    assert opt.reduced_decode is False and opt.epochs == 2


def test_failed_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch, log_lines):
    from utils.training import run_state

    saver = run_state.CheckpointSaver(tmp_path / "last.pt", tmp_path / "best.pt", tmp_path)
    state = {"model_cfg": {}, "model": {"w": torch.ones(2)}, "next_position": [1, 0]}
    assert saver.save_last(state)
    before = (tmp_path / "last.pt").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_state, "save_checkpoint", disk_full)
    assert not saver.save_last({"model_cfg": {}, "model": {"w": torch.zeros(2)}, "next_position": [2, 0]})
    assert "(No space left on device); last.pt still holds after epoch 0, 1 epoch behind" in "\n".join(log_lines)
    assert (tmp_path / "last.pt").read_bytes() == before


@pytest.mark.slow
def test_evolve_runs_generations_and_writes_results(shapes_data, tiny_cfg, tmp_path):
    train.run(cfg=str(tiny_cfg), data=str(shapes_data), imgsz=64, batch_size=8, epochs=1, workers=0,
              device="cpu", evolve=2, project=str(tmp_path), name="evo", exist_ok=True)
    evolve_dir = tmp_path / "evo"
    rows = (evolve_dir / "evolve.csv").read_text().strip().splitlines()
    assert len(rows) == 3  # header + 2 generations
    assert (evolve_dir / "hyp_evolve.yaml").is_file() and (evolve_dir / "evolve.png").is_file()
    train.run(cfg=str(tiny_cfg), data=str(shapes_data), imgsz=64, batch_size=8, epochs=1, workers=0,
              device="cpu", evolve=1, project=str(tmp_path), name="evo", exist_ok=True)
    assert len((evolve_dir / "evolve.csv").read_text().strip().splitlines()) == 4  # continued, not restarted
    assert sorted(p.name for p in evolve_dir.glob("gen*")) == ["gen0", "gen1", "gen2"]


@pytest.mark.slow
def test_every_loader_of_a_run_honours_workers(tmp_path, tiny_cfg, shapes_data, monkeypatch):
    """The validation loader and the final validation too: a --workers 1 run asks no loader for more than 1
    (each loader then runs in the main process, to keep the test fast)."""
    import val
    from utils import dataloaders

    asked = []

    def create_dataloader(*args, workers=8, **kwargs):
        asked.append(workers)
        return dataloaders.create_dataloader(*args, workers=0, **kwargs)

    monkeypatch.setattr(train, "create_dataloader", create_dataloader)
    monkeypatch.setattr(val, "create_dataloader", create_dataloader)
    train_run(tmp_path, shapes_data, tiny_cfg, epochs=1, workers=1, noplots=True)
    assert asked == [1, 1, 1]  # training, validation each epoch, final validation
