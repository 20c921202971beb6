"""Run a trained detector on images, folders, globs, .txt lists, videos or a webcam (YOLOv5's flags).

Usage:
    python detect.py --weights best.pt --source img.jpg          # one image
    python detect.py --weights best.pt --source path/to/folder/  # every image and video inside
    python detect.py --weights best.pt --source 'images/*.jpg'   # glob
    python detect.py --weights best.pt --source list.txt         # one path per line
    python detect.py --weights best.pt --source clip.mp4         # video (written at its own fps and size)
    python detect.py --weights best.pt --source 0                # webcam 0, if a camera is attached
    python detect.py --weights best.pt --source big/ --slice 640 # sliced inference for large images
    python detect.py --weights best.pt --source img.jpg --visualize  # every layer's feature maps, in img/
"""

import argparse
import contextlib
import csv
import errno
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from models.backends import InferenceBackend, PyTorchBackend, load_backend  # noqa: E402
from models.experimental import eval_forward  # noqa: E402
from utils.batch_invariance import aligned_batch_size, eval_micro_batch, run_batch_invariant  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.user_modules import load_user_modules  # noqa: E402
from utils.feature_maps import recorded_layer_outputs, save_feature_maps  # noqa: E402
from utils.files import increment_path, yaml_load  # noqa: E402
from utils.logging import LOGGER, log_speed_and_outputs  # noqa: E402
from utils.options import (DETECT_UPSTREAM_FLAGS, OneLineErrorParser, OptionRules, add_shared_flags,  # noqa: E402
                           check_options, find_repo_file)
from utils.ops import (check_class_filter, check_img_size, non_max_suppression, scale_boxes, size_list,
                       yolo_label_lines)  # noqa: E402
from utils.out_of_memory import DETECT_ADVICE, out_of_memory_anywhere, out_of_memory_hint  # noqa: E402
from utils.plots import Annotator, colors, save_one_box  # noqa: E402
from utils.slicing import add_slice_arguments, sliced_predictor  # noqa: E402
from utils.stop_signals import exit_on_stop_signal  # noqa: E402
from utils.dataset.sources import LoadImages, Webcam  # noqa: E402
from utils.torch_utils import select_device, time_sync  # noqa: E402

# YOLOv5's --save-csv columns ("Image Name", "Prediction", "Confidence"), so scripts that read its file read this
# one, then the frame, the class index and the box (xyxy, original pixels)
CSV_HEADER = ["Image Name", "Prediction", "Confidence", "frame", "class", "x1", "y1", "x2", "y2"]


class VideoSink:
    """Writes annotated frames to one mp4 (mp4v) per input video, at the input's fps and frame size."""

    def __init__(self):
        self.path, self.writer = None, None

    def write(self, save_path, frame, fps):
        if save_path != self.path:
            self.release()
            h, w = frame.shape[:2]
            self.path = save_path
            self.writer = cv2.VideoWriter(str(Path(save_path).with_suffix(".mp4")), cv2.VideoWriter_fourcc(*"mp4v"),
                                          fps if fps > 0 else 30, (w, h))
        self.writer.write(frame)

    def release(self):
        if self.writer is not None:
            self.writer.release()
        self.path, self.writer = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()  # also on Ctrl-C or an error: the frames written so far stay a playable video
        return False


class SourceSummary:
    """Detections per class and time per frame: per video when it ends, and for the whole --source."""

    def __init__(self, names):
        self.names = names
        self.total, self.total_frames, self.total_seconds = Counter(), 0, 0.0
        self.video, self.counts, self.frames, self.seconds = None, Counter(), 0, 0.0

    def add(self, path, classes, seconds, is_video):
        if path != self.video:
            self.end_video()
        classes = [int(c) for c in classes]
        self.total.update(classes)
        self.total_frames += 1
        self.total_seconds += seconds
        if is_video:
            self.video = path
            self.counts.update(classes)
            self.frames += 1
            self.seconds += seconds

    def _line(self, label, counts, frames, seconds):
        found = ", ".join(f"{n} {self.names[c]}" for c, n in sorted(counts.items())) or "no detections"
        return f"Summary {label}: {found}; {frames} frame(s), {seconds / max(frames, 1) * 1e3:.1f}ms per frame"

    def end_video(self):
        if self.video is not None:
            LOGGER.info(self._line(self.video, self.counts, self.frames, self.seconds))
        self.video, self.counts, self.frames, self.seconds = None, Counter(), 0, 0.0

    def finish(self, source):
        self.end_video()
        LOGGER.info(self._line(f"--source {source}", self.total, self.total_frames, self.total_seconds))


