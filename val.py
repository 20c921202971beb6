"""Validate a trained detector on a YOLO-format data set (YOLOv5's flags and meanings).

Usage:
    python val.py --data data/shapes.yaml --weights runs/train/exp/weights/best.pt --imgsz 640
    python val.py ... --save-json          # also COCO JSON + official pycocotools mAP
    python val.py ... --task speed         # timing only (conf 0.25, iou 0.45)
    python val.py ... --task study         # mAP and speed over image sizes 256..1536

``run(...)`` is also called by train.py with the live model every epoch.
"""

import argparse
import sys
from copy import deepcopy
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from models.backends import load_backend  # noqa: E402
from models.experimental import eval_forward  # noqa: E402
from utils.batch_invariance import aligned_batch_size, eval_micro_batch, run_batch_invariant  # noqa: E402
from utils.coco_eval import coco_image_ids, coco_predictions, save_and_evaluate  # noqa: E402
from utils.dataset.data_config import SPLITS, check_dataset  # noqa: E402
from utils.dataloaders import create_dataloader  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.user_modules import load_user_modules  # noqa: E402
from utils.files import increment_path  # noqa: E402
from utils.logging import LOGGER, colorstr, log_speed_and_outputs  # noqa: E402
from utils.metrics import IOU_THRESHOLDS, ConfusionMatrix, ValMetrics, ap_per_class, match_predictions  # noqa: E402
from utils.options import (VAL_UPSTREAM_FLAGS, OneLineErrorParser, OptionRules, add_shared_flags,  # noqa: E402
                           check_options, keyword_value)
from utils.ops import (check_img_size, check_thresholds, non_max_suppression, scale_boxes, xywh2xyxy,  # noqa: E402
                       yolo_label_lines)
from utils.out_of_memory import TRAIN_ADVICE, VAL_ADVICE, out_of_memory_anywhere, out_of_memory_hint  # noqa: E402
from utils.plots import (output_to_target, plot_ap_curves, plot_band_pr, plot_confusion_matrix,  # noqa: E402
                         plot_images)
from utils.size_metrics import SizeBandStats, log_band_table  # noqa: E402
from utils.slicing import add_slice_arguments, sliced_predictor, to_letterbox  # noqa: E402
from utils.stop_signals import exit_on_stop_signal  # noqa: E402
from utils.torch_utils import select_device, time_sync  # noqa: E402

TABLE_HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")
TABLE_ROW = "%22s" + "%11i" * 2 + "%11.3g" * 4
DEFAULT_MAX_DET = 300  # detections per image when neither --max-det nor the data YAML's max_det is given
STUDY_SIZES = range(256, 1536 + 128, 128)
TASKS = ("train", "val", "test", "speed", "study")


# ------------------------------------------------------------------------------- per image

def save_one_txt(predn, save_conf, shape, file):
    """Write one image's YOLO-format labels (normalised to the original ``shape`` (h, w)), replacing the file:
    a rerun with --exist-ok must not add its rows to the earlier run's."""
    with open(file, "w") as f:
        f.writelines(yolo_label_lines(predn, shape, save_conf))


def half_copy(model):
    """An fp16 copy for validation under AMP; the caller's model (the EMA) keeps its fp32 weights and buffers."""
    return deepcopy(model).half()


def _model_device(model):
    return next(model.parameters()).device


def _load_for_cli(options: dict):
    """Standalone validation, from ``run``'s keyword values ``options``, checked as the command line checks them:
    weights (.pt, .onnx, .torchscript, *_openvino_model) -> eval backend on ``device``, checked image size, data
    dict, half precision; the ``--modules`` files are imported first."""
    load_user_modules(options["modules"])
    _check_python_values(options)
    weights, batch_size, imgsz, data = options["weights"], options["batch_size"], options["imgsz"], options["data"]
    device = select_device(options["device"], batch_size=batch_size)
    model = load_backend(weights, device=device, fuse=True)
    imgsz = check_img_size(imgsz, stride=int(model.stride.max()))
    _check_static_size(model, imgsz, weights)
    half = options["half"] and device.type == "cuda"
    if half:
        model.half()
    data = check_dataset(data)
    _check_class_counts(model, data, weights, options["single_cls"])
    return model, device, imgsz, half, data


