"""The start-up audit's cache: JSON round trip, a key that follows every input, damage, and reuse by train.py."""

import json
from pathlib import Path

import pytest
import torch

import train
import utils.determinism.audit_cache as audit_cache
from models.yolo import Model
from tests.support.nondeterministic_module import write_put_model_yaml
from tests.support.run_outputs import weights_checksum
from utils.determinism.audit_cache import audit_key, cache_dir, cache_file, cached_audit
from utils.determinism.op_audit import AuditReport, audit_model, detection_loss
from utils.files import yaml_load

ROOT = Path(__file__).resolve().parents[1]
HYP = yaml_load(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml")
KEY_SETTINGS = dict(mode="scoped", imgsz=64, device="cpu", batch_size=2, amp=False, hyp=HYP)


@pytest.fixture
def cache_folder(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "audit-cache"
    monkeypatch.setenv(audit_cache.CACHE_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def put_report(tmp_path_factory) -> AuditReport:
    """A report with findings: the PutGradient model's backward uses put_ (non-deterministic on every device)."""
    model = Model(write_put_model_yaml(tmp_path_factory.mktemp("put")))
    return audit_model(model, imgsz=32, loss_factory=detection_loss(HYP))


def test_report_survives_a_json_round_trip(put_report):
    assert put_report.findings and put_report.op_counts["backward"] > 0
    data = json.loads(json.dumps(put_report.to_dict()))
    again = AuditReport.from_dict(data)
    assert again == put_report
    assert again.to_dict() == put_report.to_dict()
    assert again.applicable() == put_report.applicable()


@pytest.mark.parametrize("damage", [
    lambda d: d.pop("findings"),
    lambda d: d["findings"][0].update(phase="sideways"),
    lambda d: d["findings"][0].update(devices="cuda"),
    lambda d: d.update(op_counts=[1, 2]),
    lambda d: d.update(imgsz="big"),
])
def test_malformed_report_data_is_refused(put_report, damage):
    data = put_report.to_dict()
    damage(data)
    with pytest.raises((ValueError, KeyError, TypeError, AttributeError)):
        AuditReport.from_dict(data)


def _key(cfg, **changes) -> dict:
    model = Model(cfg)
    freeze = changes.pop("freeze", None)
    if freeze:
        model.model[0].conv.weight.requires_grad = False
    return audit_key(model, **{**KEY_SETTINGS, **changes})


@pytest.mark.slow
def test_key_changes_with_each_input(tiny_cfg, tmp_path, monkeypatch):
    base = _key(tiny_cfg)
    assert _key(tiny_cfg) == base  # the same inputs give the same key
    changed = {
        "mode": _key(tiny_cfg, mode="strict"),
        "imgsz": _key(tiny_cfg, imgsz=128),
        "batch_size": _key(tiny_cfg, batch_size=4),
        "amp": _key(tiny_cfg, amp=True),
        "device_type": _key(tiny_cfg, device="meta"),
        "hyp": _key(tiny_cfg, hyp={**HYP, "fl_gamma": 1.5}),
        "parameters": _key(tiny_cfg, freeze=True),
    }
    yaml_text = Path(tiny_cfg).read_text()
    for field, text in (("model_yaml", yaml_text.replace("nc: 2", "nc: 3")),
                        ("buffers", yaml_text.replace("[4, 5, 8, 10, 12, 8]", "[4, 6, 8, 10, 12, 8]"))):
        edited = tmp_path / f"{field}.yaml"
        edited.write_text(text)
        changed[field] = _key(edited)
    source = tmp_path / "loss_copy.py"
    source.write_text("# one version\n")
    monkeypatch.setattr(audit_cache, "AUDIT_SOURCES", (*audit_cache.AUDIT_SOURCES, source))
    with_source = _key(tiny_cfg)
    source.write_text("# another version\n")
    changed["sources"] = _key(tiny_cfg)
    assert changed["sources"]["sources"] != with_source["sources"]
    monkeypatch.setattr(torch, "__version__", "0.0.1-other")
    changed["torch"] = _key(tiny_cfg)
    for field, key in changed.items():
        assert key != base, field
        assert key[field] != base.get(field), field
        assert cache_file(Path("c"), key) != cache_file(Path("c"), base), field


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(audit_cache.CACHE_ENV, "off")
    assert cache_dir() is None
    monkeypatch.setenv(audit_cache.CACHE_ENV, str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.delenv(audit_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ffca-yolo" / "audit"


def _counting(report: AuditReport):
    calls = []
    return calls, lambda: calls.append(1) or report


def test_second_audit_comes_from_the_cache(put_report, cache_folder):
    key = {"format": 1, "model": "m"}
    calls, compute = _counting(put_report)
    first, first_path = cached_audit(key, compute, AuditReport.from_dict)
    second, second_path = cached_audit(key, compute, AuditReport.from_dict)
    assert len(calls) == 1
    assert (first_path["path"], second_path["path"]) == ("computed", "cached")
    assert second == first == put_report
    assert first_path["file"] == second_path["file"] and Path(first_path["file"]).parent == cache_folder
    other, other_path = cached_audit({**key, "model": "n"}, compute, AuditReport.from_dict)
    assert other_path["path"] == "computed" and len(calls) == 2


@pytest.mark.parametrize("content", [b"{not json", b'{"key": 1}', b"\xff\xfe", b'{"key": KEY, "report": {}}'])
def test_damaged_cache_file_is_recomputed_with_a_warning(put_report, cache_folder, log_lines, content):
    key = {"format": 1, "model": "m"}
    path = cache_file(cache_folder, key)
    path.parent.mkdir(parents=True)
    path.write_bytes(content.replace(b"KEY", json.dumps(key).encode()))
    calls, compute = _counting(put_report)
    report, where = cached_audit(key, compute, AuditReport.from_dict)
    assert calls and report == put_report and where["path"] == "computed"
    assert any(line.startswith("WARNING") and "unreadable" in line and str(path) in line for line in log_lines)
    assert json.loads(path.read_text())["report"] == put_report.to_dict()  # rewritten whole
    assert cached_audit(key, compute, AuditReport.from_dict)[1]["path"] == "cached"


def test_unwritable_cache_folder_costs_only_the_cache(put_report, tmp_path, monkeypatch, log_lines):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(audit_cache.CACHE_ENV, str(blocker / "audit"))
    calls, compute = _counting(put_report)
    report, where = cached_audit({"k": 1}, compute, AuditReport.from_dict)
    assert report == put_report and where == {"path": "computed", "file": None}
    assert any(line.startswith("WARNING") and "could not be written" in line for line in log_lines)


def test_disabled_cache_always_audits(put_report, monkeypatch, tmp_path):
    monkeypatch.setenv(audit_cache.CACHE_ENV, "off")
    calls, compute = _counting(put_report)
    for _ in range(2):
        assert cached_audit({"k": 1}, compute, AuditReport.from_dict)[1] == {"path": "computed", "file": None}
    assert len(calls) == 2


@pytest.mark.slow
def test_train_takes_the_cached_path_the_second_time_with_the_same_result(shapes_data, tiny_cfg, tmp_path,
                                                                          cache_folder):
    settings = dict(data=str(shapes_data), cfg=str(tiny_cfg), imgsz=64, batch_size=8, epochs=1, device="cpu",
                    noplots=True, noval=True, workers=0, save_interval=0, project=str(tmp_path))
    train.run(**settings, name="first")
    train.run(**settings, name="second")
    first, second = (json.loads((tmp_path / name / "determinism.json").read_text()) for name in ("first", "second"))
    assert first["audit_path"]["path"] == "computed"
    assert second["audit_path"]["path"] == "cached"
    assert Path(second["audit_path"]["file"]).parent == cache_folder
    assert first["audit"] == second["audit"]
    assert weights_checksum(tmp_path / "first") == weights_checksum(tmp_path / "second")
