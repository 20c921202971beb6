"""AutoAnchor: check how well a model's anchors fit a data set's boxes and re-fit them if needed.

YOLOv5's method: the fit of an anchor to a box is the worse of the two side ratios
``min(w / a_w, a_w / w, h / a_h, a_h / h)``; a box is "recalled" when some anchor fits it
better than ``1 / thr``. Best possible recall (BPR) is the share of recalled boxes. When BPR is
below 0.98, or when the model YAML gave ``anchors:`` as a count (placeholder anchors, as
FFCA-YOLO's YAMLs do), new anchors come from k-means on the box sizes refined by a genetic
search. Every random draw comes from a ``numpy.random.Generator`` seeded by the caller, so
anchors are identical for the same seed and data (and on every DDP rank).
"""

import numpy as np
import torch

from utils.errors import UserError
from utils.logging import LOGGER, colorstr
from utils.torch_utils import de_parallel

PREFIX = colorstr("AutoAnchor: ")
BPR_TARGET = 0.98
MIN_BOX_PIXELS = 2.0  # boxes smaller than this on both sides carry no usable shape information
SMALL_BOX_PIXELS = 3.0
KMEANS_ITERATIONS = 30
KMEANS_RESTARTS = 3
MUTATION_PROB, MUTATION_SIGMA = 0.9, 0.1


