"""Weights loading, TTA, val.py and detect.py end to end on generated data (CPU, 64 px)."""

import copy
import csv
import itertools
import json
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import torch
from torch import nn

import detect
import export
import val
from models.experimental import Ensemble, attempt_load, tta_forward
from tests.support.checkpoints import NAMES, confident_model, write_checkpoint
from utils.dataset.data_config import check_dataset
from utils.errors import UserError

@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_cfg):
    """(model, checkpoint path) for the confident tiny model, weights stored in fp16."""
    model = confident_model(tiny_cfg)
    return model, write_checkpoint(model, tmp_path_factory.mktemp("weights") / "tiny.pt")


@pytest.fixture(scope="module")
def loaded(trained):
    """The checkpoint loaded for inference (fused)."""
    return attempt_load(trained[1], device="cpu")


@pytest.mark.slow
def test_attempt_load_rebuilds_fuses_and_matches(trained, loaded):
    model, weights = trained
    assert loaded.names == NAMES
    assert torch.equal(loaded.stride, model.stride)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in loaded.modules()), "Conv+BN should be fused"
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    im = torch.rand(1, 3, 64, 64)
    reference = copy.deepcopy(model).half().float()(im)[0]  # same fp16-rounded weights, unfused
    assert torch.allclose(loaded(im)[0], reference, atol=1e-3, rtol=1e-3)
    unfused = attempt_load(weights, fuse=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in unfused.modules())


@pytest.mark.slow
def test_attempt_load_prefers_ema_and_builds_ensembles(trained, loaded, tmp_path):
    model, weights = trained
    ema_state = {k: v.clone() for k, v in model.state_dict().items()}
    ema_state["model.24.m.0.bias"] = ema_state["model.24.m.0.bias"] + 1.0
    with_ema = write_checkpoint(model, tmp_path / "ema.pt", ema=ema_state)
    ensemble = attempt_load([weights, with_ema])
    assert isinstance(ensemble, Ensemble) and ensemble.names == NAMES and ensemble.nc == 4
    ema_bias = ema_state["model.24.m.0.bias"]
    assert torch.allclose(ensemble[1].model[24].m[0].bias, ema_bias), "EMA weights win over 'model'"
    assert not torch.allclose(ensemble[0].model[24].m[0].bias, ema_bias)
    im = torch.rand(1, 3, 64, 64)
    assert ensemble(im)[0].shape[1] == 2 * loaded(im)[0].shape[1]


def test_attempt_load_errors_are_one_line(trained, tmp_path):
    model, _ = trained
    with pytest.raises(UserError, match="not found"):
        attempt_load(tmp_path / "missing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is not a checkpoint" * 10)
    with pytest.raises(UserError, match="corrupt.pt") as err:
        attempt_load(corrupt)
    assert "\n" not in str(err.value)
    not_ckpt = tmp_path / "list.pt"
    torch.save([1, 2, 3], not_ckpt)
    with pytest.raises(UserError, match="not a checkpoint"):
        attempt_load(not_ckpt)
    state = model.state_dict()
    state["model.24.m.0.weight"] = torch.zeros(3, 3, 1, 1)
    misfit = write_checkpoint(model, tmp_path / "misfit.pt", model=state)
    with pytest.raises(UserError, match="do not fit.*model.24.m.0.weight"):
        attempt_load(misfit)
    with pytest.raises(UserError, match="--weights"):
        attempt_load([])


class _BrightSquareModel(nn.Module):
    """Fake detector: one 4x4 box at the centroid of the bright (> 0.9) pixels of each image."""

    stride = torch.tensor([8.0])

    def forward(self, x):
        bs, _, h, w = x.shape
        bright = (x.mean(1) > 0.9).float()  # above the 0.447 grey padding of scaled passes
        ys = torch.arange(h, dtype=torch.float32).view(1, h, 1) + 0.5
        xs = torch.arange(w, dtype=torch.float32).view(1, 1, w) + 0.5
        count = bright.sum((1, 2))
        cx, cy = (bright * xs).sum((1, 2)) / count, (bright * ys).sum((1, 2)) / count
        pred = torch.stack((cx, cy, torch.full_like(cx, 4), torch.full_like(cx, 4), torch.ones_like(cx)), 1)
        return pred[:, None], None


