"""Running another YOLOv5-family project's scripts (upstream YOLOv5, the FFCA-YOLO authors' code) offline."""

import shutil
from pathlib import Path


def offline_config_folder(folder: Path) -> Path:
    """``folder`` made a YOLOv5 config folder holding Arial.ttf (matplotlib's DejaVuSans under that name), for
    ``YOLOV5_CONFIG_DIR``: YOLOv5-family code downloads that font otherwise, and nothing may download here."""
    import matplotlib

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf", folder / "Arial.ttf")
    return folder
