"""Write a converted YOLO data set all or nothing: staging folder, summary, data YAML, then one rename.

Every converter feeds a :class:`DatasetWriter`. Images and label files go into a hidden staging folder
beside ``--out`` (``.NAME.partial-XXXX``); only when the whole conversion succeeded is that folder
renamed to ``--out``. An exception or Ctrl-C midway removes the staging folder, so ``--out`` is either
the previous complete conversion or the new complete one, never half written. Output depends only on
the input files and options (sorted order, no timestamps), so converting twice gives identical files.

Layout written: ``images/SPLIT/NAME``, ``labels/SPLIT/STEM.txt`` (``class xc yc w h``, normalised, six
decimals; empty for background images), ``NAME.yaml`` (``path: .``, so the folder can be moved) and
``conversion.yaml`` (format, options, counts; it also marks the folder as one this tool may replace).
A fold conversion (:meth:`DatasetWriter.publish_folds`) writes every image once into ``images/all``
and, per fold, two lists of those images (``folds/foldNN/train.txt``, ``val.txt``) and one data YAML.
"""

import contextlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import yaml

from utils.errors import UserError
from utils.logging import LOGGER

MARKER = "conversion.yaml"
SPLIT_ORDER = ("train", "val", "test")
POOL = "all"  # the one image folder of a fold conversion; each fold lists its train and val images from it


def check_out_folder(out: Path) -> None:
    """Refuse an ``--out`` that holds anything this tool did not write (nothing the user had is replaced)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"--out {out} is not empty and was not written by this converter (no {MARKER}); "
                        f"choose a new folder or empty it")


def yolo_row(cls: int, box, width: int, height: int):
    """``'cls xc yc w h'`` normalised from pixel ``box`` (x1, y1, x2, y2), clipped to the image.

    Returns None when nothing of the box is left inside the image (zero width or height after clipping).
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    x1, x2 = min(max(x1, 0.0), width), min(max(x2, 0.0), width)
    y1, y2 = min(max(y1, 0.0), height), min(max(y2, 0.0), height)
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        return None
    xc, yc = (x1 + x2) / 2 / width, (y1 + y2) / 2 / height
    return f"{cls} {xc:.6f} {yc:.6f} {(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}"


