"""Out of memory in training, validation, detection and AutoBatch: one ERROR line naming batch size, image size,
device and what to try; exit code 1, no traceback; checkpoints already written stay complete and resumable.

The allocator fails on purpose: the step raises what PyTorch raises when an allocation fails (CUDA's
``OutOfMemoryError``, the CPU allocator's ``RuntimeError``).
"""

import sys

import cv2
import numpy as np
import pytest
import torch

import detect
import train
import val
from models.yolo import Model
from utils import autobatch
from utils.dataset import image_cache, label_cache
from utils.errors import OutOfMemory
from utils.out_of_memory import VAL_ADVICE, out_of_memory_anywhere, out_of_memory_hint
from utils.training.checkpoints import load_checkpoint, save_checkpoint

FAILURES = {
    "cpu": lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate "
                                "memory: you tried to allocate 419430400 bytes. Error code 12"),
    "cuda": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 400.00 MiB. GPU 0 has a total "
                                           "capacity of 79.19 GiB of which 2.06 MiB is free."),
}


def failing(original, kind: str, after: int = 0):
    """``original``, whose allocation fails on call number ``after + 1`` and later."""
    calls = []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise FAILURES[kind]()
        return original(*args, **kwargs)

    return step


def _one_line_exit_1(capsys, func, argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        func(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "it/s]" not in line
           and "s/it]" not in line and not line.lstrip().startswith(("Class", "val: ", "train: "))]
    assert exit_info.value.code == 1, err
    assert len(err) == 1 and err[0].startswith("ERROR: out of memory in "), "\n".join(err)
    return err[0]


@pytest.fixture
def tiny_weights(tmp_path, tiny_cfg):
    torch.manual_seed(0)
    model = Model(str(tiny_cfg), nc=4)
    path = tmp_path / "tiny.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": ["circle", "square", "triangle", "cross"],
                     "model": model.state_dict(), "ema": None}, path)
    return path


@pytest.mark.slow
def test_training_out_of_memory_after_a_saved_epoch_keeps_it_resumable(tmp_path, tiny_cfg, shapes_data, capsys,
                                                                       monkeypatch):
    nb = 2  # 16 training images at --batch-size 8: the first step of epoch 1 is call 3
    monkeypatch.setattr(train.TrainLoop, "train_step", failing(train.TrainLoop.train_step, "cpu", after=nb))
    project = tmp_path / "runs"
    monkeypatch.setattr(sys, "argv", ["train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
                                      "--epochs", "2", "--batch-size", "8", "--device", "cpu", "--workers", "0",
                                      "--project", str(project), "--noplots"])
    line = _one_line_exit_1(capsys, lambda argv: train.cli(), None)
    assert "out of memory in training (batch size 8, image size 64, device cpu)" in line
    assert "--batch-size" in line and "--imgsz" in line and "--cache disk" in line and "--workers" in line
    assert f"On disk in {project / 'exp' / 'weights'}: last.pt after epoch 0 (resumable)" in line
    ckpt = load_checkpoint(project / "exp" / "weights" / "last.pt")
    assert ckpt["next_position"] == [1, 0] and ckpt["optimizer"] is not None and not ckpt.get("finished")


