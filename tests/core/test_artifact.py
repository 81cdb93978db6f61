"""Model artifacts: safetensors weights plus a JSON manifest, verified on load (picrl_core.artifact)."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from picrl_core import artifact as artifact_module
from picrl_core.artifact import (
    MANIFEST,
    WEIGHTS,
    ArtifactError,
    ModelArtifact,
    load_artifact,
    policy_from_bytes,
    policy_to_bytes,
    save_artifact,
)
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.windowed import predict_gaussian
from picrl_core.simulator import simulate


@pytest.fixture()
def saved(
    tmp_path: Path,
    tiny_predictor: GaussianLSTM,
    tiny_policy: PolicyNetwork,
    tiny_value: ValueNetwork,
    tiny_config: PicRLConfig,
) -> tuple[ModelArtifact, Path]:
    config = replace(tiny_config, seed=9)
    original = ModelArtifact(
        config,
        tiny_predictor,
        tiny_policy,
        tiny_value,
        scaling={"series": {"low": 1.5, "high": 9.0}, "context": []},
        reports={"series": "synthetic", "phase2": {"iterations": 3}},
    )
    return original, save_artifact(original, tmp_path / "model")


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def _write_manifest(folder: Path, manifest: dict) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _fix_checksum(folder: Path) -> None:
    manifest = _manifest(folder)
    manifest["weights_sha256"] = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()
    _write_manifest(folder, manifest)


def test_round_trip_gives_identical_predictions_and_actions(
    saved: tuple[ModelArtifact, Path], diurnal_series: np.ndarray
) -> None:
    original, folder = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST, WEIGHTS])
    loaded = load_artifact(folder)
    assert loaded.config == original.config
    assert loaded.scaling == original.scaling and loaded.reports == original.reports
    for part in ("predictor", "policy", "value"):
        a, b = getattr(original, part).state_dict(), getattr(loaded, part).state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part
        assert not getattr(loaded, part).training

    rng = np.random.default_rng(0)
    windows = np.stack([rng.random((50, 8)), np.zeros((50, 8))], axis=2).astype(np.float32)
    for x, y in zip(predict_gaussian(original.predictor, windows), predict_gaussian(loaded.predictor, windows)):
        np.testing.assert_array_equal(x, y)

    demand, history = diurnal_series[2000:2060, None], diurnal_series[None, 1992:2000]
    runs = [simulate(PicRLController(a.predictor, a.policy, a.config), demand, history) for a in (original, loaded)]
    np.testing.assert_array_equal(runs[0].action, runs[1].action)


def test_missing_files_are_reported(saved: tuple[ModelArtifact, Path], tmp_path: Path) -> None:
    _, folder = saved
    with pytest.raises(ArtifactError, match="artifact.json is missing"):
        load_artifact(tmp_path / "nowhere")
    (folder / WEIGHTS).unlink()
    with pytest.raises(ArtifactError, match="weights.safetensors is missing"):
        load_artifact(folder)


def test_truncated_weights_are_rejected(saved: tuple[ModelArtifact, Path]) -> None:
    _, folder = saved
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="does not match the checksum.*truncated or modified"):
        load_artifact(folder)
    _fix_checksum(folder)  # even with a matching checksum the file cannot be parsed
    with pytest.raises(ArtifactError, match="cannot be read"):
        load_artifact(folder)


def test_a_modified_byte_is_rejected(saved: tuple[ModelArtifact, Path]) -> None:
    _, folder = saved
    data = bytearray((folder / WEIGHTS).read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's payload
    (folder / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="does not match the checksum"):
        load_artifact(folder)


@pytest.mark.parametrize("version", [5, 3, 2, 1, 0, None, "4"])
def test_wrong_format_version_is_rejected(saved: tuple[ModelArtifact, Path], version: int | str | None) -> None:
    _, folder = saved
    manifest = _manifest(folder)
    manifest["format_version"] = version
    _write_manifest(folder, manifest)
    with pytest.raises(ArtifactError, match="format version .* this picrl reads version 4"):
        load_artifact(folder)


def test_unknown_config_key_is_rejected(saved: tuple[ModelArtifact, Path]) -> None:
    _, folder = saved
    manifest = _manifest(folder)
    manifest["config"]["predictor"]["windwo"] = 16
    _write_manifest(folder, manifest)
    with pytest.raises(ArtifactError, match=r"cannot be read: config\.predictor: unknown setting\(s\) windwo"):
        load_artifact(folder)


def test_invalid_json_and_mismatched_network_shapes_are_rejected(saved: tuple[ModelArtifact, Path]) -> None:
    _, folder = saved
    manifest = _manifest(folder)
    manifest["config"]["policy"]["hidden"] = 32  # the stored policy has 16 hidden units
    _write_manifest(folder, manifest)
    with pytest.raises(ArtifactError, match="the policy weights do not fit the configured network"):
        load_artifact(folder)
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="is not valid JSON"):
        load_artifact(folder)


def test_nan_weights_are_rejected(saved: tuple[ModelArtifact, Path]) -> None:
    _, folder = saved
    tensors = load_file(str(folder / WEIGHTS))
    name = next(k for k in tensors if k.startswith("value."))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(folder / WEIGHTS))
    _fix_checksum(folder)
    with pytest.raises(ArtifactError, match="the value weights contain NaN or infinite values"):
        load_artifact(folder)


def test_loading_never_unpickles(saved: tuple[ModelArtifact, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tree = ast.parse(inspect.getsource(artifact_module))
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    imported = {alias.name for node in imports for alias in node.names}
    imported |= {node.module or "" for node in imports if isinstance(node, ast.ImportFrom)}
    assert not any("pickle" in name for name in imported)
    calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not {"torch.load", "pickle.load", "pickle.loads"} & calls  # code only: the docstring may say "pickle"

    def forbidden(*_: object, **__: object) -> None:
        raise AssertionError("load_artifact must not unpickle")

    for target, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(target, name, forbidden)
    _, folder = saved
    load_artifact(folder)  # still loads with every unpickling entry point disabled


def test_policy_bytes_round_trip_and_refuse_bad_weights(tiny_config: PicRLConfig, tiny_policy: PolicyNetwork) -> None:
    restored = policy_from_bytes(policy_to_bytes(tiny_policy), tiny_config)
    for (name, a), (_, b) in zip(tiny_policy.state_dict().items(), restored.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ArtifactError, match="not readable safetensors"):
        policy_from_bytes(b"not safetensors", tiny_config)
    wider = PolicyNetwork(replace(tiny_config.policy, hidden=tiny_config.policy.hidden + 1))
    with pytest.raises(ArtifactError, match="do not fit"):
        policy_from_bytes(policy_to_bytes(wider), tiny_config)
    broken = PolicyNetwork(tiny_config.policy)
    with torch.no_grad():
        broken.log_std.fill_(float("nan"))
    with pytest.raises(ArtifactError, match="NaN or infinite"):
        policy_from_bytes(policy_to_bytes(broken), tiny_config)