def anchor_ratio_metric(wh: np.ndarray, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fit of every box to every anchor, and each box's best fit.

    ``wh`` is ``(N, 2)`` box sizes, ``anchors`` ``(K, 2)``, both in pixels. Returns ``x`` of shape
    ``(N, K)`` with ``min(r, 1/r)`` over both sides (1 = perfect, 0 = hopeless) and ``best`` ``(N,)``.
    """
    x = np.minimum(_side_ratio(wh[:, :1], anchors[:, 0]), _side_ratio(wh[:, 1:], anchors[:, 1]))
    return x, x.max(1)


def _side_ratio(box_side: np.ndarray, anchor_side: np.ndarray) -> np.ndarray:
    """``min(r, 1/r)`` written as smaller / larger: no division by zero for zero-sized boxes or anchors."""
    return np.minimum(box_side, anchor_side) / np.maximum(np.maximum(box_side, anchor_side), 1e-9)


def anchor_stats(wh: np.ndarray, anchors: np.ndarray, thr: float) -> tuple[float, float]:
    """Best possible recall and mean number of anchors above threshold per box."""
    x, best = anchor_ratio_metric(wh, anchors)
    bpr = float((best > 1 / thr).mean())
    aat = float((x > 1 / thr).sum(1).mean())
    return bpr, aat


def dataset_box_sizes(dataset, imgsz: int, scale: np.ndarray | None = None) -> np.ndarray:
    """All label sizes ``(N, 2)`` in pixels once each image is resized so its long side is ``imgsz``.

    ``scale`` is an optional ``(num_images, 1)`` per-image factor (AutoAnchor's size jitter).
    """
    shapes = np.asarray(dataset.shapes, dtype=np.float64)
    if len(shapes) != len(dataset.labels):
        raise UserError(f"data set has {len(shapes)} image shapes but {len(dataset.labels)} label arrays")
    shapes = imgsz * shapes / shapes.max(1, keepdims=True)
    if scale is not None:
        shapes = shapes * scale
    sizes = [np.asarray(labels, dtype=np.float64).reshape(-1, 5)[:, 3:5] * s
             for s, labels in zip(shapes, dataset.labels)]
    return np.concatenate(sizes, 0) if sizes else np.zeros((0, 2))


@torch.no_grad()
def check_anchor_order_stride_units(detect) -> bool:
    """Reverse the level order of ``detect.anchors`` (stride units) if their pixel areas run against the strides.

    The pixel anchors (``anchors * stride``) move between levels, as in YOLOv5's check_anchor_order,
    so each level keeps its own stride. Returns True when the anchors were reordered.
    """
    stride = detect.stride.view(-1, 1, 1)
    pixels = detect.anchors * stride
    area = pixels.prod(-1).mean(-1)
    area_change = area[-1] - area[0]
    stride_change = detect.stride[-1] - detect.stride[0]
    if area_change and area_change.sign() != stride_change.sign():
        detect.anchors[:] = pixels.flip(0) / stride
        return True
    return False


def has_placeholder_anchors(model) -> bool:
    """True when the model YAML gave ``anchors:`` as a count per level rather than sizes."""
    yaml_dict = getattr(model, "yaml", None) or {}
    anchors = yaml_dict.get("anchors")
    return isinstance(anchors, int) and not isinstance(anchors, bool)


def check_anchors(dataset, model, thr: float = 4.0, imgsz: int = 640, seed: int = 0,
                  scale: np.ndarray | None = None) -> bool:
    """Check the model's anchors against ``dataset`` and replace them in place when k-means does better.

    Placeholder anchors (``anchors:`` given as an integer) are always replaced. ``scale`` (N, 1) is an
    optional per-image factor on the box sizes (training tiles show boxes larger). Returns True when
    the anchors changed.
    """
    model = de_parallel(model)
    detect = model.model[-1]
    rng = np.random.default_rng(seed)
    jitter = rng.uniform(0.9, 1.1, size=(len(dataset.shapes), 1))
    wh = dataset_box_sizes(dataset, imgsz, jitter if scale is None else jitter * scale)
    if not len(wh):
        LOGGER.warning(f"{PREFIX}no labels in the data set, anchors left as they are")
        return False

    stride = detect.stride.to(detect.anchors.device).view(-1, 1, 1)
    current = (detect.anchors.detach() * stride).cpu().view(-1, 2).double().numpy()
    placeholder = has_placeholder_anchors(model)
    bpr, aat = anchor_stats(wh, current, thr)
    if placeholder:
        LOGGER.info(f"{PREFIX}model YAML gives anchors as a count, computing them from the data set")
    else:
        LOGGER.info(f"{PREFIX}{aat:.2f} anchors/target, {bpr:.3f} Best Possible Recall (BPR)")
        if bpr >= BPR_TARGET:
            LOGGER.info(f"{PREFIX}current anchors are a good fit to the data set ✅")
            return False
        LOGGER.info(f"{PREFIX}anchors are a poor fit to the data set ⚠️, attempting to improve...")

    new = kmean_anchors(dataset, n=current.shape[0], img_size=imgsz, thr=thr, gen=1000, seed=seed, verbose=False,
                        scale=scale)
    new_bpr, _ = anchor_stats(wh, new.astype(np.float64), thr)
    if not placeholder and new_bpr <= bpr:
        LOGGER.info(f"{PREFIX}k-means anchors are not better than the current ones, keeping the current anchors")
        return False

    _install_anchors(detect, new, stride)
    _record_anchors_in_yaml(model, detect)
    LOGGER.info(f"{PREFIX}new anchors saved to the model (BPR {new_bpr:.4f}): "
                + ", ".join(f"{w:.0f},{h:.0f}" for w, h in new))
    return True


def _install_anchors(detect, anchors_px: np.ndarray, stride: torch.Tensor) -> None:
    """Write pixel anchors (sorted small to large) into ``detect.anchors`` in stride units."""
    buffer = detect.anchors
    with torch.no_grad():
        buffer[:] = torch.as_tensor(anchors_px, device=buffer.device, dtype=buffer.dtype).view_as(buffer)
        buffer /= stride.to(buffer.dtype).view(-1, 1, 1)
    check_anchor_order_stride_units(detect)


def _record_anchors_in_yaml(model, detect) -> None:
    """Write the fitted pixel anchors into ``model.yaml`` so a checkpoint's model configuration carries them.

    Without this a model rebuilt from the saved configuration would still say ``anchors: N`` and
    AutoAnchor would discard the fitted anchors of transferred weights.
    """
    if not isinstance(getattr(model, "yaml", None), dict):
        return
    pixels = (detect.anchors.detach() * detect.stride.to(detect.anchors.device).view(-1, 1, 1)).cpu()
    model.yaml["anchors"] = [[round(float(v), 2) for v in level.flatten()] for level in pixels]


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, iterations: int = KMEANS_ITERATIONS,
           restarts: int = KMEANS_RESTARTS) -> np.ndarray:
    """Deterministic k-means (k-means++ seeding, Lloyd updates) returning ``(k, D)`` centroids.

    Runs ``restarts`` times from different seeds drawn from ``rng`` and keeps the lowest distortion.
    """
    if k > len(points):
        raise ValueError(f"k-means needs at least k={k} points, got {len(points)}")
    best, best_distortion = None, np.inf
    for _ in range(restarts):
        centroids = _kmeans_plus_plus(points, k, rng)
        for _ in range(iterations):
            assignment = _nearest(points, centroids)
            updated = _update_centroids(points, centroids, assignment)
            converged = np.allclose(updated, centroids)
            centroids = updated
            if converged:
                break
        distortion = float(np.sqrt(((points - centroids[_nearest(points, centroids)]) ** 2).sum(1)).mean())
        if distortion < best_distortion:
            best, best_distortion = centroids, distortion
    return best


def _nearest(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid for each point."""
    return ((points[:, None, :] - centroids[None]) ** 2).sum(2).argmin(1)


def _kmeans_plus_plus(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding: each next centre drawn with probability proportional to squared distance."""
    centroids = [points[rng.integers(len(points))]]
    for _ in range(1, k):
        d2 = ((points[:, None, :] - np.asarray(centroids)[None]) ** 2).sum(2).min(1)
        total = d2.sum()
        index = rng.choice(len(points), p=d2 / total) if total > 0 else rng.integers(len(points))
        centroids.append(points[index])
    return np.asarray(centroids, dtype=np.float64)


def _update_centroids(points: np.ndarray, centroids: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """Mean of each cluster; an empty cluster takes the point farthest from its centroid."""
    updated = centroids.copy()
    for j in range(len(centroids)):
        members = points[assignment == j]
        if len(members):
            updated[j] = members.mean(0)
        else:
            # an empty cluster would silently lose an anchor; re-seed it where the fit is worst
            far = ((points - centroids[assignment]) ** 2).sum(1).argmax()
            updated[j] = points[far]
    return updated


def kmean_anchors(dataset, n: int = 9, img_size: int = 640, thr: float = 4.0, gen: int = 1000, seed: int = 0,
                  verbose: bool = True, scale: np.ndarray | None = None) -> np.ndarray:
    """Anchors ``(n, 2)`` in pixels, sorted by area, fitted to ``dataset`` at ``img_size`` (``scale``: as in
    :func:`check_anchors`).

    k-means on whitened box sizes, then ``gen`` generations of YOLOv5's genetic mutation keeping
    the anchors whenever fitness (mean best-ratio of boxes fitting better than ``1 / thr``)
    improves. All randomness comes from ``np.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    wh_all = dataset_box_sizes(dataset, img_size, scale)
    if not len(wh_all):
        raise UserError("cannot compute anchors: the data set has no labels")
    small = int((wh_all < SMALL_BOX_PIXELS).any(1).sum())
    if small:
        LOGGER.warning(f"{PREFIX}extremely small objects: {small} of {len(wh_all)} labels "
                       f"are under {SMALL_BOX_PIXELS:g} pixels at image size {img_size}")
    wh = wh_all[(wh_all >= MIN_BOX_PIXELS).any(1)]
    if len(wh) < len(wh_all):
        LOGGER.warning(f"{PREFIX}ignoring {len(wh_all) - len(wh)} labels under "
                       f"{MIN_BOX_PIXELS:g} pixels on both sides for k-means")
    if not len(wh):
        raise UserError(f"cannot compute anchors: every label is under {MIN_BOX_PIXELS:g} pixels "
                        f"at --imgsz {img_size}")

    anchors = _initial_anchors(wh, n, img_size, rng)
    anchors = _evolve_anchors(wh, anchors, thr, gen, rng)
    anchors = anchors[np.argsort(anchors.prod(1))]
    if verbose:
        _log_anchor_summary(wh_all, anchors, thr, img_size)
    return anchors.astype(np.float32)


def _initial_anchors(wh: np.ndarray, n: int, img_size: int, rng: np.random.Generator) -> np.ndarray:
    """k-means anchors on whitened sizes; random sizes when there are fewer boxes than anchors."""
    spread = wh.std(0)
    if n <= len(np.unique(wh, axis=0)) and (spread > 0).all():
        LOGGER.info(f"{PREFIX}running k-means for {n} anchors on {len(wh)} points...")
        return kmeans(wh / spread, n, rng) * spread
    LOGGER.warning(f"{PREFIX}k-means needs {n} distinct box sizes, found fewer; "
                   "using random initial anchors")
    return np.sort(rng.random(n * 2)).reshape(n, 2) * img_size


def anchor_fitness(wh: np.ndarray, anchors: np.ndarray, thr: float) -> float:
    """YOLOv5's genetic fitness: mean best ratio, counting only boxes that fit better than ``1 / thr``."""
    _, best = anchor_ratio_metric(wh, anchors)
    return float((best * (best > 1 / thr)).mean())


def _evolve_anchors(wh: np.ndarray, anchors: np.ndarray, thr: float, gen: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Genetic refinement: multiply anchors by random factors, keep a mutation only if fitness rises."""
    wh = wh.astype(np.float32)
    anchors = anchors.astype(np.float32)
    fitness = anchor_fitness(wh, anchors, thr)
    shape = anchors.shape
    for _ in range(gen):
        factors = np.ones(shape)
        while (factors == 1).all():  # a mutation that changes nothing would waste a generation
            mutate = rng.random(shape) < MUTATION_PROB
            factors = (mutate * rng.random() * rng.standard_normal(shape) * MUTATION_SIGMA + 1).clip(0.3, 3.0)
        candidate = (anchors * factors).clip(min=MIN_BOX_PIXELS).astype(np.float32)
        candidate_fitness = anchor_fitness(wh, candidate, thr)
        if candidate_fitness > fitness:
            fitness, anchors = candidate_fitness, candidate
    return anchors


def _log_anchor_summary(wh: np.ndarray, anchors: np.ndarray, thr: float, img_size: int) -> None:
    """Log recall statistics and the anchors in the YAML's ``w,h`` style."""
    bpr, aat = anchor_stats(wh, anchors.astype(np.float64), thr)
    x, best = anchor_ratio_metric(wh, anchors.astype(np.float64))
    above = x * (x > 1 / thr)
    LOGGER.info(f"{PREFIX}thr={1 / thr:.2f}: {bpr:.4f} best possible recall, {aat:.2f} anchors past thr")
    LOGGER.info(f"{PREFIX}n={len(anchors)}, img_size={img_size}, "
                f"metric_all={x.mean():.3f}/{best.mean():.3f}-mean/best, past_thr={above[above > 0].mean() if (above > 0).any() else 0.0:.3f}-mean: "
                + ", ".join(f"{round(w)},{round(h)}" for w, h in anchors))
