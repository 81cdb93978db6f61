"""The Prometheus alerting rules in docs/prometheus are valid and the streak alerts fire on a service in a
long censoring streak (promtool's rule unit tests; Debian/Ubuntu: `apt-get install prometheus`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import require_program

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


@pytest.mark.parametrize("check", [["check", "rules", "picrl-alerts.yml"], ["test", "rules", "picrl-alerts.test.yml"]])
def test_promtool_accepts_the_rules_and_their_unit_tests(check: list[str]) -> None:
    done = subprocess.run(
        [require_program("promtool", "prometheus"), *check], cwd=RULES, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
