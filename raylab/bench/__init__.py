"""Benchmarks behind ``raylab bench`` (protocol and results: ``benchmarks/README.md``).

- :mod:`raylab.bench.common`: timed windows, reference windows and their guards, the machine
  check, result files (schema ``raylab.bench/1``);
- :mod:`raylab.bench.env`: ``bench env`` (the batched env over a thread sweep, bare physics,
  sustained windows) and ``bench compare`` (against Gymnasium's vector envs);
- :mod:`raylab.bench.train`: ``bench train`` (end-to-end training against stock RLlib; the
  EnvRunner sampler alone with ``--sampler``; SAC against the plain-torch update limit);
- :mod:`raylab.bench.plot`: ``bench plot RESULT.json``;
- :mod:`raylab.bench.baselines`: ``bench baselines``, the Microduck fixed-policy returns.

Nothing outside this package and the CLI imports it.
"""
