"""The "photos" small-object data set: objects cut from real photographs, pasted small onto other photographs.

A third kind beside the drawn geometry of ``shapes`` and the stroke characters of ``glyphs``, whose pixels
are all real image content. The photographs are the ones scikit-image ships inside its package
(``skimage/data``; read as files, nothing is downloaded). Five classes, each cut from its own photo
(a cat's face, a cup of coffee, an astronaut's face, a rocket on its launch pad, a motorcycle): every
object is a random window of 70-100 % of its class's region, at a random scale (longer side log-uniform
in ``sides``), mirrored at random, with jittered brightness and contrast, and blended in with feathered
edges. Backgrounds are random crops of texture and scene photos (grass, gravel, brick, the moon, the
Hubble deep field, a retina, a stained tissue slide), tinted when grey. About one unlabelled patch per two
objects, cut the same way from photos of no class (the cameraman, coins, a page of text, the background
photos themselves), so a pasted patch is not an object by its edges alone.
"""

from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from utils.dataset.synthetic.build import build_yolo_set
from utils.dataset.synthetic.shapes import overlaps
from utils.errors import UserError

NAMES = ("cat", "cup", "face", "rocket", "motorcycle")
# Each class's region (x0, y0, x1, y1) in its source photo, pixels.
OBJECTS = {
    "cat": ("chelsea.png", (50, 0, 420, 300)),
    "cup": ("coffee.png", (100, 0, 560, 380)),
    "face": ("astronaut.png", (150, 0, 310, 190)),
    "rocket": ("rocket.jpg", (280, 110, 360, 410)),
    "motorcycle": ("motorcycle_left.png", (80, 140, 700, 480)),
}
BACKGROUNDS = ("grass.png", "gravel.png", "brick.png", "moon.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png")
DISTRACTORS = ("camera.png", "coins.png", "page.png", *BACKGROUNDS)
IMG_SIZE = 256
MIN_SIDE, MAX_SIDE = 8, 24
OBJECTS_PER_IMAGE = (4, 12)
MIN_WINDOW = 0.7  # an object is a window of at least this share of its region's width and height
FEATHER = 0.15  # share of a patch's side over which its edge fades into the background
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "photos"


def photo_folder() -> Path:
    """scikit-image's bundled photos; one clear line when the package is missing."""
    spec = find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the 'photos' data kind cuts its images from the photos bundled with scikit-image; "
                        "install it: pip install scikit-image")
    return Path(spec.submodule_search_locations[0]) / "data"


@lru_cache(maxsize=None)
def photo(name: str) -> np.ndarray:
    """(h, w, 3) float32 BGR of a bundled photo (grey ones as three equal channels); cached per process."""
    path = photo_folder() / name
    im = read_bgr(path)
    if im is None:
        raise UserError(f"{path}: missing or unreadable; the 'photos' data kind needs scikit-image >= 0.19 with its "
                        "bundled photos")
    return im.astype(np.float32)


def read_bgr(path: Path) -> np.ndarray | None:
    """(h, w, 3) uint8 BGR, or None where unreadable. PNGs go through Pillow: the pixels are the same as
    OpenCV's, but OpenCV's libpng prints a warning on stderr for page.png's colour profile in every process."""
    if path.suffix.lower() != ".png":
        return cv2.imread(str(path), cv2.IMREAD_COLOR)
    try:
        with Image.open(path) as im:
            return np.ascontiguousarray(np.asarray(im.convert("RGB"))[..., ::-1])
    except OSError:
        return None


def is_grey(im: np.ndarray) -> bool:
    return bool(np.abs(im[..., 0] - im[..., 2]).mean() < 1 and np.abs(im[..., 0] - im[..., 1]).mean() < 1)


def background(rng, size: int) -> np.ndarray:
    """(size, size, 3) float32 BGR: a random square crop (30-100 % of the shorter side) of a background photo,
    mirrored at random; grey photos get a random tint."""
    im = photo(BACKGROUNDS[int(rng.integers(0, len(BACKGROUNDS)))])
    h, w = im.shape[:2]
    side = int(min(h, w) * rng.uniform(0.3, 1.0))
    y0, x0 = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    crop = cv2.resize(im[y0:y0 + side, x0:x0 + side], (size, size), interpolation=cv2.INTER_AREA)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    if is_grey(crop):
        crop = crop * rng.uniform(0.5, 1.2, 3).astype(np.float32)
    return np.ascontiguousarray(crop)


