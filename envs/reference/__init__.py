"""Reference envs: tasks written for one robot in plain NumPy, the oracles of the equality
contracts (:mod:`raylab.envs.contract`)."""