def test_tta_maps_scaled_and_flipped_predictions_back():
    im = torch.zeros(1, 3, 64, 96)
    im[0, :, 18:24, 8:14] = 1.0  # centre (11, 21)
    pred, _ = tta_forward(_BrightSquareModel(), im)
    assert pred.shape == (1, 3, 5)
    assert torch.allclose(pred[0, :, 0], torch.full((3,), 11.0), atol=0.8), pred[0, :, 0]
    assert torch.allclose(pred[0, :, 1], torch.full((3,), 21.0), atol=0.8), pred[0, :, 1]


def _check_yolo_lines(files, with_conf):
    lines = [line.split() for f in files for line in f.read_text().splitlines()]
    assert lines, "expected at least one label line"
    for parts in lines:
        assert len(parts) == (6 if with_conf else 5)
        assert 0 <= int(parts[0]) < len(NAMES)
        values = [float(v) for v in parts[1:]]
        assert all(0.0 <= v <= 1.0 for v in values)
    return lines


@pytest.mark.slow
def test_val_end_to_end_writes_metrics_plots_labels_and_coco_json(trained, shapes_data, tmp_path):
    _, weights = trained
    result = val.run(
        shapes_data, weights=str(weights), batch_size=8, imgsz=64, device="cpu", workers=0, save_txt=True,
        save_conf=True, save_json=True, project=tmp_path, name="val", max_det=30)
    (mp, mr, map50, map_, *losses), maps, times = result.metrics, result.maps, result.times
    assert all(0.0 <= v <= 1.0 for v in (mp, mr, map50, map_)) and map50 >= map_
    assert losses == [0.0, 0.0, 0.0] and len(times) == 3 and maps.shape == (len(NAMES),)
    out = tmp_path / "val"
    for name in ("confusion_matrix.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png",
                 "val_batch0_labels.jpg", "val_batch0_pred.jpg"):
        assert (out / name).is_file(), name
    label_files = sorted((out / "labels").glob("*.txt"))
    assert len(label_files) == 8
    _check_yolo_lines(label_files, with_conf=True)
    predictions = json.loads((out / "tiny_predictions.json").read_text())
    ground_truth = json.loads((out / "ground_truth_coco.json").read_text())
    assert len(ground_truth["images"]) == 8 and ground_truth["annotations"]
    image_ids = {im["id"] for im in ground_truth["images"]}
    assert predictions and {p["image_id"] for p in predictions} <= image_ids
    assert {p["category_id"] for p in predictions} <= set(range(len(NAMES)))


