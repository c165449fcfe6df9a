"""raylab.metrics: the canonical metric schema, stats tracker, run directories and readers.

- ``schema``    tag registry (names, units, owners, aggregation), validation, legacy table
- ``tracker``   stats tracker with exact cross-worker reduction
- ``rundir``    run directory, run_config.json / run_summary.json, atomic writes
- ``backends``  TensorBoard (default) and W&B, driver only
- ``manifest``  runtime manifest v1
- ``extract``   fail-closed reader of a run's event files
- ``cli``       ``raylab metrics extract | docs``

Submodules are imported on demand (``from raylab.metrics import schema``) so that importing the
schema does not pull in TensorBoard, W&B or Ray.
"""

from raylab.metrics.schema import METRIC_SCHEMA_VERSION, MetricSchemaError

__all__ = ["METRIC_SCHEMA_VERSION", "MetricSchemaError"]
