"""Keep raylab's terminal readable: silence library chatter below errors.

RLlib and Ray Tune log deprecation notices and "new API stack" banners at WARNING level in
every worker. raylab installs ``quiet_logs`` in the driver and, through Ray's
``worker_process_setup_hook``, in every worker process it starts. Errors still show.
"""

from __future__ import annotations

import logging
import warnings

NOISY_LOGGERS = ("ray.rllib", "ray._common.deprecation", "ray.tune", "ray.train")


def quiet_logs() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