def _check_python_values(values: dict) -> None:
    """What the command line refuses, refused from ``val.run`` too, before the weights load or any folder is made:
    its rules (``batch_size``, ``workers``), a threshold outside 0-1 (it used to fail inside NMS, after the run
    folder), a switch that is not True or False (``reduced_decode='no'`` turned the option on; train.run refuses it
    the same way)."""
    check_options(argparse.Namespace(batch_size=values["batch_size"], workers=values["workers"]), VAL_VALUE_RULES)
    max_det = values["max_det"]
    check_thresholds(values["conf_thres"], values["iou_thres"], DEFAULT_MAX_DET if max_det is None else max_det)
    for action in build_parser()._actions:
        if action.nargs == 0 and action.dest in values:
            keyword_value(action, f"val.run: {action.dest}={values[action.dest]!r}", values[action.dest])


def warn_if_max_det_caps(dataset, max_det: int, remedy: str) -> bool:
    """Warn once when images hold more labels than ``max_det`` detections can match: their recall is capped below
    what the model finds, silently otherwise (crowded VisDrone and AI-TOD images hold 1,000 and more objects).
    ``remedy`` says how to raise the cap; it is followed by the largest label count. True when it warned. val.run
    calls it outside training; train.py once, when its validation loader is built, not at every validation."""
    counts = np.array([len(labels) for labels in dataset.labels])
    over = np.flatnonzero(counts > max_det)
    if not len(over):
        return False
    most = int(counts.argmax())
    LOGGER.warning(f"{dataset.prefix}{len(over)} of {len(counts)} images hold more labels than max_det {max_det} "
                   f"detections can match (the most: {counts[most]} in {dataset.im_files[most]}), so their recall "
                   f"is capped; {remedy} {counts[most]} or more")
    return True


def _check_static_size(model, imgsz: int, weights) -> None:
    """A static export takes images up to its exported (h, w); refuse a larger --imgsz before any folder is made."""
    if model.fixed_shape is None:
        return
    _, height, width = model.fixed_shape
    if imgsz > min(height, width):
        raise UserError(f"--imgsz {imgsz} is larger than the {height}x{width} {weights} was exported for; "
                        f"use --imgsz {min(height, width)} or re-export with --dynamic")


def _check_class_counts(model, data: dict, weights, single_cls: bool) -> None:
    """The weights must predict the data set's classes (with --single-cls every class counts as one)."""
    if single_cls:
        if int(model.nc) > 1:
            LOGGER.info(f"--single-cls: all {data['nc']} data set classes and all {model.nc} model classes are "
                        "scored as one class")
        return
    if int(model.nc) != int(data["nc"]):
        raise UserError(f"--weights {weights} predicts {model.nc} classes but --data {data.get('yaml_file', '')} "
                        f"has {data['nc']}; use the data set the weights were trained on, or --single-cls")


def _validation_loader(data, task, imgsz, batch_size, model, device, single_cls, workers, reduced_decode=False):
    """Rectangular letterboxes (pad 0.5 stride) for accuracy, each image's shape its own (the YOLOv5 rect rule
    applied to it alone) and batches of one shape, so its input does not depend on --batch-size; square
    ``imgsz`` letterboxes (pad 0) for --task speed and for static exports (``model.fixed_shape`` set), whose input
    cannot grow past the exported size. ``batch_size`` is rounded up to whole forward passes
    (utils/batch_invariance.py), so each pass holds the same images at any --batch-size."""
    stride, fixed_shape = int(model.stride.max()), getattr(model, "fixed_shape", None)
    batch_size = aligned_batch_size(batch_size, eval_micro_batch(device, fixed_shape))
    if task not in TASKS:  # the CLI's choices, for val.run
        raise UserError(f"--task {task!r}: choose from {', '.join(TASKS)}")
    split = task if task in SPLITS else "val"  # speed and study time the val split
    if data.get(split) is None:
        raise UserError(f"--task {task}: the data set YAML {data.get('yaml_file', '')} has no '{split}' split")
    pad, rect = (0.0, False) if task == "speed" or fixed_shape is not None else (0.5, True)
    return create_dataloader(data[split], imgsz, batch_size, stride, single_cls, pad=pad, rect=rect, workers=workers,
                             prefix=colorstr(f"{split}: "), nc=data["nc"], reduced_decode=reduced_decode,
                             shape_per_image=rect)[0]


