"""Errors the CLI reports as one clear line (exit code 2) instead of a traceback."""
from __future__ import annotations

from picrl.kafka.local_broker import BrokerError
from picrl_core.artifact import ArtifactError
from picrl_core.series import UnusableSeriesError
from producers.closed_loop import NoActionError
from stream.topics import TopicMismatchError

# Expected failures a user can act on: bad input, missing tools, an unreachable broker.
UserError = (BrokerError, ArtifactError, UnusableSeriesError, TopicMismatchError, NoActionError, FileNotFoundError,
             ValueError, ConnectionError)