@pytest.mark.parametrize("kind", FAILURES)
def test_validation_out_of_memory_is_one_line(kind, tiny_weights, shapes_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(val, "_predict_batch", failing(val._predict_batch, kind))
    line = _one_line_exit_1(capsys, val.cli, ["--weights", str(tiny_weights), "--data", str(shapes_data),
                                              "--imgsz", "64", "--batch-size", "4", "--device", "cpu",
                                              "--workers", "0", "--project", str(tmp_path / "runs")])
    assert "out of memory in validation (batch size 4, image size 64, device cpu): try a smaller --batch-size" in line


@pytest.mark.parametrize("kind", FAILURES)
def test_detection_out_of_memory_is_one_line(kind, tiny_weights, shapes_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(detect, "predict_frames", failing(detect.predict_frames, kind))
    source = shapes_data.parent / "shapes" / "images" / "val"
    line = _one_line_exit_1(capsys, detect.cli, ["--weights", str(tiny_weights), "--source", str(source),
                                                 "--imgsz", "64", "--batch-size", "2", "--device", "cpu",
                                                 "--project", str(tmp_path / "runs")])
    assert "out of memory in detection (batch size 2, image size [64, 64], device cpu)" in line


def test_autobatch_whose_smallest_trial_does_not_fit_is_the_out_of_memory_line(tiny_cfg, monkeypatch):
    """Before, AutoBatch fell back to batch 16, which fits even less than the batch 1 that failed."""
    model = Model(str(tiny_cfg), nc=4)
    monkeypatch.setattr(autobatch, "trial_step", failing(autobatch.trial_step, "cuda"))

    def measure(step, device):  # _cuda_peak_gib without the CUDA calls: None when the step runs out of memory
        try:
            step()
            return 1.0
        except torch.OutOfMemoryError:
            return None

    with pytest.raises(OutOfMemory, match=r"out of memory in AutoBatch \(batch size 1, image size 64, device cpu\): "
                                          r"try a smaller --imgsz"):
        autobatch.profile_or_fail(model, 64, False, None, measure)


def test_other_errors_pass_through_the_hint():
    with pytest.raises(RuntimeError, match="shape mismatch"), out_of_memory_hint("training", 8, 64, "cpu"):
        raise RuntimeError("shape mismatch")
    with pytest.raises(OutOfMemory, match="batch size 8"), out_of_memory_hint("training", 8, 64, "cpu"):
        raise MemoryError()


OPENCV_FAILURE = ("OpenCV(5.1.0) /io/opencv/modules/core/src/alloc.cpp:73: error: (-4:Insufficient memory) "
                  "Failed to allocate 4800000000 bytes in function 'OutOfMemoryError'\n")  # under ulimit -v


def numpy_failure(*args, **kwargs):
    np.empty(1 << 60, np.uint8)  # NumPy's own _ArrayMemoryError, a MemoryError


def test_opencv_and_numpy_out_of_memory_are_recognised_and_other_opencv_errors_pass():
    with pytest.raises(OutOfMemory, match="batch size 8"), out_of_memory_hint("training", 8, 64, "cpu"):
        raise cv2.error(OPENCV_FAILURE)
    with pytest.raises(cv2.error, match="Bad argument"), out_of_memory_hint("training", 8, 64, "cpu"):
        raise cv2.error("OpenCV(5.1.0) resize.cpp:4208: error: (-5:Bad argument) in function 'resize'")
    with pytest.raises(OutOfMemory, match=r"out of memory in val.py \(Unable to allocate .*\): try a smaller"):
        with out_of_memory_anywhere("val.py", VAL_ADVICE):
            numpy_failure()


@pytest.mark.slow
def test_opencv_out_of_memory_while_loading_a_training_image_is_one_line(tmp_path, tiny_cfg, shapes_data, capsys,
                                                                          monkeypatch):
    def read_image(*args, **kwargs):
        raise cv2.error(OPENCV_FAILURE)

    monkeypatch.setattr(image_cache, "read_image", read_image)
    monkeypatch.setattr(sys, "argv", ["train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
                                      "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--workers", "0",
                                      "--project", str(tmp_path), "--noplots"])
    line = _one_line_exit_1(capsys, lambda argv: train.cli(), None)
    assert "out of memory in training (batch size 8, image size 64, device cpu): try a smaller --batch-size" in line


def test_numpy_out_of_memory_in_the_data_scan_is_one_line(tiny_weights, shapes_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(label_cache, "_cached_scan", numpy_failure)
    line = _one_line_exit_1(capsys, val.cli, ["--weights", str(tiny_weights), "--data", str(shapes_data),
                                              "--imgsz", "64", "--device", "cpu", "--project", str(tmp_path)])
    assert line.startswith("ERROR: out of memory in val.py (Unable to allocate") and "--batch-size" in line