def _class_names(names, model, data, single_cls=False):
    if single_cls:
        return {0: "item"}
    names = names or getattr(model, "names", None) or data["names"]
    return dict(enumerate(names)) if isinstance(names, (list, tuple)) else dict(names)


@torch.no_grad()
def run(data, weights=None, batch_size=32, imgsz=640, conf_thres=0.001, iou_thres=0.6, max_det=None, task="val",
        device="", workers=8, single_cls=False, augment=False, verbose=False, save_txt=False, save_hybrid=False,
        save_conf=False, save_json=False, project=ROOT / "runs/val", name="exp", exist_ok=False, half=True,
        model=None, dataloader=None, save_dir=Path(""), plots=True, compute_loss=None, names=None,
        slice_size=0, slice_overlap=0.2, no_full_pass=False, slice_merge="nms", slice_batch=16, size_bands=False,
        plot_bands=False, reduced_decode=False, modules=()):
    """Validate; returns a :class:`ValResult` (metrics, per-class mAP50-95, per-image times, size bands).

    With ``model`` given (from train.py), that model is used as is, ``data`` is the data dict and half
    precision applies on CUDA only. ``max_det`` None takes the data YAML's ``max_det``
    (:func:`detections_per_image`). The size-band metrics (utils/size_metrics.py) are computed outside
    training, and during training with ``size_bands=True`` or ``verbose``; they are printed under the
    usual table outside training or with ``verbose``. ``slice_size`` > 0 predicts each full-size image by sliced
    inference (utils/slicing.py) instead of one letterboxed pass. ``plot_bands`` writes PR_curve_bands.png:
    precision-recall at IoU 0.5 per size band. ``reduced_decode``, ``modules``: as the flags. Out of memory: one line.
    """
    training = model is not None
    if training:
        model, device, half = _training_model(model, half)
    else:
        model, device, imgsz, half, data = _load_for_cli(locals())
    model.eval()
    max_det = detections_per_image(max_det, data)
    nc = 1 if single_cls else int(data["nc"])
    names = _class_names(names, model, data, single_cls)
    if dataloader is None:
        dataloader = _validation_loader(data, task, imgsz, batch_size, model, device, single_cls, workers,
                                        reduced_decode)
    slicer = sliced_predictor(
        eval_forward(model, augment), slice_size, slice_overlap, no_full_pass,
        slice_merge, slice_batch, conf_thres, iou_thres, max_det, imgsz, int(model.stride.max()), device, half,
        agnostic=single_cls, multi_label=True)
    if not training:  # made only once weights and data have loaded, so a user error leaves no folder behind
        warn_if_max_det_caps(dataloader.dataset, max_det, "raise --max-det (or the data YAML's max_det) to")
        save_dir = increment_path(Path(project) / name, exist_ok=exist_ok)
        (save_dir / "labels" if save_txt else save_dir).mkdir(parents=True, exist_ok=True)
    record = ValidationRecord(ConfusionMatrix(nc=nc), SizeBandStats() if size_bands or not training or verbose else None,
                              single_cls, plots, save_dir if save_txt else None, save_conf,
                              coco_image_ids(dataloader.dataset.im_files) if save_json else None)
    nms_options = dict(conf_thres=conf_thres, iou_thres=iou_thres, multi_label=True, agnostic=single_cls,
                       max_det=max_det)
    predict = partial(_predict_batch, model, slicer, half=half, augment=augment, compute_loss=compute_loss,
                      save_hybrid=save_hybrid, nms_options=nms_options)
    with out_of_memory_hint("validation", batch_size, imgsz, device, TRAIN_ADVICE if training else VAL_ADVICE):
        dt, loss = _validate_batches(dataloader, predict, device, record, save_dir if plots else None, names)
    seen = len(record.stats)
    mp, mr, map50, map_, maps = _summarise(record.stats, nc, names, seen, plots, save_dir,
                                           verbose or (nc < 50 and not training), training)
    bands = _band_results(record.band_stats, verbose or not training, save_dir if plot_bands else None)
    times = tuple(x / max(seen, 1) * 1e3 for x in dt)
    if plots:
        plot_confusion_matrix(record.confusion_matrix.matrix, list(names.values()), save_dir / "confusion_matrix.png")
    coco = (save_and_evaluate(record.jdict, dataloader.dataset, names, nc, single_cls, save_dir, weights, max_det)
            if save_json and record.jdict else None)
    map_, map50 = coco if coco is not None else (map_, map50)
    if not training:
        n_labels = len(list(save_dir.glob("labels/*.txt"))) if save_txt else None
        log_speed_and_outputs(times, (batch_size, 3, imgsz, imgsz), save_dir, n_labels)
    return ValResult(mp, mr, map50, map_, *(loss.cpu() / max(len(dataloader), 1)).tolist(), maps=maps, times=times,
                     bands=bands)