class DatasetWriter:
    """Collect images and labels into a staging folder; :meth:`publish` makes them ``--out`` in one rename.

    Use as a context manager: leaving the block with an exception deletes the staging folder.
    """

    def __init__(self, out, fmt: str, options: dict, link: bool = False):
        self.out = Path(out).resolve()
        check_out_folder(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.fmt, self.options, self.link = fmt, dict(options), link
        self.stage = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        self.images = Counter()  # split -> images written
        self.boxes = Counter()  # split -> boxes written
        self.dropped = Counter()  # reason -> boxes (or rows) not written
        self.skipped_images = 0
        self._names = set()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        shutil.rmtree(self.stage, ignore_errors=True)  # after publish() it is already renamed away
        return False

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` boxes (or rows) that were not converted, by reason."""
        if n:
            self.dropped[reason] += n

    def add_box(self, rows: list, cls: int, box, width: int, height: int) -> None:
        """Append box ``(x1, y1, x2, y2)`` as a YOLO row to ``rows``, or count it dropped when it has no area inside."""
        row = yolo_row(cls, box, width, height)
        if row is None:
            self.drop("zero size or outside the image")
        else:
            rows.append(row)

    def bad_row(self, where: str, reason: str) -> None:
        """Report one malformed annotation row (``where`` = ``file:line``) and count it; the rest goes on."""
        LOGGER.warning(f"{where}: {reason}; row skipped")
        self.dropped["malformed row"] += 1

    def no_image(self, where: str, n: int) -> None:
        """Report an annotation file (or group of rows) whose image is missing and count its ``n`` rows dropped."""
        if n:
            LOGGER.warning(f"{where}: {n} annotation rows but no image; dropped")
            self.drop("image missing", n)

    def orphan_files(self, folder: Path, stems: set) -> None:
        """Count the rows of every ``*.txt`` annotation file in ``folder`` whose image stem is not in ``stems``."""
        for label_file in sorted(folder.glob("*.txt")):
            if label_file.stem not in stems:
                lines = label_file.read_text(errors="replace").splitlines()
                self.no_image(str(label_file), sum(bool(line.strip()) for line in lines))

    def skip_image(self, where: str, reason: str) -> None:
        """Report one image that cannot be converted (missing, unreadable, broken annotation file)."""
        LOGGER.warning(f"{where}: {reason}; image skipped")
        self.skipped_images += 1

    def add(self, split: str, src_image: Path, name: str, rows: list, pixels: np.ndarray | None = None) -> None:
        """Write one image (a copy of ``src_image``, or ``pixels`` encoded in its format) and its label rows."""
        if split not in (*SPLIT_ORDER, POOL):
            raise ValueError(f"unknown split {split!r}")
        key = (split, Path(name).stem)
        if key in self._names:
            raise UserError(f"{src_image}: a second image named {Path(name).stem!r} in split '{split}'; "
                            f"rename one of them (labels are matched to images by file name)")
        self._names.add(key)
        image_dst = self.stage / "images" / split / name
        label_dst = self.stage / "labels" / split / f"{Path(name).stem}.txt"
        image_dst.parent.mkdir(parents=True, exist_ok=True)
        label_dst.parent.mkdir(parents=True, exist_ok=True)
        self._write_image(src_image, image_dst, pixels)
        label_dst.write_text("".join(f"{r}\n" for r in rows))
        self.images[split] += 1
        self.boxes[split] += len(rows)

    def _write_image(self, src: Path, dst: Path, pixels) -> None:
        """Copy (or hard-link with ``--link``) the source image; encode ``pixels`` when it was edited."""
        if pixels is not None:
            params = [cv2.IMWRITE_JPEG_QUALITY, 95] if dst.suffix.lower() in (".jpg", ".jpeg") else []
            ok, buf = cv2.imencode(dst.suffix, pixels, params)
            if not ok:
                raise UserError(f"{src}: cannot encode the edited image as {dst.suffix}")
            dst.write_bytes(buf.tobytes())
        elif self.link:
            try:
                os.link(src, dst)
            except OSError:  # another file system: fall back to a copy
                shutil.copyfile(src, dst)
        else:
            shutil.copyfile(src, dst)

    def summary(self) -> str:
        """One line: images per split, boxes, boxes dropped and why."""
        splits = ", ".join(f"{s} {self.images[s]}" for s in (*SPLIT_ORDER, POOL) if self.images[s])
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(self.dropped.items()))
        n_drop = sum(self.dropped.values())
        skipped = f", {self.skipped_images} images skipped" if self.skipped_images else ""
        return (f"{self.fmt}: {sum(self.images.values())} images ({splits or 'none'}){skipped}, "
                f"{sum(self.boxes.values())} boxes, {n_drop} dropped" + (f" ({reasons})" if reasons else ""))

    def publish(self, yaml_name: str, names: list, extra_files: dict | None = None,
                settings: dict | None = None) -> Path:
        """Write the data YAML (with ``settings`` such as ``max_det`` after ``names``), ``conversion.yaml``
        and ``extra_files`` (name -> dict), then swap into ``--out``.

        Returns the data YAML's final path. A conversion without images is a UserError.
        """
        if not sum(self.images.values()):
            raise UserError(f"{self.fmt}: no images were converted from the source folder; check --src "
                            f"(the expected layout is in docs/datasets.md)")
        data = {"path": ".", **self._split_entries(), "names": dict(enumerate(names)), **(settings or {})}
        self._dump(f"{yaml_name}.yaml", data)
        for file_name, content in (extra_files or {}).items():
            self._dump(file_name, content)
        self._dump(MARKER, {"format": self.fmt, "options": self.options,
                            "images": {s: self.images[s] for s in SPLIT_ORDER if self.images[s]},
                            "boxes": {s: self.boxes[s] for s in SPLIT_ORDER if self.images[s]},
                            "dropped": dict(sorted(self.dropped.items())), "images_skipped": self.skipped_images,
                            "names": list(names)})
        self._swap_into_place()
        yaml_path = self.out / f"{yaml_name}.yaml"
        LOGGER.info(f"{self.summary()} -> {yaml_path}")
        return yaml_path

    def publish_folds(self, yaml_name: str, names: list, folds: list) -> list:
        """Write one data YAML per fold (``{yaml_name}-foldNN.yaml``), its image lists and
        ``conversion.yaml``, then swap into ``--out``. Returns the data YAMLs' final paths.

        ``folds`` holds one ``{"train": [file names], "val": [file names]}`` per fold, the names being
        images added to the ``all`` split; a name in both lists of one fold is a ValueError.
        """
        written = {stem for split, stem in self._names if split == POOL}
        if not written:
            raise UserError(f"{self.fmt}: no images were converted from the source folder; check --src "
                            f"(the expected layout is in docs/datasets.md)")
        for k, fold in enumerate(folds, 1):
            for split in ("train", "val"):
                if not fold[split]:
                    raise UserError(f"{self.fmt}: fold {k} has no {split} images ({len(written)} images in all); "
                                    f"use fewer folds or check the fold files")
        yaml_names, counts = [], []
        for k, fold in enumerate(folds, 1):
            yaml_names.append(self._write_fold(k, fold, written, yaml_name, names))
            counts.append({split: len(fold[split]) for split in ("train", "val")})
        self._dump(MARKER, {"format": self.fmt, "options": self.options, "images": {POOL: self.images[POOL]},
                            "boxes": {POOL: self.boxes[POOL]}, "dropped": dict(sorted(self.dropped.items())),
                            "images_skipped": self.skipped_images, "names": list(names),
                            "folds": [{"data": y, **c} for y, c in zip(yaml_names, counts)]})
        self._swap_into_place()
        LOGGER.info(f"{self.summary()}, {len(folds)} folds -> {self.out / yaml_names[0]} ... {yaml_names[-1]}")
        return [self.out / y for y in yaml_names]

    def _write_fold(self, k: int, fold: dict, written: set, yaml_name: str, names: list) -> str:
        """``folds/foldNN/{train,val}.txt`` and the fold's data YAML; returns the YAML's file name."""
        train, val = sorted(fold["train"]), sorted(fold["val"])
        if set(train) & set(val) or not {Path(n).stem for n in train + val} <= written:
            raise ValueError(f"fold {k}: train and val must be disjoint lists of written images")
        folder = self.stage / "folds" / f"fold{k:02d}"
        folder.mkdir(parents=True)
        for split, files in (("train", train), ("val", val)):
            (folder / f"{split}.txt").write_text("".join(f"../../images/{POOL}/{n}\n" for n in files))
        file_name = f"{yaml_name}-fold{k:02d}.yaml"
        self._dump(file_name, {"path": ".", "train": f"folds/fold{k:02d}/train.txt",
                               "val": f"folds/fold{k:02d}/val.txt", "names": dict(enumerate(names))})
        return file_name

    def _split_entries(self) -> dict:
        """``train``/``val``/``test`` keys of the data YAML; without a val split, val is the train split."""
        entries = {s: f"images/{s}" for s in SPLIT_ORDER if self.images[s]}
        if "train" not in entries:
            raise UserError(f"{self.fmt}: no training images were found in the source; check --src")
        if "val" not in entries:
            LOGGER.warning(f"{self.fmt}: the source has no validation split; the data YAML validates on the "
                           f"training images (edit 'val:' once you have a held-out set)")
            entries["val"] = entries["train"]
        return entries

    def _dump(self, file_name: str, content: dict) -> None:
        (self.stage / file_name).write_text(yaml.safe_dump(content, sort_keys=False, allow_unicode=True))

    def _swap_into_place(self) -> None:
        """Rename the staging folder to ``--out``; a previous conversion there is moved aside, then deleted."""
        old = None
        if self.out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old-", dir=self.out.parent))
            os.replace(self.out, old / "previous")
        try:
            os.replace(self.stage, self.out)
        except BaseException:
            if old is not None:  # put the previous conversion back
                with contextlib.suppress(OSError):
                    os.replace(old / "previous", self.out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