def _busy_processes(n):
    """``n`` processes that spin on the CPU until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _jumping_clock(monkeypatch):
    """Every clock of the time module jumps an hour per reading, as on a badly overloaded machine."""
    for name in ("time", "perf_counter", "monotonic"):
        readings = itertools.count(0.0, 3600.0)
        monkeypatch.setattr(time, name, lambda readings=readings: next(readings))


@pytest.mark.slow
def test_val_metrics_are_the_same_on_an_idle_and_a_loaded_machine(trained, shapes_data, tmp_path, monkeypatch):
    _, weights = trained
    args = dict(weights=str(weights), batch_size=8, imgsz=64, device="cpu", workers=0, plots=False,
                project=tmp_path, max_det=30, conf_thres=0.001, save_txt=True, save_conf=True)
    idle = val.run(shapes_data, name="idle", **args)
    busy = _busy_processes(2)
    try:
        with monkeypatch.context() as patched:
            _jumping_clock(patched)
            loaded = val.run(shapes_data, name="loaded", **args)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    detections = {f.name: f.read_text() for f in sorted((tmp_path / "idle" / "labels").glob("*.txt"))}
    assert sum(text.count("\n") for text in detections.values()) >= 8, "needs detections a time limit could drop"
    assert {f.name: f.read_text() for f in sorted((tmp_path / "loaded" / "labels").glob("*.txt"))} == detections
    assert loaded.metrics == idle.metrics
    assert np.array_equal(loaded.maps, idle.maps)


def test_val_study_writes_one_row_of_metrics_and_times_per_size(trained, shapes_data, tmp_path, monkeypatch):
    _, weights = trained
    monkeypatch.setattr(val, "STUDY_SIZES", (64, 96))
    val.main(val.parse_opt(["--task", "study", "--data", str(shapes_data), "--weights", str(weights), "--device",
                            "cpu", "--workers", "0", "--batch-size", "8", "--max-det", "30", "--project",
                            str(tmp_path)]))
    rows = np.loadtxt(tmp_path / f"study_{shapes_data.stem}_tiny.txt", ndmin=2)
    direct = val.run(shapes_data, weights=str(weights), batch_size=8, imgsz=96, device="cpu", workers=0,
                     max_det=30, plots=False, project=tmp_path, name="direct")
    assert rows.shape == (2, 1 + 7 + 3) and rows[:, 0].tolist() == [64, 96]  # size, 7 metrics, 3 times
    assert np.allclose(rows[1, 1:8], direct.metrics, rtol=1e-3, atol=1e-4)  # %10.4g in the file
    assert (tmp_path / "study.png").is_file()


def test_val_with_live_model_keeps_it_unfused(trained, shapes_data, tmp_path):
    from utils.dataloaders import create_dataloader
    from utils.loss import ComputeLoss

    model = copy.deepcopy(trained[0])
    hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0}
    data = check_dataset(shapes_data)
    loader = create_dataloader(data["val"], 64, 8, 16, pad=0.5, rect=True, workers=0)[0]
    result = val.run(data, batch_size=8, imgsz=64, model=model, dataloader=loader, save_dir=tmp_path,
                     plots=False, compute_loss=ComputeLoss(model, hyp), half=True)
    results = result.metrics
    assert len(results) == 7 and all(np.isfinite(results)) and result.bands is None
    assert results[4] > 0 and results[5] > 0, "validation losses should be reported"
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert next(model.parameters()).dtype == torch.float32
    assert not list(tmp_path.glob("*.png")), "plots=False writes no plots"


def _make_media(folder):
    """Two still images of different sizes and a 6-frame 96 x 64 video at 5 fps."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(folder / "a.jpg"), rng.integers(0, 255, (80, 120, 3), dtype=np.uint8))
    cv2.imwrite(str(folder / "b.png"), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    writer = cv2.VideoWriter(str(folder / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5, (96, 64))
    for i in range(6):
        writer.write(np.full((64, 96, 3), 40 * i, dtype=np.uint8))
    writer.release()
    return folder


@pytest.mark.slow
def test_detect_end_to_end_images_and_video(trained, tmp_path):
    _, weights = trained
    source = _make_media(tmp_path / "media")
    detect.cli(["--weights", str(weights), "--source", str(source), "--imgsz", "64", "--device", "cpu",
                "--save-txt", "--save-conf", "--save-csv", "--save-crop", "--max-det", "3",
                "--project", str(tmp_path), "--name", "det"])
    out = tmp_path / "det"
    assert cv2.imread(str(out / "a.jpg")).shape == (80, 120, 3)
    assert cv2.imread(str(out / "b.png")).shape == (64, 64, 3)
    video = cv2.VideoCapture(str(out / "clip.mp4"))
    assert video.get(cv2.CAP_PROP_FPS) == pytest.approx(5.0)
    assert (video.get(cv2.CAP_PROP_FRAME_WIDTH), video.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (96, 64)
    assert int(video.get(cv2.CAP_PROP_FRAME_COUNT)) == 6
    video.release()

    label_names = sorted(f.name for f in (out / "labels").glob("*.txt"))
    assert label_names == ["a.txt", "b.txt"] + sorted(f"clip_{i}.txt" for i in range(1, 7))
    lines = _check_yolo_lines((out / "labels").glob("*.txt"), with_conf=True)
    assert len(lines) == 8 * 3, "max-det 3 on confident predictions gives 3 per frame"
    with open(out / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 24 and list(rows[0]) == detect.CSV_HEADER
    assert list(rows[0])[:3] == ["Image Name", "Prediction", "Confidence"]  # YOLOv5's columns, first
    assert all(NAMES[int(r["class"])] == r["Prediction"] for r in rows)
    assert all(0 < float(r["Confidence"]) <= 1 for r in rows)
    assert len(list((out / "crops").rglob("*.jpg"))) == 24


def test_detect_labels_without_conf_classes_filter_and_nosave(trained, tmp_path):
    _, weights = trained
    image = tmp_path / "one.jpg"
    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))
    model = attempt_load(weights)
    everything = detect.run(None, str(image), imgsz=(64,), model=model, save_txt=True, nosave=True,
                            project=tmp_path, name="all", max_det=50)
    lines = _check_yolo_lines([everything / "labels" / "one.txt"], with_conf=False)
    assert not (everything / "one.jpg").exists()
    found = sorted({int(parts[0]) for parts in lines})
    assert len(found) > 1, "the filter check below needs several classes"
    kept = found[-1]
    filtered = detect.run(None, str(image), imgsz=(64,), model=model, save_txt=True, nosave=True,
                          classes=[kept], project=tmp_path, name="one_class", max_det=50)
    lines = _check_yolo_lines([filtered / "labels" / "one.txt"], with_conf=False)
    assert {int(parts[0]) for parts in lines} == {kept}


def test_detect_rerun_with_exist_ok_replaces_labels_and_counts_only_its_own(trained, tmp_path, log_lines):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("a.jpg", "a.png", "b.jpg"):
        cv2.imwrite(str(source / name), np.full((64, 64, 3), 128, np.uint8))
    model = attempt_load(trained[1])
    options = dict(imgsz=(64,), model=model, save_txt=True, nosave=True, project=tmp_path, name="exp",
                   exist_ok=True, max_det=3, conf_thres=0.0)
    first = _labels(detect.run(None, str(source), **options))
    assert list(first) == ["a.jpg.txt", "a.png.txt", "b.txt"]
    (source / "b.jpg").unlink()
    log_lines.clear()
    second = _labels(detect.run(None, str(source), **options))
    assert all(np.array_equal(second[n], first[n]) for n in ("a.jpg.txt", "a.png.txt")), "labels were appended"
    assert "b.txt" in second  # the earlier run's file stays, but is not counted as this run's
    assert any(line.endswith(f"2 labels saved to {tmp_path / 'exp' / 'labels'}") for line in log_lines), log_lines


def test_detect_same_file_name_in_two_folders_keeps_both_images_and_labels(trained, tmp_path):
    for folder, shape in (("x", (64, 64)), ("y", (48, 64))):
        (tmp_path / folder).mkdir()
        cv2.imwrite(str(tmp_path / folder / "b.jpg"), np.full((*shape, 3), 128, np.uint8))
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path / 'x' / 'b.jpg'}\n{tmp_path / 'y' / 'b.jpg'}\n")
    out = detect.run(None, str(listing), imgsz=(64,), model=attempt_load(trained[1]), save_txt=True,
                     project=tmp_path, name="exp", max_det=3, conf_thres=0.0)
    assert sorted(f.name for f in out.glob("*.jpg")) == ["b.jpg", "b.jpg_2.jpg"]
    assert cv2.imread(str(out / "b.jpg")).shape[:2] == (64, 64)
    assert cv2.imread(str(out / "b.jpg_2.jpg")).shape[:2] == (48, 64)
    assert list(_labels(out)) == ["b.jpg.txt", "b.jpg_2.txt"]


def test_detect_video_frame_labels_do_not_collide_with_an_image_named_like_a_frame(trained, tmp_path, log_lines):
    source = tmp_path / "src"
    source.mkdir()
    cv2.imwrite(str(source / "clip_1.jpg"), np.full((64, 64, 3), 200, np.uint8))
    writer = cv2.VideoWriter(str(source / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5, (64, 64))
    for i in range(3):
        writer.write(np.full((64, 64, 3), 40 * i, dtype=np.uint8))
    writer.release()
    out = detect.run(None, str(source), imgsz=(64,), model=attempt_load(trained[1]), save_txt=True, nosave=True,
                     project=tmp_path, name="exp", max_det=2, conf_thres=0.0)
    labels = _labels(out)
    assert list(labels) == ["clip.mp4_1.txt", "clip.mp4_2.txt", "clip.mp4_3.txt", "clip_1.txt"]
    assert all(len(rows) == 2 for rows in labels.values())
    assert any(line.endswith("4 labels saved to " + str(out / "labels")) for line in log_lines)


def _labels(folder):
    """{label file name: rows as float arrays} of a detect run's labels/ folder."""
    return {f.name: np.loadtxt(f, ndmin=2) for f in sorted((folder / "labels").glob("*.txt"))}


@pytest.mark.slow
def test_detect_batches_give_the_same_detections_as_one_at_a_time(trained, tmp_path):
    _, weights = trained
    source = tmp_path / "media"
    source.mkdir()
    rng = np.random.default_rng(1)
    for i, shape in enumerate([(64, 64), (64, 64), (48, 64), (64, 64), (64, 64), (64, 64)]):
        cv2.imwrite(str(source / f"{i}.png"), rng.integers(0, 255, (*shape, 3), dtype=np.uint8))
    runs = {}
    for batch in (1, 3):
        runs[batch] = _labels(detect.run(str(weights), str(source), imgsz=(64,), device="cpu", save_txt=True,
                                         save_conf=True, nosave=True, project=tmp_path, name=f"b{batch}",
                                         batch_size=batch, max_det=20))
    assert list(runs[1]) == [f"{i}.txt" for i in range(6)]
    assert list(runs[3]) == list(runs[1])
    for name, rows in runs[1].items():
        batched = runs[3][name]
        assert rows.shape == batched.shape and len(rows), name
        assert np.array_equal(rows[:, 0], batched[:, 0]), f"{name}: classes differ"
        assert np.abs(rows[:, 1:5] - batched[:, 1:5]).max() * 64 <= 1.0, f"{name}: boxes differ by > 1 px"
        assert np.allclose(rows[:, 5], batched[:, 5], atol=1e-4), f"{name}: confidences differ"


def test_frame_batches_group_consecutive_frames_of_one_shape():
    shapes = [(3, 64, 64)] * 4 + [(3, 48, 64)] + [(3, 64, 64)] * 2

    class Source:
        mode, frame = "image", 0

        def __iter__(self):
            for i, shape in enumerate(shapes):
                yield f"{i}.jpg", np.zeros(shape, np.uint8), np.zeros((1, 1, 3), np.uint8), None, f"image {i}: "

    batches = list(detect.frame_batches(Source(), 3))
    assert [[f.path for f in b] for b in batches] == [["0.jpg", "1.jpg", "2.jpg"], ["3.jpg"], ["4.jpg"],
                                                      ["5.jpg", "6.jpg"]]
    assert all(f.fps == 0 and f.frame == 0 for b in batches for f in b)


def test_auto_batch_size_batches_small_inputs_on_cpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert detect.auto_batch_size(cpu, [256, 256]) == 8
    assert detect.auto_batch_size(cpu, [64, 64]) == 8, "capped at 8"
    assert detect.auto_batch_size(cpu, [320, 320]) == 5
    assert detect.auto_batch_size(cpu, [640, 640]) == 1
    assert detect.auto_batch_size(cpu, [1280, 1280]) == 1
    assert detect.auto_batch_size(cuda, [1280, 1280]) == 8


def test_pytorch_backend_runs_channels_last_with_the_same_predictions(trained):
    from models.backends import load_backend

    _, weights = trained
    backend = load_backend(weights, device="cpu")
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in backend.parameters() if p.dim() == 4)
    plain = attempt_load(weights, device="cpu")
    im = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(backend(im)[0], plain(im)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args, message", [
    (["--source", "99"], "no camera with index 99"),
    (["--source", "does/not/exist.jpg"], "--source does/not/exist.jpg: no such file or folder; pass an image"),
    (["--source", "https://example.com/a.jpg"], "--source https://example.com/a.jpg: URLs and streams are not opened"),
    (["--source", "rtsp://camera.local/live"], "--source rtsp://camera.local/live: URLs and streams are not opened"),
    (["--source", "screen"], "--source screen: screen capture is not supported"),
    (["--source", "{media}", "--data", "{bad_data}"], "must list 4 class names"),
    (["--source", "{media}", "--batch-size", "-1"], "--batch-size -1"),
    (["--source", "{media}", "--classes", "0", "7"], "--classes 0 7: the model has 4 classes; give class indices from 0 to 3"),
])
def test_detect_user_errors_exit_with_one_line(trained, tmp_path, capsys, args, message):
    _, weights = trained
    media = _make_media(tmp_path / "media")
    bad_data = tmp_path / "bad.yaml"
    bad_data.write_text("names: [one, two]\n")
    args = [a.format(media=media, bad_data=bad_data) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        detect.cli(["--weights", str(weights), "--device", "cpu", "--imgsz", "64", "--project", str(tmp_path), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR:") and message in err[0]
    assert not any(tmp_path.glob("exp*")), "a refused command line leaves no run folder"


@pytest.mark.parametrize("imgsz", ["64", 0, 64.5])
def test_python_run_refuses_an_image_size_that_is_not_a_positive_int(trained, shapes_data, tmp_path, imgsz):
    """From Python, detect.run(imgsz="64") used to letterbox to 32 px (the string split into digits)."""
    _, weights = trained
    with pytest.raises(UserError, match=r"^--imgsz .*: expected a positive integer or a list of them$"):
        detect.run(weights, str(shapes_data.parent), imgsz=imgsz, device="cpu", project=tmp_path)
    with pytest.raises(UserError, match=r"^--imgsz .*: expected a positive integer or a list of them$"):
        val.run(str(shapes_data), weights=weights, imgsz=imgsz, device="cpu", project=tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [({"task": "bogus"}, r"^--task 'bogus': choose from train, val, test"),
                                             ({"batch_size": 0}, r"^--batch-size 0: must be a positive integer$")])
def test_val_run_applies_the_command_lines_rules(trained, shapes_data, tmp_path, options, message):
    """From Python an unknown task used to validate the val split silently, and batch size 0 divided by zero."""
    _, weights = trained
    with pytest.raises(UserError, match=message):
        val.run(str(shapes_data), weights=weights, imgsz=64, device="cpu", project=tmp_path, **options)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    ({"vid_stride": 0}, r"^--vid-stride 0: must be a positive integer$"),
    ({"line_thickness": "x"}, r"^--line-thickness 'x': must be a positive integer$"),
    ({"batch_size": -1}, r"^--batch-size -1: must be 0 or more$"),
    ({"max_det": 2.5}, r"^--max-det 2\.5: must be a positive integer$"),
    ({"slice_size": 32, "slice_merge": "x"}, r"^--slice-merge 'x': choose from nms, nmm$"),
])
def test_detect_run_applies_the_command_lines_rules(trained, shapes_data, tmp_path, options, message):
    """From Python these were accepted (vid_stride 0, line_thickness 'x', batch_size -1, slice_merge 'x') or
    failed after the run folder was made."""
    _, weights = trained
    with pytest.raises(UserError, match=message):
        detect.run(weights, str(shapes_data.parent / "shapes" / "images" / "val"), imgsz=64, device="cpu",
                   project=tmp_path, **options)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    ({"workers": -1}, r"^--workers -1: must be 0 or more$"),
    ({"batch_size": True}, r"^--batch-size True: must be a positive integer$"),
    ({"slice_size": 32, "slice_merge": "x"}, r"^--slice-merge 'x': choose from nms, nmm$"),
])
def test_val_run_applies_the_rest_of_the_command_lines_rules(trained, shapes_data, tmp_path, options, message):
    """workers=-1 reached the DataLoader's ValueError; slice_merge='x' failed after the run folder was made."""
    _, weights = trained
    with pytest.raises(UserError, match=message):
        val.run(str(shapes_data), weights=weights, imgsz=64, device="cpu", project=tmp_path, **options)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    ({"conf_thres": 2}, r"^--conf-thres 2: must be a number between 0\.0 and 1\.0$"),
    ({"iou_thres": -0.5}, r"^--iou-thres -0\.5: must be a number between 0\.0 and 1\.0$"),
    ({"reduced_decode": "no"}, r"^val\.run: reduced_decode='no': expected True or False$"),
    ({"save_txt": 1}, r"^val\.run: save_txt=1: expected True or False$"),
])
def test_val_run_refuses_thresholds_and_switches_before_the_run_folder(trained, shapes_data, tmp_path, options,
                                                                     message):
    """Thresholds were checked inside NMS, after the run folder was made; reduced_decode='no' turned the option
    on (train.run refuses it)."""
    _, weights = trained
    with pytest.raises(UserError, match=message):
        val.run(str(shapes_data), weights=weights, imgsz=64, device="cpu", project=tmp_path, **options)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("weights", [None, 123, [], [None]])
