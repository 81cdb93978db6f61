"""Model artifacts: a folder with weights in safetensors (never pickle) and JSON for the rest.

weights.safetensors   predictor.*, policy.*, value.* tensors (none for a method without networks)
artifact.json         format version, the method it serves and its fitted parameters, config, scaling, training
                      reports, sha256 of the weights

An artifact serves one method of :mod:`picrl_core.deployable` (``method``, PIC-RL by default); a worker refuses one
for another method. A PIC-RL predictor variant keeps another network in the predictor's place: its manifest names
the network's class, and :func:`picrl_core.deployable.load_model` builds it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from picrl_core.config import PicRLConfig, PredictorConfig
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.predictor.model import GaussianLSTM

FORMAT_VERSION = 4  # 4: the config without the switches of rejected ideas (a state row of 364 B windowed)
WEIGHTS = "weights.safetensors"
NETWORKS = ("predictor", "policy", "value")
MANIFEST = "artifact.json"


class ArtifactError(ValueError):
    """A model folder that is missing, incomplete, tampered with or from an incompatible version."""


@dataclass
class ModelArtifact:
    """Everything needed to act: the method served, its trained networks (None for a method without) and fitted
    parameters, the config they were trained with, the scaling."""

    config: PicRLConfig
    predictor: torch.nn.Module | None
    policy: PolicyNetwork | None
    value: ValueNetwork | None
    scaling: dict[str, Any] = field(default_factory=dict)  # MinMaxScaler dicts of the series and context
    reports: dict[str, Any] = field(default_factory=dict)  # training reports (phase 1 and 2), dataset info
    method: str = "pic-rl"  # the picrl_core.deployable method it serves
    parameters: dict[str, Any] = field(default_factory=dict)  # the method's fitted parameters (JSON values)

    def networks(self) -> tuple[GaussianLSTM, PolicyNetwork, ValueNetwork]:
        """The predictor, policy and value networks; :class:`ArtifactError` for a method that has none."""
        if self.predictor is None or self.policy is None or self.value is None:
            raise ArtifactError(f"a model of method {self.method!r} has no PIC-RL networks")
        return self.predictor, self.policy, self.value  # any Gaussian predictor network


def save_artifact(artifact: ModelArtifact, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{part}.{name}": tensor.detach().contiguous().clone()
        for part in NETWORKS
        if getattr(artifact, part) is not None
        for name, tensor in getattr(artifact, part).state_dict().items()
    }
    save_file(tensors, str(folder / WEIGHTS))
    manifest = {
        "format_version": FORMAT_VERSION,
        "weights_sha256": hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest(),
        "predictor": artifact.config.predictor.kind,  # "windowed" or "incremental" (config.predictor.kind says it too)
        "method": artifact.method,
        "parameters": artifact.parameters,
        "networks": {
            part: type(getattr(artifact, part)).__name__ for part in NETWORKS if getattr(artifact, part) is not None
        },
        "config": artifact.config.to_dict(),
        "scaling": artifact.scaling,
        "reports": artifact.reports,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def served_method(folder: Path) -> str:
    """The method the model in ``folder`` serves (its manifest's; PIC-RL for a model that names none)."""
    try:
        return str(json.loads((folder / MANIFEST).read_text()).get("method", "pic-rl"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{folder} is not a readable picrl model ({exc})") from exc


def load_artifact(
    folder: Path, predictor_model: Callable[[PredictorConfig], torch.nn.Module] = GaussianLSTM
) -> ModelArtifact:
    """Load and verify a model folder; every failure is an :class:`ArtifactError` naming the cause.
    ``predictor_model`` builds the predictor network the manifest names (a variant's:
    :func:`picrl_core.deployable.load_model`)."""
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
    method, parameters = manifest.get("method", "pic-rl"), manifest.get("parameters", {})
    named = manifest.get("networks", {"predictor": "GaussianLSTM", "policy": "PolicyNetwork", "value": "ValueNetwork"})
    builders: dict[str, Callable[[], torch.nn.Module]] = {
        "predictor": lambda: predictor_model(config.predictor),
        "policy": lambda: PolicyNetwork(config.policy),
        "value": lambda: ValueNetwork(config.policy),
    }
    networks = {part: builders[part]() for part in NETWORKS if part in named}
    if "predictor" in networks and type(networks["predictor"]).__name__ != named["predictor"]:
        raise ArtifactError(
            f"{folder} serves {method!r} with a {named['predictor']} predictor: load it with "
            "picrl_core.deployable.load_model"
        )
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
        networks.get("predictor"),
        networks.get("policy"),
        networks.get("value"),
        manifest.get("scaling", {}),
        manifest.get("reports", {}),
        method,
        parameters,
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