@dataclass(eq=False)
class ValResult:
    """One validation's figures: what results.csv logs, per-class mAP, speed and the size bands."""

    precision: float  # mean over classes
    recall: float
    map50: float
    map50_95: float  # mAP50 and mAP50-95 are pycocotools' with --save-json
    box_loss: float  # mean per batch; 0 without compute_loss
    obj_loss: float
    cls_loss: float
    maps: np.ndarray  # (nc,) per-class mAP50-95; classes without labels get the mean
    times: tuple  # per-image milliseconds (pre-process, inference, NMS)
    bands: dict | None = None  # size-band metrics (utils/size_metrics.py), None when not computed

    @property
    def metrics(self) -> ValMetrics:
        """(P, R, mAP50, mAP50-95, box, obj, cls losses): the 7 figures results.csv, fitness and evolve read."""
        return ValMetrics(self.precision, self.recall, self.map50, self.map50_95, self.box_loss, self.obj_loss,
                          self.cls_loss)


def _band_results(band_stats, show: bool, plot_dir):
    """The size-band metrics (None without ``band_stats``); printed when ``show``; with ``plot_dir``,
    PR_curve_bands.png written there."""
    if band_stats is None:
        return None
    bands = band_stats.compute()
    if show:
        log_band_table(bands)
    if plot_dir is not None:
        plot_band_pr(band_stats.pr_curves(), Path(plot_dir) / "PR_curve_bands.png")
    return bands


def detections_per_image(max_det, data: dict) -> int:
    """``max_det`` when given (--max-det), else the data YAML's ``max_det`` (data/AI-TOD.yaml: 1500, the
    AI-TOD protocol's maxDets), else 300. It caps NMS output and pycocotools' maxDets alike."""
    if max_det is not None:
        return int(max_det)
    if data.get("max_det") is not None:
        LOGGER.info(f"max_det {data['max_det']} detections per image, from {data.get('yaml_file') or 'the data YAML'}")
        return int(data["max_det"])
    return DEFAULT_MAX_DET


def _validate_batches(dataloader, predict, device, record, plot_dir, names):
    """Every batch through ``predict`` into ``record`` (first three drawn into ``plot_dir`` unless None).

    Returns (seconds per stage summed over batches [3], validation losses summed (3,)).
    """
    dt, loss = [0.0, 0.0, 0.0], torch.zeros(3, device=device)
    for batch_i, (im, targets, paths, shapes) in enumerate(tqdm(dataloader, desc=TABLE_HEADER,
                                                                bar_format="{l_bar}{bar:10}{r_bar}")):
        im, targets, preds, times, loss_items = predict(im.to(device, non_blocking=True),
                                                        targets.to(device, non_blocking=True), paths, shapes)
        dt = [total + t for total, t in zip(dt, times)]
        loss = loss if loss_items is None else loss + loss_items
        record.add_batch(preds, targets, im.shape[2:], paths, shapes)
        if plot_dir is not None and batch_i < 3:
            _plot_batch(im, targets, preds, paths, plot_dir / f"val_batch{batch_i}", names)
    return dt, loss


