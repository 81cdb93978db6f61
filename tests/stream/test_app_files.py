"""A worker leaves no files behind: its table is in memory and in the changelog, not in a data directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from picrl_core.artifact import ModelArtifact
from stream.worker import StreamWorker, WorkerSettings


def test_first_start_writes_no_data_directory(
    tiny_artifact: ModelArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", app_id="files-worker"), tiny_artifact)
    asyncio.run(worker.app.on_first_start())  # what Faust runs once per process before the app starts
    assert list(tmp_path.iterdir()) == []
