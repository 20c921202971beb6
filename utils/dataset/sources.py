"""Inference sources for detect.py: images and videos from a file, folder, glob or .txt list, and webcams."""

import glob
import os
from pathlib import Path

import cv2
import numpy as np

from utils.augmentations import letterbox
from utils.errors import UserError
from utils.dataset.image_io import IMG_FORMATS, VID_FORMATS, bgr_to_chw_rgb, file_suffix, read_image
from utils.logging import LOGGER


SOURCE_KINDS = "an image, folder, glob, video, .txt list or camera index"
STREAM_SCHEMES = ("http://", "https://", "rtsp://", "rtmp://")


def refuse_unopenable_source(source: str) -> None:
    """One UserError line for the sources YOLOv5 opens and this offline project does not: URLs and streams (it
    never downloads) and screen capture."""
    if source.lower().startswith(STREAM_SCHEMES):
        raise UserError(f"--source {source}: URLs and streams are not opened (nothing is downloaded at run time); "
                        f"save the file or clip and pass its path, or pass {SOURCE_KINDS}")
    if source == "screen":
        raise UserError(f"--source screen: screen capture is not supported; pass {SOURCE_KINDS}")


class LoadImages:
    """Iterate images and videos from a file, folder, glob or .txt list (for detect.py).

    Yields ``(path, im (3, h, w) RGB uint8 letterboxed, im0 (h0, w0, 3) BGR original, video capture or
    None, description)``; videos frame by frame, keeping every ``vid_stride``-th frame.
    """

    def __init__(self, path, img_size=640, stride=32, auto=True, vid_stride=1):
        files = []
        for p in path if isinstance(path, (list, tuple)) else [path]:
            refuse_unopenable_source(str(p))
            p = Path(str(p)).expanduser()
            if "*" in str(p):
                files += sorted(glob.glob(str(p), recursive=True))
            elif p.is_dir():
                files += sorted(str(x) for x in p.glob("*.*"))
            elif p.is_file() and p.suffix == ".txt":
                lines = [x.strip() for x in p.read_text(errors="replace").splitlines() if x.strip()]
                files += [x if os.path.isabs(x) else str(p.parent / x) for x in lines]
            elif p.is_file():
                files.append(str(p))
            else:
                raise UserError(f"--source {p}: no such file or folder; pass {SOURCE_KINDS}")
        images = [x for x in files if file_suffix(x) in IMG_FORMATS]
        videos = [x for x in files if file_suffix(x) in VID_FORMATS]
        if not images and not videos:
            raise UserError(f"--source {path}: no supported files; images: {', '.join(IMG_FORMATS)}; "
                            f"videos: {', '.join(VID_FORMATS)}")
        self.img_size, self.stride, self.auto = img_size, stride, auto
        self.vid_stride = max(int(vid_stride), 1)
        self.files = images + videos
        self.nf = len(self.files)
        self.video_flag = [False] * len(images) + [True] * len(videos)
        self.mode = "image"
        self.cap, self.frame, self.frames = None, 0, 0
        self.count = 0

    def __iter__(self):
        self.count = 0
        return self

    def _new_video(self, path):
        self.frame = 0
        self.cap = cv2.VideoCapture(path)
        self.frames = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT) / self.vid_stride)

    def _next_frame(self, path):
        """The next kept frame of the current video or None when it ends."""
        if self.cap is None:
            self._new_video(path)
        for _ in range(self.vid_stride - 1):
            self.cap.grab()
        ok, frame = self.cap.read()
        if not ok:
            if self.frame == 0:
                LOGGER.warning(f"{path}: cannot read video, skipped")
            self.cap.release()
            self.cap = None
            return None
        self.frame += 1
        return frame

    def __next__(self):
        while self.count < self.nf:
            path = self.files[self.count]
            if self.video_flag[self.count]:
                self.mode = "video"
                im0 = self._next_frame(path)
                if im0 is None:
                    self.count += 1
                    continue
                s = f"video {self.count + 1}/{self.nf} ({self.frame}/{self.frames}) {path}: "
                cap = self.cap
            else:
                self.mode = "image"
                self.count += 1
                im0 = read_image(path)
                if im0 is None:
                    LOGGER.warning(f"{path}: cannot read image, skipped")
                    continue
                s = f"image {self.count}/{self.nf} {path}: "
                cap = None
            im = bgr_to_chw_rgb(letterbox(im0, self.img_size, stride=self.stride, auto=self.auto)[0])
            return path, im, im0, cap, s
        raise StopIteration

    def __len__(self):
        return self.nf


class Webcam:
    """Frames from camera ``index`` as LoadImages-style tuples (path, im (3, h, w) RGB, im0 BGR, cap, s)."""

    def __init__(self, index, img_size, stride, vid_stride=1):
        self.cap = cv2.VideoCapture(index)
        if not self.cap.isOpened():
            raise UserError(f"--source {index}: no camera with index {index} could be opened; "
                            "attach one or pass an image, folder, video or .txt list")
        self.path, self.img_size, self.stride = f"webcam{index}", img_size, stride
        self.vid_stride = max(int(vid_stride), 1)
        self.mode, self.frame = "stream", 0

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(self.vid_stride - 1):
            self.cap.grab()
        ok, im0 = self.cap.read()
        if not ok:
            self.cap.release()
            raise StopIteration
        self.frame += 1
        im = letterbox(im0, self.img_size, stride=self.stride, auto=True)[0]
        im = np.ascontiguousarray(im.transpose(2, 0, 1)[::-1])
        return self.path, im, im0, self.cap, f"{self.path} frame {self.frame}: "
