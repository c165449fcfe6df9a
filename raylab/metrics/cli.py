"""``raylab metrics``: read run metrics (``extract``) and write / check ``docs/metrics.md``.

    raylab metrics extract RUN_DIR [--csv OUT] [--legacy-unversioned]
    raylab metrics docs [--check] [--out PATH]

:func:`main` raises :class:`~raylab.errors.UserError` (one line) on a user mistake or a run that
fails the schema; the ``raylab`` command prints it and exits with 2. ``docs --check`` returns 1
when the file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from raylab.errors import UserError, choices_hint
from raylab.metrics import manifest, rundir, schema
from raylab.metrics.schema import MetricSchemaError

SUBCOMMANDS = ("extract", "docs")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message}")


def main(argv: List[str]) -> int:
    """Run ``raylab metrics <argv...>``; return the exit code."""
    argv = list(argv)
    if not argv or argv[0] is None:
        choices = ", ".join(SUBCOMMANDS)
        raise UserError(f"raylab metrics: missing subcommand; valid choices: {choices}")
    what, rest = argv[0], argv[1:]
    if what == "extract":
        return _cmd_extract(rest)
    if what == "docs":
        return _cmd_docs(rest)
    if what in ("-h", "--help"):
        print(__doc__.split("\n\n")[1])
        return 0
    raise UserError(choices_hint(what, SUBCOMMANDS, "metrics subcommand"))


def _cmd_extract(argv: List[str]) -> int:
    p = _Parser(
        prog="raylab metrics extract",
        description="Read a run's TensorBoard event files into a table of canonical metrics "
        "(CSV on stdout, or --csv OUT). Fails closed on a missing or unsupported "
        "metric_schema_version, unknown tags, or mixed canonical / legacy tags.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by raylab train")
    p.add_argument("--csv", metavar="OUT", default=None, help="write the table to this CSV file")
    p.add_argument(
        "--legacy-unversioned",
        action="store_true",
        help="read a pre-schema run: only recognised legacy tags, no canonical tag, no stamp",
    )
    args = p.parse_args(argv)
    from raylab.metrics.extract import extract

    try:
        table = extract(args.run_dir, legacy_unversioned=args.legacy_unversioned)
    except MetricSchemaError as e:
        raise UserError(f"metrics extract: {e}") from None
    if args.csv is None:
        table.to_csv(sys.stdout)
        return 0
    try:
        table.to_csv(args.csv)
    except OSError as e:
        raise UserError(f"metrics extract: cannot write {args.csv}: {e.strerror}") from None
    origin = ", migrated from legacy tags" if table.legacy_unversioned else ""
    print(
        f"wrote {len(table.steps)} steps x {len(table.tags)} tags to {args.csv} "
        f"(metric_schema_version={table.schema_version}{origin})"
    )
    return 0


def default_docs_path() -> Path:
    """``docs/metrics.md`` of the source checkout raylab is installed from."""
    import raylab

    return Path(raylab.__file__).resolve().parents[1] / "docs" / "metrics.md"


def _cmd_docs(argv: List[str]) -> int:
    p = _Parser(
        prog="raylab metrics docs",
        description="Write docs/metrics.md from the metric registry, or check it is current.",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    p.add_argument("--out", default=None, help="file to write / check (default: docs/metrics.md)")
    args = p.parse_args(argv)
    path = Path(args.out) if args.out else default_docs_path()
    text = render_docs()
    if args.check:
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != text:
            state = "missing" if current is None else "stale"
            print(
                f"raylab metrics docs: {path} is {state}; run `raylab metrics docs`",
                file=sys.stderr,
            )
            return 1
        print(f"{path} is up to date")
        return 0
    if not path.parent.is_dir():
        raise UserError(f"metrics docs: folder {path.parent} does not exist; pass --out PATH")
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


# ------------------------------------------------------------------------------ docs

_KIND_SECTIONS = (
    ("scalar", "Progress, throughput, counters and sizes"),
    ("main_phase", "Learner main timeline (mutually exclusive; may be added up)"),
    ("wall", "Learner iteration wall"),
    ("nested", "Learner nested diagnostics (inside one main phase; never added)"),
    ("background", "Learner background diagnostics (beside the main thread; never added)"),
    ("collector", "Collector (EnvRunner) timeline (own clock; never added to learner timings)"),
    ("collector_nested", "Collector nested diagnostics (inside Env Step; not in the cycle)"),
    ("runner", "Algorithm-loop diagnostics (driver side; not a learner phase)"),
)


def _algos(spec: schema.MetricSpec) -> str:
    if spec.algorithms == frozenset(schema.ALGORITHMS):
        return "all"
    return ", ".join(a for a in schema.ALGORITHMS if a in spec.algorithms)


def _tag_table(specs) -> List[str]:
    lines = [
        "| tag | unit | owner | aggregation | algorithms | persisted | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        meaning = s.description
        if s.parent:
            meaning += f" (part of `{s.parent}`)"
        persisted = "yes" if s.persisted else "terminal-only"
        lines.append(
            f"| `{s.name}` | {s.unit} | {s.owner} | {s.aggregation} | {_algos(s)} | "
            f"{persisted} | {meaning} |"
        )
    return lines


def render_docs() -> str:
    """The full text of docs/metrics.md, generated from the registry."""
    specs = list(schema.TAGS.values())
    exact = [s for s in specs if not s.is_family]
    L: List[str] = []
    add = L.append
    add(
        "<!-- Generated by `raylab metrics docs` from raylab/metrics/schema.py and "
        "raylab/metrics/manifest.py. Do not edit by hand; `raylab metrics docs --check` "
        "(and the test suite) fail when this file is stale. -->"
    )
    add("")
    add("# Metrics")
    add("")
    add(
        "Every number raylab reports (TensorBoard / W&B charts, the live terminal panel, "
        "`run_summary.json`, `raylab metrics extract`) is named in one registry, "
        "`raylab.metrics.schema`. It fixes each tag's unit, owner, how values from several "
        "workers combine, which algorithms emit it and whether it is persisted. Code uses the "
        "module constants (`schema.PERF_TOTAL_FPS`) and family helpers "
        '(`schema.reward_tag("alive")`) and never spells a tag string itself.'
    )
    add("")
    add("## Versions")
    add("")
    add("| namespace | current | stored in |")
    add("|---|---|---|")
    add(
        f"| metric schema (tags, units, meanings) | `metric_schema_version = "
        f"{schema.METRIC_SCHEMA_VERSION}` | top level of `run_summary.json` |"
    )
    add(
        f"| runtime manifest (processes, devices, counters) | `runtime_manifest.schema_version = "
        f"{manifest.RUNTIME_MANIFEST_SCHEMA_VERSION}` | `runtime_manifest` in `run_summary.json` |"
    )
    add("")
    add(
        "The two versions move independently. Renaming or removing a tag, or changing its unit "
        "or meaning, needs a new metric schema version; adding a tag (with docs and tests) does "
        "not. Readers refuse a missing or unsupported version instead of guessing."
    )
    add("")
    add("## Run directory")
    add("")
    add("`raylab train` writes one directory per run:")
    add("")
    add(
        "- default `logs/<algo.algo_log_name>/<task>/<YYYY-MM-DD_HH-MM-SS>_<sim>/` (relative to "
        "the working directory), for example `logs/appo/microduck_balance/"
        "2026-03-09_18-30-00_mujoco/`;"
    )
    add("- `training.log_root=DIR` replaces `logs/<algo_log_name>/<task>`;")
    add("- `training.log_dir=DIR` is the exact directory and must not exist yet.")
    add("")
    add(
        "A run directory is never reused: a timestamped name that is taken gets a `_1`, `_2`, ... "
        "suffix, and an existing `training.log_dir` is an error. Characters other than letters, "
        "digits, `_`, `.` and `-` in the task name become `_`."
    )
    add("")
    add("| file | content |")
    add("|---|---|")
    add(
        f"| `{rundir.CONFIG_FILE}` | the composed config; values of keys containing "
        f"{', '.join('`' + p + '`' for p in rundir.SECRET_KEY_PARTS)} are replaced by "
        f"`{rundir.REDACTED}` |"
    )
    add(
        f"| `{rundir.SUMMARY_FILE}` | metric schema version, runtime manifest, final metrics, "
        "status, start / end time |"
    )
    add("| `events.out.tfevents.*` | TensorBoard event files (written with either backend) |")
    add("| `wandb/` | the W&B run files (`training.logger=wandb`) |")
    add(f"| `{rundir.CHECKPOINT_DIR}/` | checkpoints |")
    add(f"| `{rundir.VIDEO_FILE}` | a rendered evaluation video, when one was made |")
    add("")
    add(
        "Both JSON files are replaced atomically (a temporary file in the same folder, fsync, "
        "rename): a crash leaves the previous complete version, never a half-written file."
    )
    add("")
    add(f"`{rundir.SUMMARY_FILE}` fields:")
    add("")
    add("| field | type | meaning |")
    add("|---|---|---|")
    add("| `metric_schema_version` | int | the metric schema of every tag in this run |")
    add(f"| `status` | str | {' / '.join(rundir.STATUSES)} |")
    add(
        "| `start_time`, `end_time` | ISO 8601 str | `end_time` is null while running and set "
        "for every final status |"
    )
    add("| `runtime_manifest` | object or null | see Runtime manifest below |")
    add(
        "| `final_metrics` | object | canonical tag -> last value; null only for a NaN / inf "
        "loss or policy statistic |"
    )
    opt = ", ".join(f"`{k}`" for k in rundir.SUMMARY_OPTIONAL)
    add(
        f"| optional | | {opt}; other producer data goes under `experimental`, and any other "
        "field is rejected |"
    )
    add("")
    add("## Backends")
    add("")
    add(
        "`training.logger=tensorboard` (default) writes TensorBoard event files into the run "
        "directory. `training.logger=wandb` opens a W&B run in `<run_dir>/wandb` with "
        "`training.wandb_project`, `wandb_entity`, `wandb_group`, `wandb_name` (default: the run "
        "directory name), `wandb_tags`, `wandb_notes` and `wandb_mode` (online / offline / "
        "disabled), with the redacted config; it also writes the same TensorBoard event files "
        "so every run can be read with `raylab metrics extract`, and uploads `play_video.mp4` "
        f"as `{schema.MEDIA_PLAY_VIDEO}` when a run renders one."
    )
    add("")
    add(
        "Only the driver (the Tune callback's process) creates a backend. Every call validates "
        "its tags and values through the schema first, drops terminal-only tags, and writes "
        "each tag once per step, unsmoothed; steps never go backwards. The terminal panel's "
        "2-second average is display only. TensorBoard stores scalars as float32."
    )
    add("")
    add("## Names and units")
    add("")
    add("- A tag ending in `_ms` (or `_ms_per_rank`) is in milliseconds.")
    add(f"- {', '.join('`' + t + '`' for t in schema.SECONDS_TAGS)} are in seconds.")
    add(
        "- A registered tag written with another unit suffix (for example "
        "`Perf/learning_time_ms`, `Perf/learner_collector_wait_s`) is rejected as a wrong unit "
        "suffix, as is an unregistered tag or a retired legacy tag."
    )
    add(
        "- Values are real numbers. NaN / inf are rejected except for `Loss/<name>` and "
        "`Policy/<name>`, where they are a real signal (divergence) and stay visible."
    )
    add(
        "- Aggregation says how values from several EnvRunners or learner ranks combine into "
        "one number: `mean`, or `sum` for totals such as `Perf/total_fps`."
    )
    add(
        "- Terminal-only tags may be shown and summarised but are never written to "
        "TensorBoard / W&B."
    )
    add("")
    add("| unit | meaning |")
    add("|---|---|")
    for unit, meaning in schema.UNITS.items():
        add(f"| {unit} | {meaning} |")
    add("")
    add("## Which timings add up")
    add("")
    add(
        "raylab runs on Ray, so the learner does not own the collector: EnvRunner actors step "
        "the envs and run their own policy copy, and send finished episodes through Ray's "
        "object store. Resolving and deserialising them is timed where it happens: on the "
        f"learner main thread it is `{schema.PERF_LEARNER_EPISODE_TRANSFER_MS}` (a main phase); "
        "on the learner's request thread, beside a learner thread that keeps training, it is "
        f"`{schema.PERF_LEARNER_INGEST_MS}` (background, never added). Fresh weights go "
        f"the other way: `{schema.PERF_WEIGHT_BROADCAST_MS}` is the algorithm loop pushing them "
        "to the EnvRunners, a driver-side diagnostic, not a learner phase."
    )
    add("")
    add(
        "Only the learner main-thread phases below are mutually exclusive, so only they may be "
        f"added up. They share one denominator, `{schema.PERF_ITERATION_TIME}` (Iter Wall, "
        "100%). The terminal derives Other = max(Iter Wall - sum of the phases present, 0) in "
        "memory; it is never persisted. Accounted time above Iter Wall is a bug in the timers, "
        "not parallel work. A phase an algorithm does not have is neither shown nor persisted "
        "for it."
    )
    add("")
    add("| algorithm | learner main phases, in timeline order |")
    add("|---|---|")
    for algo, phases in schema.LEARNER_MAIN_PHASES.items():
        add(f"| {algo} | {' -> '.join('`' + p + '`' for p in phases)} |")
    add("")
    add("Never add:")
    add("")
    add(
        "- nested timings to their parent or to the main phases (they are part of one phase, "
        "for example gradient all-reduce inside "
        f"`{schema.PERF_LEARNING_TIME}`, or the env-step breakdown inside "
        f"`{schema.PERF_COLLECTOR_ENV_STEP_MS}`);"
    )
    add(
        "- background timings (they overlap the main thread, for example "
        f"`{schema.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS}`);"
    )
    add(
        "- collector timings to learner timings: EnvRunners run in parallel with the learner "
        "on their own clock, and a collector rollout may be longer or shorter than one learner "
        "iteration;"
    )
    add(f"- `{schema.PERF_WEIGHT_BROADCAST_MS}` to learner phases (it is the algorithm loop's).")
    add("")
    add(
        "Collector cycle. Where a collector reports mutually exclusive per-tick phases, their "
        "sum is the collector cycle (derived for the terminal, not persisted); nested env-step "
        "details are not part of that sum. PPO and APPO EnvRunners report per-step averages "
        f"(`{schema.PERF_COLLECTOR_MLP_INFER_MS}`, `{schema.PERF_COLLECTOR_ENV_STEP_MS}`) and a "
        f"whole-rollout wall (`{schema.PERF_COLLECTION_TIME}`, seconds), which are not one "
        "breakdown and must not be turned into percentages of each other."
    )
    add("")
    add("| algorithm | collector cycle phases |")
    add("|---|---|")
    for algo, phases in schema.COLLECTOR_CYCLE_PHASES.items():
        cycle = " + ".join(f"`{p}`" for p in phases) or "none (per-step averages, rollout wall)"
        add(f"| {algo} | {cycle} |")
    add("")
    add(
        "Learner-owned inference (a learner that answers the collectors' action requests, with "
        "its Inference, Collector Release, Inference Request and Learner Action Wait timings) is "
        "not a path any raylab algorithm has: every EnvRunner runs its own policy copy. Those "
        "tags are not registered; their pre-schema names are retired."
    )
    add("")
    add("## Tags")
    add("")
    for kind, title in _KIND_SECTIONS:
        group = [s for s in exact if s.kind == kind]  # registry order = timeline order
        if not group:
            continue
        add(f"### {title}")
        add("")
        L.extend(_tag_table(group))
        add("")
    add("### Families")
    add("")
    add(
        "A family is one registered pattern; any term of letters, digits, `_`, `.` and `-` "
        "makes a member (`reward/alive`). Helpers: `reward_tag`, `termination_tag`, "
        "`loss_tag`, `policy_tag`. A term may not turn a member into a legacy tag "
        "(`reward/mean` and `reward/mean_ep100` are taken), and a member ending in `_ms` is a "
        "wrong unit suffix."
    )
    add("")
    L.extend(_tag_table([s for s in specs if s.is_family]))
    add("")
    add(
        "`reward/<term>` is a per-step diagnostic of one reward term; use "
        f"`{schema.TRAIN_MEAN_REWARD}` for training progress. `Episode_Termination/<term>` counts "
        "resets and is not a reward."
    )
    add("")
    add("## Legacy tags")
    add("")
    add(
        "Event files are never rewritten, so runs made before schema v1 keep their old names. "
        "Default readers reject them. `raylab metrics extract --legacy-unversioned` is the only "
        "path that reads them: every tag must be a recognised legacy tag below, and no canonical "
        "tag and no `metric_schema_version` stamp may be present. It is not a fallback for new "
        "runs without a stamp."
    )
    add("")
    add("| old tag | canonical tag | factor | note |")
    add("|---|---|---|---|")
    for old, rule in sorted(schema.LEGACY_MIGRATION.items()):
        if isinstance(rule.canonical, str):
            target = f"`{rule.canonical}`"
        else:
            target = "; ".join(f"{a}: `{t}`" for a, t in sorted(rule.canonical.items()))
        factor = "1" if rule.factor == 1.0 else f"{rule.factor:g}"
        add(f"| `{old}` | {target} | {factor} | {rule.note} |")
    add("")
    add(
        "When several old tags map to one canonical tag, the first in this order wins: "
        "`reward/mean_ep100`, then `reward/mean`. The per-algorithm mapping reads the algorithm "
        f"from `{rundir.CONFIG_FILE}`."
    )
    add("")
    add("Retired without a replacement (dropped by the legacy reader, rejected everywhere else):")
    add("")
    add("| retired tag (`*` = any text) | instead |")
    add("|---|---|")
    for old, reason in sorted(schema.RETIRED_TAGS.items()):
        add(f"| `{old}` | {reason} |")
    add("")
    add("## Runtime manifest")
    add("")
    add(
        f"`runtime_manifest` (schema_version {manifest.RUNTIME_MANIFEST_SCHEMA_VERSION}) records "
        "where the run's processes ran. Stable fields cannot be renamed, removed, retyped or "
        "change unit or null meaning without a new manifest version. Experimental fields are "
        "producer-owned diagnostics; the reader checks only their shape. Any other field is "
        "rejected; an actor's `node_id` must be one of the manifest's nodes."
    )
    add("")
    add("| field | stability | type | meaning |")
    add("|---|---|---|---|")
    for key, (stability, typ, meaning) in manifest.MANIFEST_FIELDS.items():
        add(f"| `{key}` | {stability} | {typ} | {meaning} |")
    add("")
    add(
        "Window semantics: `inference_flight.max_in_flight` is the maximum since the previous "
        "report (each result resets it), `replay_ingress.high_water_occupancy` the maximum "
        "for the whole run. The driver refreshes both with every result, so the manifest in "
        "`run_summary.json` always holds the latest report. The stable fields added to v1 "
        f"after its first runs ({', '.join(f'`{k}`' for k in manifest.OPTIONAL_STABLE_FIELDS)}) "
        "are validated when present; `collector_backend_device` is required once the run's "
        "status is `completed`. `shutdown` (experimental) says how the trial ended: "
        "`classification` (`normal_completion`, `external_cancellation`, or a failure class: "
        "`collector_failure`, `learner_failure`, `backend_worker_failure`, `unknown_failure`), "
        "`owner`, `phase`, `stop_reason` and `cleanup_errors`. `backend_diagnostics` "
        "(experimental) is one EnvRunner's physics-backend snapshot (MuJoCo version, threads, "
        "substeps, timestep, solver); null for a Gymnasium id."
    )
    add("")
    add("## Traces")
    add("")
    add(
        "`training.trace_enabled=true` makes every process with a timeline write Chrome "
        "trace-event JSON (the array format) to `training.trace_output_dir` (default "
        "`<run_dir>/traces`), one file `<role>-<pid>.trace.json` per process: `algorithm` "
        "(the loop that drives the iterations: Algorithm Step, Training Step, Evaluation), "
        "`env_runner-<i>`, `eval_env_runner-<i>` and `learner-<rank>`. Each occurrence of a "
        "canonical phase is one complete event (`ph: X`) named by the schema's label (the "
        "terminal's row label: Collector Wait, Learning, Env Step, Rollout Wall, ...); a "
        "learner iteration is an `Iter Wall` event with its main phases inside it on the same "
        "track, and they never overlap one another (Learning is split around a Replay Stage "
        "inside it). Env Step's parts (Action Validate, Reset Done, Apply Action, Backend Step, "
        "Update State) sit on the EnvRunner's `· nested` track; background work (APPO's "
        "episode ingest, SAC's replay ingress) on the thread that does it, which has its own "
        "track. Process and thread names are metadata events. Timestamps are wall-clock "
        "microseconds (`perf_counter` plus an offset each process measures when it starts, "
        "recorded with its machine's boot id in the `raylab_clock` metadata event). One "
        "process's offset can be off by milliseconds (a wall-clock step, a process descheduled "
        "between its two clock reads), so the merge puts the files of one machine, whose "
        "`perf_counter` is one monotonic clock, on their median offset (the shifts are in "
        "`merged.json`'s `otherData.clock_shift_us`); files of other machines keep their own "
        "offsets, aligned as well as NTP keeps the machines. "
        "`training.trace_thread_time=true` adds `args.thread_cpu_ms` "
        "to every phase; `training.trace_cuda_events=true` puts the device time of each phase, "
        "from CUDA event pairs, on a `CUDA` track (GPU learners only: refused on CPU). A "
        "process killed before exit leaves its array open, which the format allows. "
        "`raylab trace RUN_DIR` validates every file fail-closed, merges them into "
        "`merged.json` (object format, one pid per file), writes `summary.json` and prints "
        "each track's phases (count, total, mean, share of its Iter Wall / Rollout Wall) and "
        "how long Learning and EnvRunner sampling ran at the same time. Open `merged.json` in "
        "ui.perfetto.dev or chrome://tracing. `raylab tune` refuses tracing (trials would "
        "share a folder)."
    )
    add("")
    add("## Reading runs")
    add("")
    add(
        "`raylab metrics extract RUN_DIR [--csv OUT]` reads every event file under the run "
        "directory with TensorBoard's EventAccumulator into one table (`step`, `wall_time`, "
        "one column per tag; CSV on stdout or into OUT). It fails with one line when "
        f"`{rundir.SUMMARY_FILE}` or its `metric_schema_version` is missing or unsupported, a "
        "tag is unknown, retired or has a wrong unit suffix, a terminal-only tag was persisted, "
        "a value is NaN / inf where forbidden, a summary is not a scalar, or canonical and "
        "legacy tags are mixed. If a tag has several values for one step (a resumed run), the "
        "latest wins. From Python: `raylab.metrics.extract.extract(run_dir)`."
    )
    add("")
    add("## Stats tracker")
    add("")
    add(
        "`raylab.metrics.tracker` records statistics where they happen and reduces them across "
        'workers at export time: named trackers (`tracker.get("rollout")` exports under '
        "`rollout/`), per-thread scopes, `scalar` (mean with a `__count` weight), boolean-mask "
        "`denominator`s, `stat` with AVG_MIN_MAX (default), AVG, SUM, MIN or MAX, and "
        "`record_timing` (a name ending in `_ms` records milliseconds, else seconds). "
        "`export()` returns exact partial states; `merge_exports([...])` over the exports of "
        "any number of Ray actors gives the same numbers, bit for bit, as one tracker fed all "
        "the data. A key with no elements (an empty denominator) is omitted, never 0/0."
    )
    return "\n".join(L) + "\n"


if __name__ == "__main__":  # pragma: no cover
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"raylab: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
