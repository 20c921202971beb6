"""Short in-process training runs (train.run) with fast CPU defaults."""

import train

FAST = dict(imgsz=64, batch_size=8, workers=0, device="cpu", noautoanchor=False, exist_ok=True)


def train_run(tmp_path, data, cfg, name="exp", **kwargs):
    """train.run with fast defaults; returns the run folder."""
    options = {**FAST, "cfg": str(cfg), "data": str(data), "epochs": 2, "project": str(tmp_path), "name": name}
    options.update(kwargs)
    train.run(**options)
    return tmp_path / name