def _plot_batch(im, targets, preds, paths, stem: Path, names) -> None:
    """``<stem>_labels.jpg`` and ``<stem>_pred.jpg`` for one validation batch."""
    plot_images(im, targets, paths, stem.with_name(stem.name + "_labels.jpg"), names)
    plot_images(im, output_to_target(preds), paths, stem.with_name(stem.name + "_pred.jpg"), names)


def _predict_batch(model, slicer, im, targets, paths, shapes, half, augment, compute_loss, save_hybrid, nms_options):
    """One batch -> (images 0-1, targets with pixel xywh, per-image (n, 6) detections in letterboxed pixels,
    (pre-process, inference, NMS) seconds, loss items or None). The model runs at a fixed number of images per
    pass (utils/batch_invariance.py), and NMS per image: no image's detections depend on its batch."""
    t0 = time_sync()
    im = (im.half() if half else im.float()) / 255
    nb, _, height, width = im.shape
    t1 = time_sync()
    if slicer is None:
        fixed_shape = getattr(model, "fixed_shape", None)  # a static export: its own batch per pass
        preds, train_out = run_batch_invariant(eval_forward(model, augment), im, fixed_shape)
    else:  # tiles, full pass and merge count as inference (as in detect.py), mapped into letterboxed pixels
        preds = [to_letterbox(slicer.predict_file(p), s[1]).to(im.device) for p, s in zip(paths, shapes)]
    t2 = time_sync()
    loss_items = compute_loss(train_out, targets)[1] if compute_loss else None
    targets[:, 2:] *= torch.tensor((width, height, width, height), device=targets.device)
    hybrid = [targets[targets[:, 0] == i, 1:] for i in range(nb)] if save_hybrid else []
    if slicer is None:
        preds = non_max_suppression(preds, labels=hybrid, **nms_options)
    t3 = time_sync()
    return im, targets, preds, (t1 - t0, t2 - t1, t3 - t2), loss_items


@dataclass
class ValidationRecord:
    """What validation keeps per image: match statistics, confusion matrix, size bands, labels and COCO JSON."""

    confusion_matrix: ConfusionMatrix
    band_stats: SizeBandStats | None
    single_cls: bool
    plots: bool
    labels_dir: Path | None  # run folder for --save-txt labels, None without --save-txt
    save_conf: bool
    image_ids: dict | None  # COCO image ids for --save-json, None without it
    stats: list = field(default_factory=list)
    jdict: list = field(default_factory=list)

    def add_batch(self, preds, targets, letterbox_shape, paths, shapes) -> None:
        """``preds``: per-image (n, 6) in letterboxed pixels; ``targets`` (m, 6) with pixel xywh."""
        for si, pred in enumerate(preds):
            labels = targets[targets[:, 0] == si, 1:]
            self.stats.append(_image_stats(pred, labels, letterbox_shape, shapes[si], self.single_cls, self.plots,
                                           self.confusion_matrix, self.band_stats))
            if self.labels_dir is None and self.image_ids is None:
                continue
            predn = _original_pixels(pred, letterbox_shape, shapes[si], self.single_cls)
            if self.labels_dir is not None:
                save_one_txt(predn, self.save_conf, shapes[si][0],
                             self.labels_dir / "labels" / f"{Path(paths[si]).stem}.txt")
            if self.image_ids is not None:
                self.jdict += coco_predictions(predn, self.image_ids[str(paths[si])])


def _training_model(model, half: bool):
    """train.py's live model: (model to run, its device, half); under CUDA AMP a half copy, never the EMA itself."""
    device = _model_device(model)
    half &= device.type == "cuda"
    return (half_copy(model) if half else model), device, half


