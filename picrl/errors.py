"""Errors the CLI reports as one clear line (exit code 2) instead of a traceback."""
from __future__ import annotations

from picrl.kafka.local_broker import BrokerError
from picrl_core.series import UnusableSeriesError

# Expected failures a user can act on: bad input, missing tools, an unreachable broker.
UserError = (BrokerError, UnusableSeriesError, FileNotFoundError, ValueError, ConnectionError)
