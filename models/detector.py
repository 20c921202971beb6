"""Python API: ``Detector("best.pt")(images)`` -> boxes, scores and classes in original-image pixels.

    from models import Detector
    detector = Detector("runs/train/exp/weights/best.pt", conf=0.25)   # or best.onnx / best.torchscript / best_openvino_model
    result = detector("image.jpg")                                     # one image -> one Detections
    result = detector("image.jpg", size=320)                           # another image size for this call
    for det in detector([np_rgb_array, pil_image], iou=0.5):           # a list -> a list
        print(det.boxes, det.scores, det.classes, det.labels)

Images are file paths, HWC RGB ``uint8`` numpy arrays (HW grayscale and RGBA accepted) or PIL
images. Pre-processing matches detect.py: letterbox to ``imgsz`` at the model's stride, NMS with
``conf``/``iou``/``max_det``/``classes``/``agnostic``, boxes mapped back to the original image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from models.backends import load_backend
from utils.augmentations import letterbox
from utils.errors import UserError
from utils.ops import (check_class_filter, check_img_size, check_thresholds, is_positive_int, make_divisible,
                       non_max_suppression, scale_boxes)
from utils.torch_utils import select_device


@dataclass
class Detections:
    """Detections of one image: ``boxes`` (n, 4) xyxy float pixels of the original image,
    ``scores`` (n,) float, ``classes`` (n,) int, ``names`` the model's class names."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: list

    @property
    def labels(self) -> list[str]:
        """Class name of each detection."""
        return [self.names[int(c)] for c in self.classes]

    def __len__(self) -> int:
        return len(self.scores)


def to_rgb_array(image) -> np.ndarray:
    """A path, numpy array or PIL image -> contiguous HWC RGB uint8 array; anything else is a UserError."""
    if isinstance(image, (str, Path)):
        bgr = cv2.imread(str(image))
        if bgr is None:
            raise UserError(f"{image}: not a readable image file")
        return np.ascontiguousarray(bgr[..., ::-1])
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image, without importing PIL here
        return np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray):
        raise UserError(f"images: expected paths, numpy arrays or PIL images, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise UserError(f"images: numpy arrays must be uint8 0-255 (HWC RGB), got dtype {image.dtype}")
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or min(image.shape[:2]) < 1:
        raise UserError(f"images: numpy arrays must be HWC with 1, 3 or 4 channels, got shape {image.shape}")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[..., :3])


def _option(name: str) -> property:
    """An option as an attribute, as YOLOv5's hub model has them (``model.conf = 0.5``): the default of later calls."""
    return property(lambda self: self.options[name], lambda self, value: self.options.__setitem__(name, value),
                    doc=f"the default ``{name}`` of later calls")


def _size_pair(size, argument: str) -> list:
    """``[h, w]`` from an int or a ``(h, w)`` pair of positive ints; anything else is one UserError line."""
    wanted = list(size) if isinstance(size, (list, tuple)) else [size] * 2
    if len(wanted) != 2 or not all(map(is_positive_int, wanted)):
        raise UserError(f"Detector: {argument}={size!r}: give a positive int or (height, width)")
    return wanted


class Detector:
    """Load weights once (.pt, .onnx, .torchscript, *_openvino_model), then call on images; see the module docstring.

    ``conf``, ``iou``, ``max_det``, ``classes`` (list of class indices to keep) and ``agnostic``
    mean what detect.py's ``--conf-thres``, ``--iou-thres``, ``--max-det``, ``--classes`` and
    ``--agnostic-nms`` mean, and can be overridden per call or set as attributes (``detector.conf = 0.5``).
    """

    conf, iou, max_det, classes, agnostic = map(_option, ("conf", "iou", "max_det", "classes", "agnostic"))

    def __init__(self, weights, device="", imgsz=640, conf=0.25, iou=0.45, max_det=1000, classes=None,
                 agnostic=False, half=False):
        size = _size_pair(imgsz, "imgsz")  # before the weights load: a typo costs no model load
        self.device = select_device(device)
        self.model = load_backend(weights, device=self.device, fuse=True).eval()
        self.half = bool(half) and self.device.type == "cuda"
        if self.half:
            self.model.half()
        self.stride = int(self.model.stride.max())
        fixed = self.model.fixed_shape
        self.imgsz = list(fixed[1:]) if fixed else check_img_size(size, stride=self.stride)
        self.names = self.model.names
        self.options = {"conf": conf, "iou": iou, "max_det": max_det, "classes": classes, "agnostic": agnostic}

    def input_size(self, size=None) -> list:
        """``[h, w]`` the images are letterboxed to: ``size`` (YOLOv5's per-call argument, an int or ``(h, w)``,
        rounded up to the stride) or the Detector's ``imgsz``. A static export takes only its own size."""
        if size is None:
            return self.imgsz
        wanted = _size_pair(size, "size")
        if self.model.fixed_shape is not None:
            if wanted != self.imgsz:
                raise UserError(f"Detector: size={size!r}: this exported model's input is fixed at {self.imgsz}; "
                                "export with --dynamic to choose the size per call")
            return self.imgsz
        return [make_divisible(v, self.stride) for v in wanted]  # silently, as YOLOv5's hub model: no warning per call

    def preprocess(self, rgb: np.ndarray, size=None) -> torch.Tensor:
        """HWC RGB uint8 -> letterboxed ``(1, 3, h, w)`` float 0-1 on the model's device (``size``: see input_size)."""
        im = letterbox(rgb, self.input_size(size), stride=self.stride, auto=self.model.fixed_shape is None)[0]
        im = torch.from_numpy(np.ascontiguousarray(im.transpose(2, 0, 1))).to(self.device)[None]
        return (im.half() if self.half else im.float()) / 255

    def check_options(self, opts: dict) -> None:
        """The limits detect.py puts on its flags, named as the keywords the caller wrote (``Detector: conf=2``)."""
        labels = {key: f"Detector: {key}" for key in self.options}
        check_thresholds(opts["conf"], opts["iou"], opts["max_det"], labels)
        if opts["classes"] is not None:
            check_class_filter(opts["classes"], len(self.names), labels)

    @torch.no_grad()
    def detect_one(self, image, size=None, **options) -> Detections:
        """Detections of one image in its original pixels."""
        opts = {**self.options, **options}
        unknown = set(options) - set(self.options)
        if unknown:
            raise UserError(f"Detector: unknown option(s) {sorted(unknown)}; use size or {sorted(self.options)}")
        self.check_options(opts)
        rgb = to_rgb_array(image)
        im = self.preprocess(rgb, size)
        pred = self.model(im)[0]
        det = non_max_suppression(pred.float(), opts["conf"], opts["iou"], opts["classes"], opts["agnostic"],
                                  max_det=opts["max_det"])[0]
        det[:, :4] = scale_boxes(im.shape[2:], det[:, :4], rgb.shape)
        det = det.cpu().numpy()
        return Detections(det[:, :4].astype(np.float32), det[:, 4].astype(np.float32),
                          det[:, 5].astype(np.int64), self.names)

    def __call__(self, images, size=None, **options):
        """One image -> :class:`Detections`; a list or tuple of images -> a list of them. ``size`` letterboxes
        to another image size for this call, as YOLOv5's ``model(im, size=640)``."""
        if isinstance(images, (list, tuple)):
            return [self.detect_one(image, size, **options) for image in images]
        return self.detect_one(images, size, **options)