def _original_pixels(pred, letterbox_shape, shape_info, single_cls: bool):
    """A copy of (n, 6) detections with boxes in original-image pixels (class 0 with --single-cls)."""
    predn = pred.clone()
    if single_cls:
        predn[:, 5] = 0
    scale_boxes(letterbox_shape, predn[:, :4], shape_info[0], shape_info[1])
    return predn


def _image_stats(pred, labels, letterbox_shape, shape_info, single_cls, plots, confusion_matrix, band_stats=None):
    """(correct (n, 10), conf (n,), pred_cls (n,), target_cls (m,)) numpy arrays for one image.

    ``pred`` (n, 6) and ``labels`` (m, 5) [cls, x, y, w, h] are in letterboxed pixels; both are
    mapped to the original image (as in the COCO JSON) before matching, also for ``band_stats``.
    """
    (h0, w0), ratio_pad = shape_info
    target_cls = labels[:, 0].cpu().numpy()
    if single_cls:
        pred = pred.clone()
        pred[:, 5] = 0
    label_boxes = scale_boxes(letterbox_shape, xywh2xyxy(labels[:, 1:5]), (h0, w0), ratio_pad)
    labelsn = torch.cat((labels[:, 0:1], label_boxes), 1)
    predn = pred.clone()
    scale_boxes(letterbox_shape, predn[:, :4], (h0, w0), ratio_pad)
    if plots:
        confusion_matrix.process_batch(predn if len(predn) else None, labelsn)
    correct = match_predictions(predn, labelsn, IOU_THRESHOLDS)
    if band_stats is not None:
        band_stats.add(predn, labelsn)
    return correct, pred[:, 4].cpu().numpy(), pred[:, 5].cpu().numpy(), target_cls


def _summarise(stats, nc, names, seen, plots, save_dir, per_class, training):
    """Compute and print the metrics table -> (mP, mR, mAP50, mAP50-95, per-class mAP50-95 (nc,))."""
    correct, conf, pred_cls, target_cls = (np.concatenate(x, 0) for x in zip(*stats)) if stats else \
        (np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.zeros(0))
    mp = mr = map50 = map_ = 0.0
    ap_class, ap, ap50, p, r = np.zeros(0, int), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
    if len(target_cls):
        _, _, p, r, _, ap_all, ap_class, curves = ap_per_class(correct, conf, pred_cls, target_cls, names=names)
        if plots:
            plot_ap_curves(curves, save_dir)
        ap50, ap = ap_all[:, 0], ap_all.mean(1)
        mp, mr, map50, map_ = p.mean(), r.mean(), ap50.mean(), ap.mean()
    counts = np.bincount(target_cls.astype(int), minlength=nc)

    LOGGER.info(TABLE_HEADER)
    LOGGER.info(TABLE_ROW % ("all", seen, counts.sum(), mp, mr, map50, map_))
    if counts.sum() == 0:
        LOGGER.warning(f"no labels found in the {'training-time ' if training else ''}validation set, "
                       "cannot compute metrics without labels")
    if per_class and nc > 1:
        for i, c in enumerate(ap_class):
            LOGGER.info(TABLE_ROW % (names.get(int(c), str(c)), seen, counts[c], p[i], r[i], ap50[i], ap[i]))
    maps = np.zeros(nc) + map_
    for i, c in enumerate(ap_class):
        maps[c] = ap[i]
    return float(mp), float(mr), float(map50), float(map_), maps


# ------------------------------------------------------------------------------- command line

