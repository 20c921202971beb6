"""The tiny model YAML in the FFCA-YOLO authors' FFM arithmetic, and a reader of a YAML's FFM arithmetic."""

from pathlib import Path

AUTHORS_CFG = Path(__file__).resolve().parents[1] / "models" / "tiny_authors.yaml"


def ffm_arithmetic(cfg: dict) -> list:
    """The ``arithmetic`` argument of each FFM row of a model YAML dict (None when the row has none)."""
    return [(row[3][1:] or [None])[0] for row in cfg["head"] if str(row[2]).startswith("FFM")]
