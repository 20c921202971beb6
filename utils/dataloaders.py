"""The training/validation data set, its collate functions and ``create_dataloader``.

Determinism: the batch sampler (utils/dataset/sampling.py) yields keys ``(index, epoch, draw)``; every random
decision for a sample comes from a generator seeded by ``(seed, epoch, index, draw)``, so batches do
not depend on the number of workers and a resumed epoch sees exactly the batches it saw before.
Scanning and the label cache live in utils/dataset/label_cache.py, image caching in utils/dataset/image_cache.py,
training tiles of large images (``train_tiles``) in utils/dataset/tiles.py.
"""

import os
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from utils.augmentations import apply_hsv, hsv_lut, letterbox, mixup, mosaic, paste_small_objects, random_perspective
from utils.ddp import DistInfo, dist_info_from_env, rank_zero_first
from utils.env_vars import read
from utils.errors import UserError
from utils.extra_hyps import with_extra_hyp
from utils.files import yaml_load
from utils.dataset.image_cache import ImageCache, cache_mode
from utils.dataset.image_io import bgr_to_chw_rgb, img2label_paths
from utils.dataset.label_cache import load_labels
from utils.dataset.tiles import letterbox_tile, sample_tile
from utils.logging import LOGGER
from utils.training.interrupts import leave_stop_signals_to_the_main_process
from utils.ops import xywhn2xyxy, xyxy2xywhn
from utils.dataset.sampling import DeterministicBatchSampler, DeterministicDataLoader

DEFAULT_HYP = Path(__file__).resolve().parents[1] / "data" / "hyps" / "hyp.scratch-low.yaml"
AUGMENT_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective",
                "flipud", "fliplr", "mosaic", "mixup")
QUAD_STREAM = 1  # extra seed word separating the quad-collate decision from a sample's augmentation
PASTE_STREAM = 2  # copy_paste_small's own stream: switching it on changes no other augmentation draw


def _check_hyp(hyp, prefix):
    """Augmentation hyperparameters: ``hyp`` (dict) or scratch-low's; YOLOv5's keys required, ours completed."""
    hyp = dict(hyp) if hyp is not None else yaml_load(DEFAULT_HYP)
    missing = [k for k in AUGMENT_KEYS if k not in hyp]
    if missing:
        raise UserError(f"{prefix}hyperparameters lack {', '.join(missing)}; start from data/hyps/hyp.scratch-low.yaml")
    return with_extra_hyp(hyp, f"{prefix}hyperparameters")