VAL_VALUE_RULES = OptionRules(positive=("batch_size",), non_negative=("workers",))
VAL_RULES = replace(VAL_VALUE_RULES, positive=(*VAL_VALUE_RULES.positive, "imgsz", "max_det"))


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="python val.py", description=__doc__, upstream_flags=VAL_UPSTREAM_FLAGS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_flags(parser, project=ROOT / "runs/val", weights_help="checkpoint(s); several = ensemble",
                     imgsz_help="inference size (pixels)")
    parser.add_argument("--data", type=str, required=True, help="data set YAML")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="batch size, rounded up to whole forward passes (2 images on CPU, 8 on CUDA)")
    parser.add_argument("--conf-thres", type=float, default=0.001, help="confidence threshold")
    parser.add_argument("--iou-thres", type=float, default=0.6, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=None,
                        help=f"maximum detections per image (default: the data YAML's max_det, else {DEFAULT_MAX_DET})")
    parser.add_argument("--task", default="val", choices=TASKS,
                        help="split to validate, or speed / study")
    parser.add_argument("--workers", type=int, default=8, help="max dataloader workers")
    parser.add_argument("--single-cls", action="store_true", help="treat as single-class data set")
    parser.add_argument("--augment", action="store_true", help="test-time augmentation")
    parser.add_argument("--verbose", action="store_true", help="report mAP by class")
    parser.add_argument("--save-txt", action="store_true", help="save results to *.txt")
    parser.add_argument("--save-hybrid", action="store_true", help="save label+prediction hybrid results to *.txt")
    parser.add_argument("--save-conf", action="store_true", help="save confidences in --save-txt labels")
    parser.add_argument("--save-json", action="store_true", help="save a COCO-JSON results file and run pycocotools")
    parser.add_argument("--half", action="store_true", help="use FP16 half-precision inference (CUDA only)")
    parser.add_argument("--plot-bands", action="store_true", help="also write PR_curve_bands.png (PR per size band)")
    parser.add_argument("--reduced-decode", action="store_true",
                        help="decode large JPEGs at 1/2, 1/4 or 1/8 scale in libjpeg when that still covers --imgsz")
    add_slice_arguments(parser)
    return parser


def parse_opt(argv=None):
    opt = check_options(build_parser().parse_args(argv), VAL_RULES)
    opt.save_txt |= opt.save_hybrid
    return opt


def _warn_about_options(opt):
    if opt.conf_thres > 0.001 and opt.task in ("train", "val", "test"):
        LOGGER.warning(f"--conf-thres {opt.conf_thres} > 0.001 gives invalid mAP values (fewer detections)")
    if opt.save_hybrid:
        LOGGER.warning("--save-hybrid mixes labels into the predictions: its mAP is not a model metric")


def main(opt):
    """Run the chosen task: one split, speed timing, or the image-size study."""
    _warn_about_options(opt)
    weights = opt.weights if len(opt.weights) > 1 else opt.weights[0]
    if opt.task in ("train", "val", "test"):
        return run(**{**vars(opt), "weights": weights})
    if opt.task == "speed":
        for w in opt.weights:
            run(**{**vars(opt), "weights": w, "conf_thres": 0.25, "iou_thres": 0.45, "save_json": False,
                   "plots": False})
        return None
    return study(opt)


def study(opt):
    """mAP and speed versus image size per weights file -> study_<data>_<weights>.txt and study.png."""
    from utils.plots import plot_val_study

    files = []
    for w in opt.weights:
        rows = []
        for size in STUDY_SIZES:
            LOGGER.info(f"\nRunning {w} --imgsz {size}...")
            result = run(**{**vars(opt), "weights": w, "imgsz": size, "plots": False})
            rows.append([size, *result.metrics, *result.times])
        out = Path(opt.project) / f"study_{Path(opt.data).stem}_{Path(w).stem}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savetxt(out, np.array(rows), fmt="%10.4g")
        files.append(out)
    plot_val_study(files, Path(opt.project) / "study.png")
    return None


@exit_on_stop_signal("validation")
@exit_on_user_error
def cli(argv=None):
    opt = parse_opt(argv)
    try:
        with out_of_memory_anywhere("val.py", VAL_ADVICE):
            main(opt)
    except OSError as e:  # disk full or read-only --project: one line, not a traceback
        raise UserError(f"--project {opt.project}: {e.filename or 'a file'}: {e.strerror or e}; validation stopped "
                        "and the results written so far are incomplete: free disk space or choose another "
                        "--project, then rerun") from None


if __name__ == "__main__":
    cli()