def cut(rng, im: np.ndarray, region: tuple, side: float) -> np.ndarray:
    """A random window of ``region`` (70-100 % of each side) resized so its longer side is ``side`` px,
    mirrored at random, brightness and contrast jittered: (h, w, 3) float32."""
    x0, y0, x1, y1 = region
    w, h = int((x1 - x0) * rng.uniform(MIN_WINDOW, 1)), int((y1 - y0) * rng.uniform(MIN_WINDOW, 1))
    left, top = x0 + int(rng.integers(0, x1 - x0 - w + 1)), y0 + int(rng.integers(0, y1 - y0 - h + 1))
    scale = side / max(w, h)
    size = (max(int(round(w * scale)), 2), max(int(round(h * scale)), 2))
    patch = cv2.resize(im[top:top + h, left:left + w], size, interpolation=cv2.INTER_AREA)
    if rng.random() < 0.5:
        patch = patch[:, ::-1]
    mean = patch.mean()
    return (patch - mean) * rng.uniform(0.7, 1.3) + mean * rng.uniform(0.7, 1.3)


def feathered_alpha(h: int, w: int) -> np.ndarray:
    """(h, w, 1) float32 alpha: 1 inside, falling linearly to about 0.3 over the outer FEATHER of each side."""
    def ramp(n):
        edge = max(n * FEATHER, 1.0)
        d = np.minimum(np.arange(n) + 0.5, n - np.arange(n) - 0.5)
        return np.clip(0.3 + 0.7 * d / edge, 0, 1).astype(np.float32)
    return (ramp(h)[:, None] * ramp(w)[None, :])[..., None]


def paste(im: np.ndarray, patch: np.ndarray, x0: int, y0: int) -> None:
    """Blend ``patch`` into ``im`` at top-left (x0, y0) with feathered edges, in place."""
    h, w = patch.shape[:2]
    a = feathered_alpha(h, w)
    region = im[y0:y0 + h, x0:x0 + w]
    region[:] = region * (1 - a) + patch * a


def sample_patch(rng, labelled: bool, sides) -> tuple[int, np.ndarray]:
    """(class, patch) of a labelled object, or (-1, patch) of an unlabelled one from a photo of no class."""
    side = float(np.exp(rng.uniform(np.log(sides[0]), np.log(sides[1]))))
    if labelled:
        cls = int(rng.integers(0, len(NAMES)))
        name, region = OBJECTS[NAMES[cls]]
        return cls, cut(rng, photo(name), region, side)
    im = photo(DISTRACTORS[int(rng.integers(0, len(DISTRACTORS)))])
    h, w = im.shape[:2]
    window = int(min(h, w) * rng.uniform(0.1, 0.4))  # object-like share of a scene, not the whole photo
    x0, y0 = int(rng.integers(0, w - window + 1)), int(rng.integers(0, h - window + 1))
    return -1, cut(rng, im, (x0, y0, x0 + window, y0 + window), side)


def make_photo_image(rng, size=IMG_SIZE, sides=(MIN_SIDE, MAX_SIDE), objects=OBJECTS_PER_IMAGE):
    """One image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``."""
    im = background(rng, size)
    taken, labels = [], []
    n_objects = int(rng.integers(objects[0], objects[1] + 1))
    for j in range(n_objects + n_objects // 2):
        cls, patch = sample_patch(rng, j < n_objects, sides)
        h, w = patch.shape[:2]
        for _attempt in range(20):
            x0, y0 = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
            if not overlaps((x0, y0, x0 + w, y0 + h), taken, margin=1):
                break
        else:
            continue
        paste(im, patch, x0, y0)
        taken.append((x0, y0, x0 + w, y0 + h))
        if cls >= 0:
            labels.append((cls, (x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size))
    im += rng.normal(0.0, rng.uniform(2, 6), im.shape).astype(np.float32)  # sensor noise over everything
    return np.clip(im, 0, 255).astype(np.uint8), np.array(labels, dtype=np.float64).reshape(-1, 5)


def make_photos(root=DEFAULT_ROOT, n_train=256, n_val=64, seed=0, **image_options) -> Path:
    """Generate the data set into ``root`` (must not exist or be empty) and write ``<root>.yaml``; returns it.

    ``image_options``: ``size``, ``sides``, ``objects`` of :func:`make_photo_image`.
    """
    photo_folder()  # a missing scikit-image is one line before any folder is made
    return build_yolo_set(root, NAMES, make_photo_image, (8,), n_train, n_val, seed, **image_options)