class LoadImagesAndLabels(Dataset):
    """YOLO-format images and labels with YOLOv5's augmentation; see the module docstring for determinism.

    ``dataset[key]`` with ``key`` an int or ``(index, epoch, draw)`` returns
    ``(image uint8 (3, h, w) RGB, labels (n, 6) [0, cls, x, y, w, h], path, shapes or None)``.
    ``train_tiles`` N (augmenting only): every image drawn is replaced by a random N x N tile of it.
    """

    def __init__(self, path, img_size=640, batch_size=16, augment=False, hyp=None, rect=False,
                 image_weights=False, cache_images=False, single_cls=False, stride=32, pad=0.0, prefix="",
                 seed=0, nc=None, train_tiles=None, reduced_decode=False, shape_per_image=False):
        self.img_size = img_size
        self.augment = augment
        self.hyp = _check_hyp(hyp, prefix) if augment else hyp
        self.image_weights = image_weights
        self.rect = False if image_weights else rect
        self.shape_per_image = self.rect and shape_per_image
        self.mosaic = augment and not self.rect
        self.mosaic_border = (-img_size // 2, -img_size // 2)
        self.stride = stride
        self.seed = int(seed) % 2**63
        self.path = path
        self.prefix = prefix
        self.tiles = int(train_tiles) if train_tiles and augment else None
        if self.tiles and self.rect:
            raise UserError(f"{prefix}--train-tiles {self.tiles} cannot be combined with --rect (tiles are square); "
                            "drop one of them")
        if self.tiles:
            LOGGER.info(f"{prefix}random {self.tiles} x {self.tiles} tiles of the images, cut on the fly and shown at "
                        f"{img_size / self.tiles:g}x (utils/dataset/tiles.py)")
        self._use_labels(load_labels(path, nc, prefix), single_cls)
        self.n = len(self.im_files)
        self.batch = np.floor(np.arange(self.n) / batch_size).astype(int)  # batch index of each image
        self.indices = np.arange(self.n)
        self.class_weights = None  # image_weights sampling; None -> inverse class frequency
        if self.rect:
            self._sort_for_rect(batch_size, img_size, stride, pad)
        if self.shape_per_image:
            self._group_by_own_shape(img_size, stride, pad)
        self.images = ImageCache(self.im_files, self.shapes, self.orientations, img_size, augment,
                                 cache_mode(cache_images, prefix), prefix, full_size=bool(self.tiles),
                                 reduced_decode=reduced_decode)

    # ---- labels and images

    def _use_labels(self, found, single_cls):
        """Take the usable images and labels of a :class:`utils.dataset.label_cache.LabelSet`."""
        self.cache_hash = found.cache_hash
        self.im_files = found.im_files
        self.label_files = img2label_paths(self.im_files)
        self.labels = found.labels
        self.shapes = found.shapes
        self.orientations = found.orientations
        if single_cls:
            for lb in self.labels:
                lb[:, 0] = 0

    def _sort_for_rect(self, batch_size, img_size, stride, pad):
        """Order images by aspect ratio and give each batch the smallest stride-multiple shape (h, w)."""
        ar = self.shapes[:, 1] / self.shapes[:, 0]  # h / w
        order = ar.argsort()
        self.im_files = [self.im_files[i] for i in order]
        self.label_files = [self.label_files[i] for i in order]
        self.labels = [self.labels[i] for i in order]
        self.shapes = self.shapes[order]
        self.orientations = self.orientations[order]
        ar = ar[order]
        nb = self.batch[-1] + 1
        shapes = []
        for i in range(nb):
            ari = ar[self.batch == i]
            lo, hi = ari.min(), ari.max()
            shapes.append([hi, 1] if hi < 1 else [1, 1 / lo] if lo > 1 else [1, 1])
        self.batch_shapes = np.ceil(np.array(shapes) * img_size / stride + pad).astype(int) * stride

    def _group_by_own_shape(self, img_size, stride, pad):
        """Evaluation: each image gets the rect shape of a batch holding it alone, so its padding does not depend on
        its neighbours; ``self.batch`` then numbers groups of one shape (contiguous: the images are sorted by aspect
        ratio, and the shape is monotonic in it) and ``batch_shapes`` gives each group's (h, w). The batch sampler
        never mixes two groups in one batch."""
        ar = self.shapes[:, 1] / self.shapes[:, 0]  # h / w, ascending
        scale = np.stack([np.minimum(ar, 1), np.where(ar > 1, 1 / ar, 1)], 1)
        own = np.ceil(scale * img_size / stride + pad).astype(int) * stride
        first = np.r_[True, (own[1:] != own[:-1]).any(1)] if self.n else np.zeros(0, bool)
        self.batch = np.cumsum(first) - 1
        self.batch_shapes = own[first]

    def shape_groups(self) -> list[range]:
        """Index ranges of images letterboxed to one shape (evaluation with ``shape_per_image``), in order."""
        starts = np.flatnonzero(np.r_[True, self.batch[1:] != self.batch[:-1]]).tolist() if self.n else []
        return [range(a, b) for a, b in zip(starts, starts[1:] + [self.n])]

    @property
    def ims(self):
        """RAM-cached images (None where not cached)."""
        return self.images.ims

    @property
    def npy_files(self):
        """Disk-cache file of each image (used with ``--cache disk``)."""
        return self.images.npy_files

    def load_image(self, i):
        """Image i resized so its long side is ``img_size`` -> ``(im (h, w, 3) BGR, (h0, w0), (h, w))``."""
        return self.images.load_image(i)

    # ---- samples

    def __len__(self):
        return self.n

    def _rng(self, index, epoch, draw, stream=0):
        return np.random.default_rng([self.seed, epoch, index, draw, stream])

    def _pixel_labels(self, i, w, h, padw=0.0, padh=0.0):
        """Labels of image i as (n, 5) float64 ``[cls, x1, y1, x2, y2]`` in a w x h image shifted by padding."""
        lb = self.labels[i].astype(np.float64)
        lb[:, 1:] = xywhn2xyxy(lb[:, 1:], w, h, padw, padh)
        return lb

    def _load_mosaic(self, index, rng):
        """Image ``index`` and three random partners as a perspective-warped img_size^2 mosaic -> (img, labels)."""
        hyp = self.hyp
        images, sizes, labels = [], [], []
        for i in [index, *rng.integers(0, self.n, size=3).tolist()]:
            im, size, lb = self._tile(i, rng) if self.tiles else self._mosaic_source(i)
            images.append(im)
            sizes.append(size)
            labels.append(lb)
        return mosaic(images, sizes, labels, self.img_size, rng, degrees=hyp["degrees"], translate=hyp["translate"],
                      scale=hyp["scale"], shear=hyp["shear"], perspective=hyp["perspective"],
                      min_box_px=hyp["min_box_px"])

    def _mosaic_source(self, i):
        """Image i for the mosaic: ``(base image, (h, w) after resizing, labels (n, 5) xyxy pixels of that size)``."""
        im, (h, w) = self.images.mosaic_source(i)
        return im, (h, w), self._pixel_labels(i, w, h)

    def _tile(self, i, rng):
        """A random tile of image i in the form of :meth:`_mosaic_source` (utils/dataset/tiles.py)."""
        im = self.images.base_image(i)
        h0, w0 = im.shape[:2]
        return sample_tile(im, self._pixel_labels(i, w0, h0), self.tiles, self.img_size, rng)

    def _load_letterboxed(self, index, rng):
        """Image ``index`` (or a tile of it) letterboxed to its batch shape (rect) or img_size; warped if augmenting."""
        if self.tiles:
            raw, size, labels = self._tile(index, rng)
            img, labels = letterbox_tile(raw, size, labels, self.img_size)
            shapes = None
        else:
            raw, (h0, w0), (h, w) = self.load_image(index)
            shape = self.batch_shapes[self.batch[index]] if self.rect else self.img_size
            img, ratio, pad = letterbox(raw, shape, auto=False, scaleup=self.augment)
            shapes = (h0, w0), ((h / h0, w / w0), pad)
            labels = self._pixel_labels(index, ratio[0] * w, ratio[1] * h, pad[0], pad[1])
        if self.augment:
            hyp = self.hyp
            img, labels = random_perspective(img, labels, rng, degrees=hyp["degrees"], translate=hyp["translate"],
                                             scale=hyp["scale"], shear=hyp["shear"], perspective=hyp["perspective"],
                                             min_box_px=hyp["min_box_px"])
            if img is raw:  # later steps write in place; never into the RAM cache
                img = raw.copy()
        return img, labels, shapes

    def _flip(self, img, labels, rng):
        """Vertical then horizontal flip with the hyp probabilities; ``labels`` (n, 5) normalised xywh."""
        if rng.random() < self.hyp["flipud"]:
            img = cv2.flip(img, 0)
            labels[:, 2] = 1 - labels[:, 2]
        if rng.random() < self.hyp["fliplr"]:
            img = cv2.flip(img, 1)
            labels[:, 1] = 1 - labels[:, 1]
        return img, labels

    def _parse_key(self, key):
        if isinstance(key, (tuple, list)):
            index, epoch, draw = (int(k) for k in key)
        else:
            index, epoch, draw = int(key), 0, 0
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} images")
        return index, epoch, draw

    def _augmented(self, index, rng):
        """Training sample: mosaic (+ mixup) or warped letterbox, HSV -> (img BGR, labels (n, 5) xyxy pixels)."""
        hyp = self.hyp
        use_mosaic = self.mosaic and rng.random() < hyp["mosaic"]
        lut = hsv_lut(rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
        if use_mosaic:
            img, labels = self._load_mosaic(index, rng)
            if rng.random() < hyp["mixup"]:
                img, labels = mixup(img, labels, *self._load_mosaic(int(rng.integers(0, self.n)), rng), rng)
        else:
            img, labels, _ = self._load_letterboxed(index, rng)
        if lut is not None:  # once on the output, as YOLOv5 does: fewer pixels than the sources it came from
            apply_hsv(img, lut, dst=img)
        return img, labels

    def __getitem__(self, key):
        index, epoch, draw = self._parse_key(key)
        if self.augment:
            rng = self._rng(index, epoch, draw)
            img, labels = self._augmented(index, rng)
            if self.hyp["copy_paste_small"] > 0:
                paste_rng = self._rng(index, epoch, draw, stream=PASTE_STREAM)
                img, labels = paste_small_objects(img, labels, paste_rng, self.hyp["copy_paste_small"])
            shapes = None
        else:
            img, labels, shapes = self._load_letterboxed(index, None)
        h, w = img.shape[:2]
        if len(labels):
            labels[:, 1:5] = xyxy2xywhn(labels[:, 1:5], w=w, h=h, clip=True, eps=1e-3)
        if self.augment:
            img, labels = self._flip(img, labels, rng)
        labels_out = torch.zeros((len(labels), 6))
        if len(labels):
            labels_out[:, 1:] = torch.from_numpy(labels)
        return torch.from_numpy(bgr_to_chw_rgb(img)), labels_out, self.im_files[index], shapes

    def __getitems__(self, keys):
        """A batch of samples; also carries one quad-collate draw per sample so quad stays deterministic."""
        batch = _KeyedBatch(self[k] for k in keys)
        batch.quad_draws = [self._rng(*self._parse_key(k), stream=QUAD_STREAM).random() for k in keys]
        return batch

    # ---- collation

    @staticmethod
    def collate_fn(batch):
        """Samples -> ``(imgs (bs, 3, h, w) uint8, targets (n, 6), paths, shapes)``; targets get their image index."""
        im, label, path, shapes = zip(*batch)
        for i, lb in enumerate(label):
            lb[:, 0] = i
        return torch.stack(im, 0), torch.cat(label, 0), path, shapes

    @staticmethod
    def collate_fn4(batch):
        """Quad collate: each group of 4 samples becomes one 2x image, either sample 0 upscaled or a 2x2 tile."""
        im, label, path, shapes = zip(*batch)
        draws = getattr(batch, "quad_draws", None) or np.random.default_rng(0).random(len(im)).tolist()
        n = -(-len(shapes) // 4)  # a short last batch still gives a (smaller) group
        im4, label4 = [], []
        y_off = torch.tensor([[0.0, 0, 0, 1, 0, 0]])
        x_off = torch.tensor([[0.0, 0, 1, 0, 0, 0]])
        half = torch.tensor([[1, 1, 0.5, 0.5, 0.5, 0.5]])
        for g in range(n):
            i = g * 4
            if draws[i] < 0.5 or i + 4 > len(im):  # too few samples left to tile: upscale the first
                up = F.interpolate(im[i].unsqueeze(0).float(), scale_factor=2.0, mode="bilinear", align_corners=False)
                im4.append(up[0].round().clamp_(0, 255).to(im[i].dtype))
                label4.append(label[i])
            else:
                top = torch.cat((im[i], im[i + 1]), 1)
                bottom = torch.cat((im[i + 2], im[i + 3]), 1)
                im4.append(torch.cat((top, bottom), 2))
                label4.append(torch.cat((label[i], label[i + 1] + y_off, label[i + 2] + x_off,
                                         label[i + 3] + y_off + x_off), 0) * half)
        for i, lb in enumerate(label4):
            lb[:, 0] = i
        return torch.stack(im4, 0), torch.cat(label4, 0), path[:n], shapes[:n]


class _KeyedBatch(list):
    """A list of samples with per-sample ``quad_draws`` (plain attribute; lives only inside one worker)."""

    quad_draws = None


def _worker_init(_worker_id):
    """Workers run one sample at a time (internal thread pools would only oversubscribe the cores) and leave
    Ctrl-C, SIGTERM and SIGUSR1 sent to the whole process group to the main process, which saves first."""
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    leave_stop_signals_to_the_main_process()


def _loader_dist_info(rank: int) -> DistInfo:
    """This loader's place in the job: ``rank`` as the caller gives it (-1: not sharded), the world from torchrun."""
    if rank < 0:
        return DistInfo()
    env = dist_info_from_env()
    return DistInfo(rank=rank, local_rank=env.local_rank, world_size=env.world_size)


def create_dataloader(path, imgsz, batch_size, stride, single_cls=False, hyp=None, augment=False, cache=False,
                      pad=0.0, rect=False, rank=-1, workers=8, image_weights=False, quad=False, prefix="",
                      shuffle=False, seed=0, nc=None, train_tiles=None, reduced_decode=False, global_batch=0,
                      shape_per_image=False):
    """Build ``(loader, dataset)`` (YOLOv5's signature plus ``nc``, which enables the class-id check,
    ``train_tiles``, the tile side for training on tiles of large images, and ``reduced_decode``, JPEGs decoded
    at 1/2, 1/4 or 1/8 scale when that still covers ``imgsz``; see utils/dataset/image_cache.py, and
    ``global_batch``: ``batch_size`` is then a micro-batch of steps of that many images, see sampling.py).
    ``shape_per_image`` (with ``rect``, for evaluation): each image letterboxed to its own rect shape and batches
    cut within groups of one shape, so no image's input depends on the batch size or its neighbours.

    Batches: ``(imgs uint8 (bs, 3, h, w) RGB, targets (n, 6) [img_idx, cls, x, y, w, h], paths, shapes)``.
    """
    if rect and shuffle:
        LOGGER.warning(f"{prefix}--rect is incompatible with shuffle, setting shuffle=False")
        shuffle = False
    info = _loader_dist_info(rank)
    with rank_zero_first(info):
        dataset = LoadImagesAndLabels(path, imgsz, batch_size, augment=augment, hyp=hyp, rect=rect,
                                      image_weights=image_weights, cache_images=cache, single_cls=single_cls,
                                      stride=int(stride), pad=pad, prefix=prefix, seed=seed, nc=nc,
                                      train_tiles=train_tiles, reduced_decode=reduced_decode,
                                      shape_per_image=shape_per_image)
    batch_size = min(batch_size, len(dataset))
    nw = min(os.cpu_count() or 1, batch_size, workers)
    sampler = DeterministicBatchSampler(dataset, batch_size, shuffle=shuffle, seed=seed, rank=info.rank,
                                        world_size=info.world_size, global_batch=global_batch)
    loader = DeterministicDataLoader(
        dataset, batch_sampler=sampler, num_workers=nw,
        pin_memory=torch.cuda.is_available() and read("PIN_MEMORY"),
        collate_fn=LoadImagesAndLabels.collate_fn4 if quad else LoadImagesAndLabels.collate_fn,
        worker_init_fn=_worker_init, persistent_workers=nw > 0,
        generator=torch.Generator().manual_seed(int(seed) % 2**63))  # keeps the global torch RNG untouched
    return loader, dataset

