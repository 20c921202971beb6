"""Convert a data set you already have into this project's YOLO layout (offline; nothing is downloaded).

    python data/scripts/convert.py visdrone --src ~/data/VisDrone --out datasets/VisDrone
    python data/scripts/convert.py aitod --src ~/data/AI-TOD --out datasets/AI-TOD
    python data/scripts/convert.py vedai --src ~/data/VEDAI --out datasets/VEDAI
    python data/scripts/convert.py dota --src ~/data/DOTA --out datasets/DOTA
    python data/scripts/convert.py coco --src ~/data/coco --out datasets/coco
    python data/scripts/convert.py voc --src ~/data/VOC2012 --out datasets/VOC

``python data/scripts/convert.py FORMAT --help`` lists each format's options; docs/datasets.md has the
source layouts and what happens to ignored, crowd and difficult boxes.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.converters.cli import main  # noqa: E402  (needs ROOT on sys.path)

if __name__ == "__main__":
    main()
