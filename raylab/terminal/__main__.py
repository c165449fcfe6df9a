"""``python -m raylab.terminal``: print an example frame of the panel."""

from raylab.terminal.examples import _main

raise SystemExit(_main())