def test_weights_that_name_no_file_are_one_line_from_python(shapes_data, tmp_path, weights):
    """val.run(weights=None), detect.run(None, ...) and export.run(None) used to end in "'NoneType' object is not
    iterable"."""
    message = r"^--weights .*: no weights file given; pass a checkpoint such as runs/train/exp/weights/best\.pt$"
    with pytest.raises(UserError, match=message):
        val.run(str(shapes_data), weights=weights, imgsz=64, device="cpu", project=tmp_path)
    with pytest.raises(UserError, match=message):
        detect.run(weights, str(shapes_data.parent), imgsz=64, device="cpu", project=tmp_path)
    with pytest.raises(UserError, match=message):
        export.run(weights, imgsz=64, include="onnx")
    assert not any(tmp_path.iterdir())


def test_task_speed_times_square_letterboxed_batches_and_the_splits_rectangular_ones(trained, shapes_data):
    """As YOLOv5: --task speed pads every image to imgsz x imgsz; it used to be turned into 'val' first."""
    model, _ = trained
    data = check_dataset(str(shapes_data))
    speed = val._validation_loader(data, "speed", 64, 4, model, "cpu", False, 0).dataset
    split = val._validation_loader(data, "val", 64, 4, model, "cpu", False, 0).dataset
    assert (speed.rect, split.rect) == (False, True)
    assert speed.im_files == split.im_files


def test_val_cli_corrupt_weights_is_a_clear_error(shapes_data, tmp_path, capsys):
    corrupt = tmp_path / "broken.pt"
    corrupt.write_bytes(b"\x00" * 64)
    with pytest.raises(SystemExit) as exit_info:
        val.cli(["--data", str(shapes_data), "--weights", str(corrupt), "--device", "cpu", "--project",
                 str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.pt" in err[0] and "checkpoint" in err[0]