def class_names(model, data, classes=None):
    """Names from ``--data`` (when given, and its count must match the model) or from the checkpoint; ``classes``
    (``--classes``), when given, must index them (checked before the run folder is made)."""
    names = list(model.names)
    if data:
        data_names = yaml_load(find_repo_file(data, "--data")).get("names")  # a bare name: data/NAME, as YOLOv5
        data_names = list(data_names.values()) if isinstance(data_names, dict) else data_names
        if not isinstance(data_names, list) or len(data_names) != len(names):
            raise UserError(f"--data {data}: 'names' must list {len(names)} class names to match the weights")
        names = [str(n) for n in data_names]
    if classes is not None:
        check_class_filter(classes, len(names))
    return names


def open_source(source, imgsz, stride, vid_stride):
    """A webcam for a numeric ``source``, otherwise LoadImages (image, folder, glob, .txt list, video)."""
    if str(source).isnumeric():
        return Webcam(int(source), imgsz, stride, vid_stride)
    return LoadImages(source, img_size=imgsz, stride=stride, auto=True, vid_stride=vid_stride)


def label_stems(files, videos=()) -> dict:
    """A distinct label-file stem for each source file: its stem, or its full name when stems collide.

    ``a.jpg`` alone gives ``a``; ``a.jpg`` and ``a.png`` in one source give ``a.jpg`` and ``a.png``
    (labels ``a.jpg.txt``, ``a.png.txt``); a name still taken (same name in two folders) gets ``_2``, ``_3``...
    in source order. Annotated images and videos take the same stem plus the source suffix (``b.jpg``, then
    ``b.jpg_2.jpg``; see :func:`save_path_for`), so no output overwrites another. Frames of a video
    in ``videos`` are labelled ``STEM_FRAME``; when an image's stem already has that form (``clip_1.jpg``
    next to ``clip.mp4``) the video uses its full name (``clip.mp4_1.txt``).
    """
    counts = Counter(Path(f).stem for f in files)
    frame_like = {Path(f).stem.rsplit("_", 1)[0] for f in files
                  if f not in videos and re.fullmatch(r".+_\d+", Path(f).stem)}
    stems, used = {}, set()
    for f in files:
        p = Path(f)
        unique = counts[p.stem] == 1 and not (f in videos and p.stem in frame_like)
        candidate = p.stem if unique else p.name
        stem, n = candidate, 1
        while stem in used:
            n += 1
            stem = f"{candidate}_{n}"
        used.add(stem)
        stems[f] = stem
    return stems


def save_path_for(save_dir, path, mode, frame, stems):
    """Output image/video path and label-file stem for one frame (``stems``: see :func:`label_stems`).

    The output keeps the source's name unless its label stem was made distinct (``a.jpg`` -> ``a.jpg``,
    ``b.jpg`` in a second folder -> ``b.jpg_2.jpg``)."""
    p = Path(path)
    stem = stems.get(path, p.stem)
    name = p.name if stem in (p.stem, p.name) else f"{stem}{p.suffix}"
    return save_dir / name, save_dir / "labels" / (stem if mode == "image" else f"{stem}_{frame}")


def write_labels(det, im0_shape, save_conf, file):
    """Write ``file.txt``: YOLO-format labels of one frame's (n, 6) detections, normalised to the original image.

    The file is replaced, not appended to: each frame has its own file, and a rerun with --exist-ok
    must not add its rows to the earlier run's."""
    with open(f"{file}.txt", "w") as f:
        f.writelines(yolo_label_lines(det, im0_shape, save_conf))


def show(window, frame):
    """Display ``frame``; OpenCV builds without GUI support give a clear error."""
    try:
        cv2.imshow(window, frame)
        cv2.waitKey(1)
    except cv2.error:
        raise UserError("--view-img: this OpenCV build cannot open windows (headless); "
                        "drop --view-img and look at the saved results instead") from None


