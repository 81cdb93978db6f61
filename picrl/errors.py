"""Errors the CLI reports as one clear line (exit code 2) instead of a traceback."""

from __future__ import annotations

from picrl.kafka.local_broker import BrokerError
from producers.closed_loop import NoActionError

# Expected failures a user can act on: bad input, missing tools, an unreachable broker. ValueError covers
# picrl_core's ArtifactError and UnusableSeriesError and stream's TopicMismatchError, whose modules are
# not imported here: they load torch, which the light commands do without.
UserError = (BrokerError, NoActionError, FileNotFoundError, ValueError, ConnectionError)
