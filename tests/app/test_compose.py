"""docker-compose.yml runs the product with the same CLI entry points a user types."""

from __future__ import annotations

from pathlib import Path

import yaml

from picrl.cli import build_parser
from picrl_core.artifact import MANIFEST, WEIGHTS

REPO = Path(__file__).resolve().parents[2]


def test_compose_services_run_existing_picrl_commands(tmp_path: Path) -> None:
    # --model is checked when parsed; the container's model folder stands in as one holding a model's two files
    for name in (MANIFEST, WEIGHTS):
        (tmp_path / name).touch()
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "worker", "trainer", "environment"} <= set(services)
    parser = build_parser()
    commands = {}
    for name, service in services.items():
        if name == "kafka":
            continue
        assert service["build"] == "." and service["image"] == "picrl:latest", name
        command = [str(tmp_path) if arg.startswith("/models/") else arg for arg in service["command"]]
        args = parser.parse_args(command)  # exits (fails the test) on an unknown command or option
        commands[name] = (args.command, getattr(args, "kind", None))
        if "--bootstrap" in service["command"]:
            assert service["command"][service["command"].index("--bootstrap") + 1] == "kafka:29092"
    assert commands["worker"] == ("worker", None)
    assert commands["trainer"] == ("trainer", None)
    assert commands["environment"] == ("produce", "closed-loop")
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["picrl"]' in dockerfile
    for package in ("picrl", "picrl_core", "stream", "producers"):
        assert f"COPY {package} ./{package}" in dockerfile
