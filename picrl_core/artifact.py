"""Model artifacts: a folder with weights in safetensors (never pickle) and JSON for the rest.

weights.safetensors   predictor.*, policy.*, value.* tensors
artifact.json         format version, config, scaling, training reports, sha256 of the weights
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from picrl_core.config import PicRLConfig
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.predictor.model import GaussianLSTM

FORMAT_VERSION = 4  # 4: the config without the switches of rejected ideas (a state row of 364 B windowed)
WEIGHTS = "weights.safetensors"
MANIFEST = "artifact.json"


class ArtifactError(ValueError):
    """A model folder that is missing, incomplete, tampered with or from an incompatible version."""


@dataclass
class ModelArtifact:
    """Everything needed to act: trained networks, the config they were trained with, the scaling."""

    config: PicRLConfig
    predictor: GaussianLSTM
    policy: PolicyNetwork
    value: ValueNetwork
    scaling: dict[str, Any] = field(default_factory=dict)  # MinMaxScaler dicts of the series and context
    reports: dict[str, Any] = field(default_factory=dict)  # training reports (phase 1 and 2), dataset info


def save_artifact(artifact: ModelArtifact, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{part}.{name}": tensor.detach().contiguous().clone()
        for part in ("predictor", "policy", "value")
        for name, tensor in getattr(artifact, part).state_dict().items()
    }
    save_file(tensors, str(folder / WEIGHTS))
    manifest = {
        "format_version": FORMAT_VERSION,
        "weights_sha256": hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest(),
        "predictor": artifact.config.predictor.kind,  # "windowed" or "incremental" (config.predictor.kind says it too)
        "config": artifact.config.to_dict(),
        "scaling": artifact.scaling,
        "reports": artifact.reports,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def load_artifact(folder: Path) -> ModelArtifact:
    """Load and verify a model folder; every failure is an :class:`ArtifactError` naming the cause."""
    manifest_path, weights_path = folder / MANIFEST, folder / WEIGHTS
    for path in (manifest_path, weights_path):
        if not path.is_file():
            raise ArtifactError(f"{folder} is not a picrl model: {path.name} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as exc:
        raise ArtifactError(f"{manifest_path} is not valid JSON ({exc})") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{folder} has format version {manifest.get('format_version')!r}; "
            f"this picrl reads version {FORMAT_VERSION} (train it again: picrl train)"
        )
    digest = hashlib.sha256(weights_path.read_bytes()).hexdigest()
    if digest != manifest.get("weights_sha256"):
        raise ArtifactError(f"{weights_path} does not match the checksum in {MANIFEST}: truncated or modified")
    try:
        config = PicRLConfig.from_dict(manifest["config"])
        if manifest.get("predictor", config.predictor.kind) != config.predictor.kind:
            raise ValueError(
                f"the manifest says a {manifest['predictor']} predictor, its config a {config.predictor.kind} one"
            )
        tensors = load_file(str(weights_path))
    except (KeyError, TypeError, ValueError, SafetensorError) as exc:
        raise ArtifactError(f"{folder} cannot be read: {exc}") from exc
    predictor, policy, value = GaussianLSTM(config.predictor), PolicyNetwork(config.policy), ValueNetwork(config.policy)
    networks: dict[str, torch.nn.Module] = {"predictor": predictor, "policy": policy, "value": value}
    for part, module in networks.items():
        state = {name.split(".", 1)[1]: t for name, t in tensors.items() if name.startswith(f"{part}.")}
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:
            raise ArtifactError(
                f"{folder}: the {part} weights do not fit the configured network: {str(exc).splitlines()[0]}"
            ) from exc
        if not all(torch.isfinite(t).all() for t in state.values()):
            raise ArtifactError(f"{folder}: the {part} weights contain NaN or infinite values")
        module.eval()
    return ModelArtifact(
        config,
        predictor,
        policy,
        value,
        manifest.get("scaling", {}),
        manifest.get("reports", {}),
    )


def policy_to_bytes(policy: PolicyNetwork) -> bytes:
    """The policy's weights as safetensors bytes (what travels on the policy topic)."""
    return save({name: t.detach().contiguous().clone() for name, t in policy.state_dict().items()})


def policy_from_bytes(weights: bytes, config: PicRLConfig) -> PolicyNetwork:
    """A policy network of ``config``'s shape from safetensors bytes; :class:`ArtifactError` when the
    bytes are not safetensors, do not fit the network, or hold NaN/inf."""
    try:
        tensors = load(weights)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise ArtifactError(f"policy weights are not readable safetensors: {exc}") from exc
    policy = PolicyNetwork(config.policy)
    try:
        policy.load_state_dict(tensors)
    except RuntimeError as exc:
        raise ArtifactError(f"policy weights do not fit the configured network: {str(exc).splitlines()[0]}") from exc
    if not all(torch.isfinite(t).all() for t in tensors.values()):
        raise ArtifactError("policy weights contain NaN or infinite values")
    return policy.eval()
