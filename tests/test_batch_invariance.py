"""An image's predictions do not depend on the batch size or on the other images of its batch: val.py (the
COCO JSON and the metrics), detect.py, the Detector API, sliced inference, and the pieces they are built on."""

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from tests.support.checkpoints import NAMES
from tests.support.image_sets import noise
from utils.batch_invariance import aligned_batch_size, eval_micro_batch, forward_in_micro_batches, run_batch_invariant

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

# (h, w) of the generated held-out images: wide, tall and square, several of each so that batches can mix them;
# seven square ones share a shape, more than a CPU forward pass holds
MIXED_SIZES = [(48, 112), (64, 96), (96, 64), (80, 80), (112, 48), (56, 100), (100, 56), (70, 70), (40, 120),
               (90, 60), (60, 90), (64, 64), (120, 44), (76, 88), (88, 76), (50, 110), (110, 50), (72, 72), (66, 66),
               (96, 96), (58, 58)]


def write_mixed_set(root: Path) -> Path:
    """A data set of noisy images of :data:`MIXED_SIZES` with one or two boxes each; returns its data YAML."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i, (h, w) in enumerate(MIXED_SIZES):
        im = noise(h, w, seed=100 + i)
        cv2.rectangle(im, (w // 4, h // 4), (w // 2, h // 2), (255, 255, 255), -1)
        cv2.imwrite(str(images / f"{i}.png"), im)
        rows = [f"{i % len(NAMES)} 0.375 0.375 0.25 0.25"]
        if i % 2:
            rows.append(f"{(i + 1) % len(NAMES)} 0.7 0.7 0.2 0.3")
        (labels / f"{i}.txt").write_text("\n".join(rows) + "\n")
    yaml_file = root / "mixed.yaml"
    yaml_file.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return yaml_file


@pytest.fixture(scope="module")
def mixed_data(tmp_path_factory) -> Path:
    return write_mixed_set(tmp_path_factory.mktemp("mixed"))


@pytest.fixture(scope="module")
def varied_model(tiny_cfg):
    """A tiny 4-class model in eval mode whose confidences vary with the image (few exact ties) and are high
    enough that every image has detections."""
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(tiny_cfg, nc=len(NAMES))
    with torch.no_grad():
        for conv in model.model[-1].m:
            conv.weight.normal_(0, 0.5)
            conv.bias.view(model.model[-1].na, -1)[:, 4] += 7.0  # from the prior's about -8 to about -1
    return model.eval()


@pytest.fixture(scope="module")
def varied_weights(varied_model, tmp_path_factory) -> Path:
    from utils.training.checkpoints import save_checkpoint

    path = tmp_path_factory.mktemp("weights") / "varied.pt"
    save_checkpoint({"model_cfg": varied_model.yaml, "nc": len(NAMES), "names": NAMES,
                     "model": varied_model.state_dict(), "ema": None}, path)
    return path


# ----------------------------------------------------------------------------------------- building blocks

def test_micro_batches_pad_with_zero_images_and_keep_the_output_structure():
    calls = []

    def forward(x):
        calls.append(x.clone())
        return x.sum((1, 2, 3)), [x[:, :1] * 2, None]

    images = torch.arange(5 * 3 * 2 * 2, dtype=torch.float32).view(5, 3, 2, 2)
    sums, (first_channel, nothing) = forward_in_micro_batches(forward, images, 2)
    assert [len(c) for c in calls] == [2, 2, 2]  # every pass at the fixed size, the last padded
    assert torch.equal(calls[-1][1], torch.zeros(3, 2, 2)) and torch.equal(calls[-1][0], images[4])
    assert torch.equal(sums, images.sum((1, 2, 3))) and torch.equal(first_channel, images[:, :1] * 2)
    assert nothing is None
    assert eval_micro_batch("cpu") == 2 and eval_micro_batch(torch.device("cuda", 0)) == 8
    assert eval_micro_batch("cpu", fixed_shape=(2, 64, 64)) == 2  # a static export runs at its own batch


def test_batch_sizes_round_up_to_whole_forward_passes():
    assert [aligned_batch_size(b, 4) for b in (1, 3, 4, 5, 7, 16, 17)] == [4, 4, 4, 8, 8, 16, 20]
    assert [aligned_batch_size(b, 8) for b in (1, 8, 9)] == [8, 8, 16] and aligned_batch_size(5, 1) == 5


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_raw_outputs_of_an_image_are_bitwise_the_same_alone_padded_and_among_other_images(varied_model, chunk):
    """At a fixed pass of ``chunk`` images (the CPU's is 2): an image alone (padded with zero images) and at each
    place among ``chunk - 1`` other, different images (3 others in a pass of 4) gives the same bits, in the
    predictions and in every level's raw map."""
    image = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(11))
    others = torch.rand(chunk - 1, 3, 64, 96, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        alone = forward_in_micro_batches(varied_model, image, chunk)
        for place in range(chunk):
            batch = torch.cat((others[:place], image, others[place:]))
            together = forward_in_micro_batches(varied_model, batch, chunk)
            assert torch.equal(together[0][place], alone[0][0]), place
            assert all(torch.equal(t[place], a[0]) for t, a in zip(together[1], alone[1])), place
            assert not torch.equal(together[0][place - 1], alone[0][0])  # the neighbours are other images


def test_raw_outputs_of_an_image_are_bitwise_the_same_alone_and_in_batches_of_3_and_16(varied_model):
    images = torch.rand(16, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        alone = run_batch_invariant(varied_model, images[5:6])
        for batch in (images[3:6], images):
            together = run_batch_invariant(varied_model, batch)
            row = len(batch) - 11 if len(batch) == 16 else 2  # image 5's place in the batch
            assert torch.equal(together[0][row], alone[0][0])
            assert all(torch.equal(t[row], a[0]) for t, a in zip(together[1], alone[1]))


def test_each_image_gets_its_own_rect_shape_and_batches_never_mix_shapes(mixed_data):
    from utils.dataloaders import create_dataloader
    from utils.dataset.data_config import check_dataset

    val_images = check_dataset(mixed_data)["val"]
    shapes_by_file = {}
    for batch_size in (1, 3, 16):
        loader, dataset = create_dataloader(val_images, 64, batch_size, 16, rect=True, pad=0.5, workers=0,
                                            shape_per_image=True)
        for ims, _, paths, _ in loader:
            assert len(ims) <= batch_size
            for path in paths:
                assert shapes_by_file.setdefault(path, tuple(ims.shape[2:])) == tuple(ims.shape[2:]), path
        assert len(loader) == sum(-(-len(g) // batch_size) for g in dataset.shape_groups())
    assert len(shapes_by_file) == len(MIXED_SIZES) and len(set(shapes_by_file.values())) > 3
    for path, (h, w) in shapes_by_file.items():  # the YOLOv5 rect rule for a batch of this image alone
        h0, w0 = cv2.imread(path).shape[:2]
        ratio = h0 / w0
        scale = (ratio, 1) if ratio < 1 else (1, 1 / ratio)
        assert (h, w) == tuple(int(np.ceil(s * 64 / 16 + 0.5)) * 16 for s in scale), path


def test_every_forward_pass_of_validation_holds_the_same_images_at_any_batch_size(mixed_data, varied_model):
    """val.py's loader rounds --batch-size up to whole passes, so the passes (cut from each batch as the model
    runs it) start at the same images of each shape group whatever the batch size."""
    import val
    from utils.dataset.data_config import check_dataset

    chunk, data = eval_micro_batch("cpu"), check_dataset(mixed_data)
    passes = {}
    for batch_size in (1, 3, 5, 7, 16):
        loader = val._validation_loader(data, "val", 64, batch_size, varied_model, "cpu", False, 0)
        passes[batch_size] = [paths[i:i + chunk] for _, _, paths, _ in loader for i in range(0, len(paths), chunk)]
    groups = loader.dataset.shape_groups()
    assert max(len(g) for g in groups) > chunk and any(len(g) % chunk for g in groups)  # full and padded passes
    assert all(p == passes[1] for p in passes.values())


def test_detect_and_slicing_cut_batches_into_whole_forward_passes(varied_model):
    import detect
    from utils.slicing import sliced_predictor

    chunk, cpu = eval_micro_batch("cpu"), torch.device("cpu")
    for batch_size in (0, 1, 3, 5, 7, 16):
        frames = detect.frames_per_batch(batch_size, cpu, [64, 64], visualizing=False)
        tiles = sliced_predictor(varied_model, 64, slice_batch=batch_size or 1, imgsz=64, stride=16).batch_size
        assert frames % chunk == 0 and tiles % chunk == 0 and max(batch_size, 1) <= min(frames, tiles)
    assert detect.frames_per_batch(3, cpu, [64, 64], visualizing=True) == chunk  # --visualize: one pass
    assert detect.frames_per_batch(3, cpu, [64, 64], visualizing=False, fixed_shape=(3, 64, 64)) == 3


# ----------------------------------------------------------------------------------------- entry points

@pytest.mark.slow
def test_val_writes_the_same_predictions_and_metrics_at_batch_sizes_1_3_5_7_and_16(mixed_data, varied_weights, tmp_path):
    import val

    digests, metrics = set(), set()
    for batch_size in (1, 3, 5, 7, 16):
        result = val.run(mixed_data, weights=str(varied_weights), batch_size=batch_size, imgsz=64, device="cpu",
                         workers=0, save_json=True, plots=False, project=tmp_path, name=f"bs{batch_size}")
        predictions = (tmp_path / f"bs{batch_size}" / "varied_predictions.json").read_bytes()
        assert len(predictions) > 1000  # there are detections to compare
        digests.add(hashlib.sha256(predictions).hexdigest())
        metrics.add(tuple(result.metrics[:4]))
    assert len(digests) == 1 and len(metrics) == 1


@pytest.mark.slow
def test_detect_labels_do_not_depend_on_the_batch_size(mixed_data, varied_weights, tmp_path):
    import detect

    source = mixed_data.parent / "images" / "val"
    labels = []
    for batch_size in (1, 3, 5, 7, 16):
        run = detect.run(str(varied_weights), str(source), imgsz=(64,), conf_thres=0.05, batch_size=batch_size,
                         save_txt=True, save_conf=True, nosave=True, project=tmp_path, name=f"bs{batch_size}")
        labels.append({f.name: f.read_bytes() for f in sorted((run / "labels").glob("*.txt"))})
    assert len(labels[0]) == len(MIXED_SIZES) and all(other == labels[0] for other in labels[1:])


def test_detector_on_a_list_gives_each_image_what_it_gets_alone(mixed_data, varied_weights):
    from models import Detector

    detector = Detector(varied_weights, imgsz=64, conf=0.05)
    files = sorted((mixed_data.parent / "images" / "val").glob("*.png"))[:6]
    together = detector(files)
    for file, listed in zip(files, together):
        alone = detector(file)
        assert len(alone) > 0 and np.array_equal(listed.boxes, alone.boxes)
        assert np.array_equal(listed.scores, alone.scores) and np.array_equal(listed.classes, alone.classes)


def test_sliced_inference_tiles_do_not_depend_on_the_slice_batch(varied_model):
    from utils.slicing import sliced_predictor

    image = noise(150, 230, seed=7)
    runs = [sliced_predictor(varied_model, 64, slice_overlap=0.25, slice_batch=tiles, conf_thres=0.05, imgsz=64,
                             stride=16)(image) for tiles in (1, 3, 5, 7, 16)]
    assert len(runs[0]) > 0
    assert all(torch.equal(run, runs[0]) for run in runs[1:])
