"""The paper's three Alibaba datasets (bundled in ``files/``) and a loader for user CSV files.

``load_dataset("dlrm" | "genai-mem" | "genai-ctx")`` returns the raw series in native units; scale
and split it with :func:`picrl_core.series.prepare_series`. ``load_dataset("pods")`` is the fleet of 91
per-pod GenAI series, one column each (:func:`picrl_core.series.prepare_fleet`). See ``files/README.md`` for where every
file comes from and why these columns were chosen.
"""

from picrl.datasets.loaders import (
    DATASETS,
    FLEETS,
    DatasetError,
    Trace,
    load_csv,
    load_dataset,
    load_pod_fleet,
    load_resource_csv,
    prepare_trace,
    trace_resources,
)

__all__ = [
    "DATASETS",
    "FLEETS",
    "DatasetError",
    "Trace",
    "load_csv",
    "load_dataset",
    "load_pod_fleet",
    "load_resource_csv",
    "prepare_trace",
    "trace_resources",
]