def annotate(im0, det, names, line_thickness, hide_labels, hide_conf):
    """Draw (n, 6) detections on a copy of BGR ``im0``; returns the annotated copy."""
    label_text = [names[int(c)] for c in det[:, 5]]
    annotator = Annotator(im0.copy(), line_width=line_thickness, pil=not all(s.isascii() for s in label_text))
    for (*xyxy, conf, cls), name in zip(det.tolist(), label_text):
        label = None if hide_labels else (name if hide_conf else f"{name} {conf:.2f}")
        annotator.box_label(xyxy, label or "", color=colors(int(cls), bgr=True))
    return annotator.result()


class Frame(NamedTuple):
    """One frame read from the source, with what is needed to write its outputs."""

    path: str
    im: np.ndarray  # letterboxed (3, h, w) RGB uint8
    im0: np.ndarray  # original BGR
    fps: float  # the video's frame rate (0 for images), read before the capture is released
    text: str  # the log line's prefix
    frame: int
    mode: str


def auto_batch_size(device, imgsz) -> int:
    """Frames per forward pass for ``--batch-size 0``: 8 on CUDA; on CPU as many as fit in 8 x 256^2 pixels.

    On CPU batching paid for small inputs (YOLOv5n at 256 px: 2.0x per image at batch 8) and lost
    for large ones (FFCA-YOLO at 640 px: 0.83x), where one image's activations already fill the caches; the
    model now runs a fixed number of frames per pass whatever the batch (utils/batch_invariance.py), so the
    batch only groups frames, and :func:`frames_per_batch` rounds it up to whole passes.
    """
    if device.type == "cuda":
        return 8
    return int(min(8, max(1, 8 * 256 * 256 // (imgsz[0] * imgsz[1]))))


def frames_per_batch(batch_size: int, device, imgsz, visualizing: bool, fixed_shape=None) -> int:
    """``--batch-size``, or :func:`auto_batch_size` for 0, rounded up to whole forward passes: batches cut from the
    start of each run of one shape then split into passes that hold the same frames at any batch size
    (utils/batch_invariance.py). With --visualize one forward pass's frames, because the feature maps are those of
    a batch's first pass. ``fixed_shape``: a static export's ``(batch, h, w)``, which sets the pass."""
    micro_batch = eval_micro_batch(device, fixed_shape)
    if visualizing:
        return micro_batch
    return aligned_batch_size(batch_size or auto_batch_size(device, imgsz), micro_batch)


def frame_batches(dataset, batch_size: int):
    """Consecutive frames of one letterboxed shape, at most ``batch_size`` per list (always 1 for a webcam)."""
    batch_size = 1 if isinstance(dataset, Webcam) else batch_size
    batch = []
    for path, im, im0, cap, text in dataset:
        fps = cap.get(cv2.CAP_PROP_FPS) if cap is not None else 0
        frame = Frame(path, im, im0, fps, text, dataset.frame if dataset.mode != "image" else 0, dataset.mode)
        if batch and batch[0].im.shape != im.shape:
            yield batch
            batch = []
        batch.append(frame)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def predict_frames(model, frames, slicer, device, half, augment, nms_options):
    """Detections (n, 6) in original pixels for each frame, and (pre-process, inference, NMS) seconds.
    The model runs at a fixed number of frames per pass (utils/batch_invariance.py), NMS per frame: a frame's
    detections do not depend on the other frames of its batch."""
    t0 = t1 = time_sync()
    if slicer is not None:  # slices the original frames: tiles, full pass and merge all count as inference
        dets = [slicer(f.im0).to(device) for f in frames]
        t2 = t3 = time_sync()
    else:
        # stacked as (b, h, w, 3) and viewed as (b, 3, h, w): already the channels-last layout the PyTorch
        # backend runs in, so the float batch is never copied into it
        im = torch.from_numpy(np.stack([f.im.transpose(1, 2, 0) for f in frames])).to(device).permute(0, 3, 1, 2)
        im = (im.half() if half else im.float()) / 255
        t1 = time_sync()
        pred = run_batch_invariant(eval_forward(model, augment), im, model.fixed_shape)[0]
        t2 = time_sync()
        dets = non_max_suppression(pred, **nms_options)
        for det, f in zip(dets, frames):
            det[:, :4] = scale_boxes(im.shape[2:], det[:, :4], f.im0.shape)
        t3 = time_sync()
    for det in dets:
        det[:, :4] = det[:, :4].round()
    return dets, (t1 - t0, t2 - t1, t3 - t2)


def inference_model(weights, model, device):
    """``(backend, device)``: ``weights`` loaded on ``device``, or the already-loaded ``model`` (a plain
    ``nn.Module`` is wrapped in ``PyTorchBackend``, which moves it to channels-last in place)."""
    if model is None:
        device = select_device(device)
        model = load_backend(weights, device=device, fuse=True)  # .pt, .onnx, .torchscript or *_openvino_model/
    elif not isinstance(model, InferenceBackend):
        model = PyTorchBackend(model)  # a live model runs channels-last like a loaded checkpoint
    return model, getattr(model, "device", None) or next(model.parameters()).device


def visualized_layers(backend, slice_size: int) -> nn.Sequential:
    """The layers ``--visualize`` draws: those of one PyTorch checkpoint, run on whole frames."""
    if backend.kind != "pytorch":
        raise UserError(f"--visualize needs a .pt checkpoint: the layers of an exported model ({backend.kind}) "
                        "are not visible")
    if not hasattr(backend.model, "model"):
        raise UserError("--visualize draws one model's layers: give one checkpoint, not an ensemble")
    if slice_size:
        raise UserError(f"--visualize does not apply to --slice {slice_size} (a frame runs as many tiles); "
                        "drop one of the two")
    return backend.model.model


@torch.no_grad()
def run(weights, source, data=None, imgsz=(640, 640), conf_thres=0.25, iou_thres=0.45, max_det=1000, device="",
        view_img=False, save_txt=False, save_csv=False, save_conf=False, save_crop=False, nosave=False, classes=None,
        agnostic_nms=False, augment=False, project=ROOT / "runs/detect", name="exp", exist_ok=False,
        line_thickness=3, hide_labels=False, hide_conf=False, half=False, vid_stride=1, model=None,
        slice_size=0, slice_overlap=0.2, no_full_pass=False, slice_merge="nms", slice_batch=16, batch_size=0,
        visualize=False, modules=()):
    """Detect objects in ``source`` and save annotated media, labels, crops and a CSV under project/name.

    ``model``: an already-loaded eval model (``weights`` and ``device`` are then ignored); see
    :func:`inference_model`. ``visualize``: each frame's feature maps, per layer, into a folder named like
    its label file (utils/feature_maps.py). ``slice_size`` > 0: sliced inference on each original frame
    (utils/slicing.py). ``batch_size``: consecutive images or video frames of one letterboxed shape run through the
    model together (0: :func:`auto_batch_size`). ``modules``: as the ``--modules`` flag. Returns the run folder.
    """
    load_user_modules(modules)
    check_options(argparse.Namespace(max_det=max_det, vid_stride=vid_stride, line_thickness=line_thickness,
                                     batch_size=batch_size), DETECT_VALUE_RULES)  # the CLI's rules, for detect.run
    save_dir = increment_path(Path(project) / name, exist_ok=exist_ok)
    model, device = inference_model(weights, model, device)
    layers = visualized_layers(model, slice_size) if visualize else None
    stride = int(model.stride.max())
    imgsz = square_if_one(size_list(imgsz), stride)
    half &= device.type == "cuda"
    if half:
        model.half()
    names = class_names(model, data, classes)
    batch_size = frames_per_batch(batch_size, device, imgsz, layers is not None, model.fixed_shape)
    dataset = open_source(source, imgsz, stride, vid_stride)
    slicer = sliced_predictor(eval_forward(model, augment), slice_size, slice_overlap,
                              no_full_pass, slice_merge, slice_batch, conf_thres, iou_thres, max_det, imgsz, stride,
                              device, half, classes, agnostic_nms)
    make_run_folder(save_dir / "labels" if save_txt else save_dir)
    nms_options = dict(conf_thres=conf_thres, iou_thres=iou_thres, classes=classes, agnostic=agnostic_nms,
                       max_det=max_det)
    summary = SourceSummary(names)
    files = getattr(dataset, "files", [])
    videos = {f for f, is_video in zip(files, getattr(dataset, "video_flag", [])) if is_video}
    outputs = dict(stems=label_stems(files, videos), label_files=set(), save_txt=save_txt,
                   save_conf=save_conf, save_csv=save_csv, save_crop=save_crop, view_img=view_img, nosave=nosave,
                   line_thickness=line_thickness, hide_labels=hide_labels, hide_conf=hide_conf)
    dt, seen = [0.0, 0.0, 0.0], 0
    with VideoSink() as video:
        for frames in frame_batches(dataset, batch_size):
            with out_of_memory_hint("detection", batch_size, imgsz, device, DETECT_ADVICE), \
                    recorded_layer_outputs(layers) if layers is not None else contextlib.nullcontext({}) as fmaps:
                dets, times = predict_frames(model, frames, slicer, device, half, augment, nms_options)
            dt = [total + t for total, t in zip(dt, times)]
            seen += len(frames)
            for b, (f, det) in enumerate(zip(frames, dets)):
                with output_errors(save_dir):
                    write_outputs(det, f.im0, f.path, f.frame, f.fps, f.mode, save_dir, video, names, outputs)
                    if fmaps:
                        save_feature_maps(fmaps, b, feature_map_folder(save_dir, f, outputs["stems"]))
                log_frame(f, det, names, times[1] / len(frames))
                summary.add(f.path, det[:, 5].tolist(), sum(times) / len(frames), f.mode != "image")
    summary.finish(source)
    report(dt, seen, (min(batch_size, max(seen, 1)), 3, *imgsz), save_dir,
           len(outputs["label_files"]) if save_txt else None, nosave)
    return save_dir


def square_if_one(imgsz: list, stride: int) -> list:
    """``--imgsz`` as ``[h, w]`` at the model's stride: one size means a square, as in YOLOv5."""
    return check_img_size(imgsz * 2 if len(imgsz) == 1 else imgsz, stride=stride)


def log_frame(frame, det, names, seconds: float) -> None:
    """One line per frame: its source text, the detections per class and the inference time."""
    counts = Counter(int(c) for c in det[:, 5])
    found = "".join(f"{n} {names[c]}{'s' * (n > 1)}, " for c, n in sorted(counts.items()))
    LOGGER.info(f"{frame.text}{found or '(no detections), '}{seconds * 1e3:.1f}ms")


def feature_map_folder(save_dir, frame, stems) -> Path:
    """``--visualize``'s folder of one frame: named like its label file (``a``, ``clip_12``), so none is shared."""
    return save_dir / save_path_for(save_dir, frame.path, frame.mode, frame.frame, stems)[1].name


def make_run_folder(folder):
    """Create the run folder; a read-only or full --project is a UserError."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--project: cannot create {folder} ({e.strerror}); choose a writable --project") from e


@contextlib.contextmanager
def output_errors(save_dir):
    """Turn an OSError while saving results (disk full, read-only) into a UserError naming the file."""
    try:
        yield
    except OSError as e:
        raise UserError(f"cannot write {e.filename or save_dir} ({e.strerror}); results in {save_dir} are "
                        f"incomplete: free disk space or choose another --project, then rerun") from e


def write_outputs(det, im0, path, frame, fps, mode, save_dir, video, names, outputs: dict) -> None:
    """Labels, CSV rows, crops, the annotated image or video frame for one source frame, as ``outputs`` asks."""
    save_path, label_stem = save_path_for(save_dir, path, mode, frame, outputs["stems"])
    if outputs["save_txt"]:
        write_labels(det, im0.shape, outputs["save_conf"], label_stem)
        outputs["label_files"].add(label_stem)
    if outputs["save_csv"]:
        append_csv(save_dir / "predictions.csv", path, frame, det, names)
    if outputs["save_crop"]:
        for *xyxy, _, cls in det.tolist():
            crop_file = increment_path(save_dir / "crops" / names[int(cls)] / f"{Path(path).stem}.jpg")
            save_one_box(xyxy, im0, file=crop_file)
    if outputs["view_img"] or not outputs["nosave"]:
        annotated = annotate(im0, det, names, outputs["line_thickness"], outputs["hide_labels"], outputs["hide_conf"])
    if outputs["view_img"]:
        show(str(path), annotated)
    if not outputs["nosave"]:
        if mode == "image":
            if not cv2.imwrite(str(save_path), annotated):
                raise OSError(errno.EIO, "the image could not be written", str(save_path))
        else:
            video.write(save_path, annotated, fps)


def append_csv(file, path, frame, det, names):
    """Append one row per detection to ``file`` (header written when the file is new)."""
    new = not file.exists()
    with open(file, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(CSV_HEADER)
        for *xyxy, conf, cls in det.tolist():
            writer.writerow([Path(path).name, names[int(cls)], f"{conf:.4f}", frame, int(cls),
                             *(f"{v:.1f}" for v in xyxy)])


def report(dt, seen, shape, save_dir, n_labels, nosave):
    """Log per-image speed and where results went; ``n_labels``: label files this run wrote (None: no --save-txt)."""
    if seen == 0:
        LOGGER.warning("no frames were read from --source")
        return
    log_speed_and_outputs([x / seen * 1e3 for x in dt], shape, save_dir, n_labels, saved=not nosave)


DETECT_VALUE_RULES = OptionRules(positive=("max_det", "vid_stride", "line_thickness"), non_negative=("batch_size",))
DETECT_RULES = replace(DETECT_VALUE_RULES, positive=("imgsz", *DETECT_VALUE_RULES.positive))


def parse_opt(argv=None):
    parser = OneLineErrorParser(prog="python detect.py", description=__doc__, upstream_flags=DETECT_UPSTREAM_FLAGS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_flags(parser, project=ROOT / "runs/detect", weights_help="checkpoint(s); several = ensemble",
                     imgsz_help="inference size h,w", imgsz_hw=True)
    parser.add_argument("--source", type=str, required=True,
                        help="image, folder, glob, .txt list, video or webcam index")
    parser.add_argument("--data", type=str, default=None, help="optional data set YAML for class names")
    parser.add_argument("--conf-thres", type=float, default=0.25, help="confidence threshold")
    parser.add_argument("--iou-thres", type=float, default=0.45, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=1000, help="maximum detections per image")
    parser.add_argument("--view-img", action="store_true", help="show results")
    parser.add_argument("--save-txt", action="store_true",
                        help="save results to labels/STEM.txt; images sharing a stem (a.jpg, a.png) get "
                             "labels/a.jpg.txt and labels/a.png.txt, a name still taken gets _2, _3...")
    parser.add_argument("--save-csv", action="store_true", help="save results in CSV format")
    parser.add_argument("--save-conf", action="store_true", help="save confidences in --save-txt labels")
    parser.add_argument("--save-crop", action="store_true", help="save cropped prediction boxes")
    parser.add_argument("--nosave", action="store_true", help="do not save images/videos")
    parser.add_argument("--classes", nargs="+", type=int, help="filter by class: --classes 0, or --classes 0 2 3")
    parser.add_argument("--agnostic-nms", action="store_true", help="class-agnostic NMS")
    parser.add_argument("--augment", action="store_true", help="test-time augmentation")
    parser.add_argument("--line-thickness", default=3, type=int, help="bounding box thickness (pixels)")
    parser.add_argument("--hide-labels", action="store_true", help="hide labels")
    parser.add_argument("--hide-conf", action="store_true", help="hide confidences")
    parser.add_argument("--half", action="store_true", help="use FP16 half-precision inference (CUDA only)")
    parser.add_argument("--vid-stride", type=int, default=1, help="video frame-rate stride")
    parser.add_argument("--visualize", action="store_true",
                        help="save each layer's first 32 feature maps per image into <run>/<image stem>/ (.pt only)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="images or video frames per batch, rounded up to whole forward passes (2 images on "
                             "CPU, 8 on CUDA); 0 = 8 on CUDA, on CPU by image size (8 at 256 px, 2 at 640 px); "
                             "a webcam always runs one at a time")
    add_slice_arguments(parser)
    opt = check_options(parser.parse_args(argv), DETECT_RULES)
    if len(opt.imgsz) > 2:
        raise UserError(f"--imgsz {opt.imgsz}: give one size or 'height width', positive integers")
    opt.weights = opt.weights if len(opt.weights) > 1 else opt.weights[0]
    return opt


@exit_on_stop_signal("detection")
@exit_on_user_error
def cli(argv=None):
    opt = parse_opt(argv)
    with out_of_memory_anywhere("detect.py", DETECT_ADVICE):
        run(**vars(opt))


if __name__ == "__main__":
    cli()
