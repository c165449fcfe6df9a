"""The benchmark suite: guard logic on synthetic reference series, the result schema, the machine
check, and a short smoke run of every `raylab bench` command (no timed assertions: speed lives
in benchmarks/)."""

from __future__ import annotations

import json
import math
import os

import pytest
from conftest import head_driver_env, run_cli

from raylab.bench import common as C

# --------------------------------------------------------------------------- guards


def test_guard_stable_series():
    g = C.guard([1000, 1030, 990, 1010, 1005])
    assert g["verdict"] == "stable"
    assert not g["unstable"] and not g["trending"]
    assert g["drifts"][0] == 0.0
    assert g["max_abs_drift"] == pytest.approx(0.03)


def test_guard_drift_beyond_ten_percent_is_unstable():
    assert C.guard([1000, 1000, 1101])["verdict"] == "unstable"
    assert C.guard([1000, 1000, 899])["verdict"] == "unstable"  # down counts as much as up
    # just inside the limit (and not one way): stable
    assert C.guard([1000, 1099, 1000, 1050])["verdict"] == "stable"


def test_drift_is_measured_against_the_first_reference():
    assert C.drifts([200.0, 220.0, 180.0]) == pytest.approx([0.0, 0.1, -0.1])
    with pytest.raises(ValueError):
        C.drifts([0.0, 1.0])


def test_trend_three_windows_one_way_beyond_four_percent():
    g = C.guard([1000, 1020, 1044])  # +2.0%, +2.4%: +4.4% over three windows
    assert g["verdict"] == "trending" and g["trending"] and not g["unstable"]
    assert g["trends"] == [{"start": 0, "end": 2, "change": pytest.approx(0.044)}]
    down = C.guard([1000, 1010, 985, 955])  # the last three fall 5.4%
    assert down["verdict"] == "trending"
    assert down["trends"][0]["start"] == 1 and down["trends"][0]["change"] < 0


def test_no_trend_when_the_move_is_small_or_not_one_way():
    assert C.guard([1000, 1015, 1039])["verdict"] == "stable"  # one way, but only +3.9%
    assert C.guard([1000, 1060, 1050])["verdict"] == "stable"  # +5% but not monotonic
    assert C.find_trends([1000, 1000, 1050]) == []  # a flat step is not a move


def test_unstable_wins_over_trending_and_both_flags_are_kept():
    g = C.guard([1000, 1060, 1120])
    assert g["verdict"] == "unstable"
    assert g["unstable"] and g["trending"]


def test_guard_limits_are_parameters_and_one_reference_is_unchecked():
    assert C.guard([1000, 1060], drift_limit=0.05)["verdict"] == "unstable"
    assert C.guard([1000, 1020, 1040], trend_limit=0.05)["verdict"] == "stable"
    assert C.guard([1000])["verdict"] == "unchecked"
    assert C.guard([])["verdict"] == "unchecked"


def test_sustained_summary_on_a_synthetic_series():
    from raylab.bench.env import sustained_summary

    s = sustained_summary([100, 120, 110, 90, 80, 85, 95, 90])
    assert s["peak"] == 120 and s["peak_window"] == 1 and s["min"] == 80
    assert s["second_half_band"] == [80, 95]
    assert s["second_half_spread"] == pytest.approx(95 / 80 - 1)
    assert s["last3_mean"] == pytest.approx((85 + 95 + 90) / 3)
    assert s["last3_vs_peak"] == pytest.approx(90 / 120 - 1)


def test_phase_shares_come_from_the_canonical_main_phases():
    from raylab.bench.train import phase_shares
    from raylab.metrics import schema as S

    m = [
        {
            S.PERF_ITERATION_TIME: 0.10,
            S.PERF_LEARNING_TIME: 0.06,
            S.PERF_LEARNER_COLLECTOR_WAIT_MS: 20.0,
        },
        {
            S.PERF_ITERATION_TIME: 0.10,
            S.PERF_LEARNING_TIME: 0.04,
            S.PERF_LEARNER_COLLECTOR_WAIT_MS: 40.0,
        },
    ]
    p = phase_shares(m, "appo")
    assert p["iteration_time_s"] == pytest.approx(0.10)
    assert p["shares"][S.PERF_LEARNING_TIME] == pytest.approx(0.5)
    assert p["shares"][S.PERF_LEARNER_COLLECTOR_WAIT_MS] == pytest.approx(0.3)
    assert p["shares"]["Other"] == pytest.approx(0.2)
    assert phase_shares([{S.PERF_TOTAL_FPS: 1.0}], "appo") is None


def test_stock_sac_does_the_same_updates_per_env_step():
    """RLlib's own round-robin formula, fed our training_intensity, gives one update of the
    batch per sampled env step (per vector step: num_envs updates)."""
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    from raylab.bench.train import compose_cfg, stock_sac_config

    for envs, ratio in ((8, 1.0), (4, 0.5), (16, 2.0)):
        cfg = compose_cfg(
            "sac", "microduck_balance", [f"env.num_envs={envs}", f"algo.updates_per_step={ratio}"]
        )
        store, train = calculate_rr_weights(stock_sac_config(cfg))
        assert (store, train) == (1, int(envs * ratio)), (envs, ratio)


# --------------------------------------------------------------------- machine check


def test_machine_check_records_load_cores_and_warnings(monkeypatch):
    monkeypatch.setattr(C, "busy_processes", lambda interval=0.5: [])
    monkeypatch.setattr(C.os, "getloadavg", lambda: (0.1, 0.2, 0.3))
    quiet = C.machine_check(threads_needed=1)
    assert quiet["loadavg"] == [0.1, 0.2, 0.3]
    assert quiet["usable_cores"] == C.usable_cores()
    assert not any("load average" in w for w in quiet["warnings"])

    monkeypatch.setattr(C.os, "getloadavg", lambda: (3.0, 2.0, 1.0))
    monkeypatch.setattr(
        C,
        "busy_processes",
        lambda interval=0.5: [{"pid": 1, "cpu": 0.9, "name": "python train.py"}],
    )
    busy = C.machine_check(threads_needed=C.usable_cores() + 1)
    text = " | ".join(busy["warnings"])
    assert "load average (1 min) 3.00" in text
    assert "python train.py" in text
    assert "overcommitted" in text


def test_busy_processes_leaves_out_this_process_and_its_children():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = C.busy_processes(interval=0.3, threshold=0.05)
        pids = {p["pid"] for p in busy}
        assert os.getpid() not in pids and child.pid not in pids
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------------------- schema


def _minimal(kind="env_sweep"):
    res = C.new_result(
        kind, "raylab bench env", {"x": 1}, {"loadavg": [0.0, 0.0, 0.0], "warnings": []}
    )
    body, row_keys = C._BODY[kind]
    res[body] = [{k: 1.0 for k in row_keys}]
    return C.finish_result(res, "stable", C.guard([1.0, 1.0]))


def test_result_schema_accepts_every_kind_and_records_the_machine():
    for kind in C.KINDS:
        res = _minimal(kind)
        C.validate_result(res)
        assert res["machine"]["cpu_count"] == os.cpu_count()
        assert len(res["machine"]["loadavg"]) == 3 and len(res["loadavg_after"]) == 3


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda r: r.pop("command"), "no 'command'"),
        (lambda r: r.update(kind="nope"), "kind 'nope'"),
        (lambda r: r.update(verdict="fine"), "verdict 'fine'"),
        (lambda r: r["machine"].pop("loadavg"), "machine has no 'loadavg'"),
        (lambda r: r["rows"][0].pop("drift_after"), "rows[0] has no 'drift_after'"),
        (lambda r: r.update(rows=[]), "no 'rows' list"),
        (lambda r: r.update(schema="raylab.bench/0"), "schema"),
    ],
)
def test_result_schema_rejects_damaged_results(damage, message):
    res = _minimal()
    damage(res)
    with pytest.raises(C.ResultSchemaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        C.validate_result(res)


def test_save_and_load_round_trip_with_nan_as_null(tmp_path):
    res = _minimal()
    res["rows"][0]["env_steps_per_cpu_s"] = float("nan")
    path = C.save_result(res, tmp_path / "sub" / "r.json")
    raw = json.loads(path.read_text())
    assert raw["rows"][0]["env_steps_per_cpu_s"] is None
    assert C.load_result(path)["kind"] == "env_sweep"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(C.ResultSchemaError, match="not valid JSON"):
        C.load_result(tmp_path / "bad.json")


def test_parse_options_reads_json_values():
    assert C.parse_options(["a=0.9", "b=true", "c=v1", "d=[1, 2]"]) == {
        "a": 0.9,
        "b": True,
        "c": "v1",
        "d": [1, 2],
    }
    from raylab.errors import UserError

    with pytest.raises(UserError, match="KEY=VALUE"):
        C.parse_options(["novalue"])


# --------------------------------------------------------------------------- CLI: errors


def _one_line_error(r):
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, expect",
    [
        (["bench"], "env | compare | train | plot"),
        (["bench", "envv"], "did you mean 'env'"),
        (["bench", "env", "--threads", "0"], "num_threads=0"),
        (["bench", "env", "--threads", "99"], "above the limit"),
        (["bench", "env", "--task", "nope"], "unknown task with a batched backend 'nope'"),
        (["bench", "env", "--seconds", "0"], "seconds must be > 0"),
        (["bench", "env", "--option", "bogus=1", "--seconds", "0.1"], "bad env option"),
        (["bench", "env", "--mode", "half"], "invalid choice: 'half'"),
        (["bench", "compare", "--backends", "batched", "forked"], "unknown backend 'forked'"),
        (["bench", "train", "--algo", "dqn"], "unknown algo 'dqn'"),
        (["bench", "train", "--algo", "ppo", "algo.nope=1"], "unknown config key 'algo.nope'"),
        (["bench", "train", "--task", "Pendulum-v1"], "has no batched env"),
        (["bench", "plot", "/nonexistent/r.json"], "no such file"),
    ],
)
def test_bad_input_is_one_line(args, expect):
    assert expect in _one_line_error(run_cli(*args))


def test_plot_refuses_a_file_that_is_not_a_result(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert "no 'schema'" in _one_line_error(run_cli("bench", "plot", str(bad)))


@pytest.mark.parametrize("what", ["env", "compare", "train", "plot"])
def test_help_documents_every_option_with_its_default(what):
    r = run_cli("bench", what, "--help")
    assert r.returncode == 0
    section = r.stdout.split("options:", 1)[1].split("\n\n", 1)[0]
    entries, current = [], None
    for line in section.splitlines():
        if line.startswith("  -"):
            current = [line]
            entries.append(current)
        elif current is not None:
            current.append(line)
    entries = [" ".join(" ".join(e).split()) for e in entries]
    assert len(entries) > 2
    for entry in entries:
        if not entry.startswith("-h"):
            assert "(default:" in entry, entry


# ---------------------------------------------------------------------- CLI: smoke runs

SHORT = ["--seconds", "0.3", "--warmup", "0.1"]


def _load(path):
    data = json.loads(path.read_text())
    C.validate_result(data)
    return data


def test_env_sweep_smoke_with_bare_windows(tmp_path):
    out = tmp_path / "sweep.json"
    r = run_cli(
        "bench",
        "env",
        "--threads",
        "1",
        "2",
        "--num-envs",
        "4",
        "--with-bare",
        "--ref-seconds",
        "0.2",
        "--out",
        str(out),
        *SHORT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "raylab bench env --threads 1 2" in r.stdout  # the command that reproduces it
    res = _load(out)
    assert res["command"].startswith("raylab bench env --threads 1 2")
    assert res["kind"] == "env_sweep" and [row["threads"] for row in res["rows"]] == [1, 2]
    assert len(res["refs"]) == 3  # before the sweep and after every row
    assert res["verdict"] == res["guard"]["verdict"]
    one, two = res["rows"]
    assert one["speedup"] == 1.0 and one["efficiency"] == 1.0
    close = dict(rel=1e-5)  # the file keeps 6 significant digits
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2, **close)
    assert two["per_thread"] == pytest.approx(two["env_steps_per_s"] / 2, **close)
    assert two["drift_after"] == pytest.approx(res["refs"][2]["drift"], **close)
    assert two["env_over_bare"] == pytest.approx(
        two["env_steps_per_s"] / two["bare"]["env_steps_per_s"], **close
    )
    assert "loadavg" in res["machine_check"] and res["machine"]["usable_cores"] >= 1

    png = tmp_path / "sweep.png"
    r = run_cli("bench", "plot", str(out), "--out", str(png))
    assert r.returncode == 0, r.stderr[-2000:]
    assert png.stat().st_size > 1000


def test_env_bare_sweep_and_sustained_smoke(tmp_path):
    bare = tmp_path / "bare.json"
    r = run_cli(
        "bench",
        "env",
        "--mode",
        "bare",
        "--threads",
        "1",
        "--num-envs",
        "4",
        "--out",
        str(bare),
        *SHORT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert _load(bare)["params"]["mode"] == "bare"

    sus = tmp_path / "sustained.json"
    r = run_cli(
        "bench",
        "env",
        "--sustained",
        "1",
        "--windows",
        "3",
        "--num-envs",
        "4",
        "--out",
        str(sus),
        *SHORT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = _load(sus)
    assert res["kind"] == "env_sustained"
    assert [w["window"] for w in res["windows"]] == [0, 1, 2] and len(res["refs"]) == 2
    assert res["summary"]["peak"] == max(w["env_steps_per_s"] for w in res["windows"])
    r = run_cli("bench", "plot", str(sus))
    assert r.returncode == 0 and sus.with_suffix(".png").is_file()


def test_compare_smoke_alternates_backends(tmp_path):
    out = tmp_path / "compare.json"
    r = run_cli(
        "bench",
        "compare",
        "--workers",
        "1",
        "2",
        "--envs-per-worker",
        "2",
        "--rounds",
        "2",
        "--out",
        str(out),
        *SHORT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = _load(out)
    rows = {(x["workers"], x["backend"]): x for x in res["rows"]}
    assert set(rows) == {(w, b) for w in (1, 2) for b in ("batched", "async", "sync")}
    assert all(len(x["windows"]) == 2 and x["num_envs"] == 2 * x["workers"] for x in rows.values())
    for w in ("1", "2"):
        e = res["ratios"][w]
        assert len(e["batched_over_async_per_round"]) == 2
        assert isinstance(e["goal_batched_ge_2x_async"], bool)
    order = [ln.split()[2:4] for ln in r.stdout.splitlines() if ln.startswith("  round")]
    assert order[:6] == order[6:][::-1]  # the second round runs the first one backwards
    assert run_cli("bench", "plot", str(out)).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["appo", "sac"])
def test_train_smoke(tmp_path, algo, idle_head):
    out = tmp_path / f"train_{algo}.json"
    extra = {
        "appo": ["algo.train_batch_size=128"],  # one sample: 4 envs x 32 steps
        "sac": ["algo.learning_starts=64", "algo.batch_size=32", "--torch-limit-seconds", "1"],
    }[algo]
    r = run_cli(
        "bench",
        "train",
        "--algo",
        algo,
        "--seconds",
        "2",
        "--warmup",
        "1",
        "--ref-seconds",
        "0.2",
        "--physics-seconds",
        "0.2",
        "--out",
        str(out),
        "env.num_envs=4",
        "algo.hidden=[32,32]",
        *extra,
        env=head_driver_env(idle_head),  # the session's Ray head: no Ray of its own to start
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # no restarts in a benchmark, so no core-worker ERROR line for each EnvRunner built here
    assert "constructor arguments in the object store" not in r.stdout + r.stderr
    res = _load(out)
    names = [x["contender"] for x in res["runs"]]
    expected = ["batched", "gym_sync"] + (["stock_sac", "torch_limit"] if algo == "sac" else [])
    assert names == expected
    assert len(res["refs"]) == len(names) + 1
    # bare physics on all cores before the first run and after every run; each training run
    # divided by the mean of the two windows around it
    assert len(res["physics_windows"]) == len(names) + 1
    assert res["params"]["physics_threads"] == C.usable_cores()
    w = [x["env_steps_per_s"] for x in res["physics_windows"]]
    for i, run in enumerate(res["runs"]):
        if run["contender"] in ("batched", "gym_sync"):
            # (the JSON keeps 6 significant digits)
            assert run["physics_env_steps_per_s"] == pytest.approx((w[i] + w[i + 1]) / 2, 1e-4)
            assert run["over_physics"] == pytest.approx(
                run["env_steps_per_s"] / run["physics_env_steps_per_s"], 1e-4
            )
    for run in res["runs"]:
        assert run["updates_per_s"] > 0
        if run["contender"] in ("batched", "gym_sync"):
            assert run["env_steps_per_s"] > 0
            shares = run["phases"]["shares"]
            assert "Other" in shares and sum(shares.values()) == pytest.approx(1.0, abs=0.02)
    if algo == "appo":
        # raylab's learners count their gradient steps: two passes (the circular buffer's
        # default) over each 128-row batch, the learner idle most of its iteration so it
        # keeps up. Rows trained / train_batch_size, the count before, read one per 128 rows.
        for run in res["runs"]:
            assert 1.5 / 128 < run["updates_per_env_step"] <= 2.1 / 128, run
    ratios = res["summary"]["ratios"]
    assert math.isfinite(ratios["batched_over_gym_sync_env_steps"])
    assert 0 < ratios["batched_over_physics"] < 2
    if algo == "appo":
        assert "appo_batched_ge_0.7x_physics" in res["summary"]["goals"]
    assert "batched_over_physics" in r.stdout
    if algo == "sac":
        assert "sac_over_stock_env_steps" in ratios and "sac_over_torch_limit_updates" in ratios
    assert run_cli("bench", "plot", str(out)).returncode == 0


def _sampler_smoke(out, *extra):
    """A tiny ``bench train --sampler`` run (2 rounds of 0.3 s, 4 envs): its output and JSON."""
    r = run_cli(
        "bench",
        "train",
        "--sampler",
        *extra,
        "--seconds",
        "0.3",
        "--rounds",
        "2",
        "--out",
        str(out),
        "env.num_envs=4",
        "algo.hidden=[32,32]",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, _load(out)


def test_sampler_smoke_alternates_the_three_contenders(tmp_path):
    out = tmp_path / "sampler.json"
    r, res = _sampler_smoke(out, "--algo", "appo")
    assert res["kind"] == "sampler" and res["command"].startswith("raylab bench train")
    assert [x["contender"] for x in res["rows"]] == ["fast", "rllib", "env", "env", "rllib", "fast"]
    assert all(x["env_steps_per_s"] > 0 for x in res["rows"])
    for key in ("fast_over_env", "fast_over_rllib", "rllib_over_env"):
        assert math.isfinite(res["ratios"][key]) and len(res["ratios"][key + "_per_round"]) == 2
    assert set(res["goals"]) == {"fast_ge_0.85x_env"}
    assert "fast_over_env" in r.stdout
    assert run_cli("bench", "plot", str(out)).returncode == 0
    bad = run_cli("bench", "train", "--algo", "sac", "--sampler", "--out", str(out))
    assert bad.returncode == 2 and "--sampler measures the PPO / APPO EnvRunners" in bad.stderr


def test_sampler_trace_times_the_traced_runner_next_to_the_untraced_one(tmp_path):
    """``--sampler --trace``: raylab's EnvRunner with this process's tracer on, in the window
    next to the same runner untraced; the events it wrote are counted (none: not traced)."""
    out = tmp_path / "sampler_trace.json"
    r, res = _sampler_smoke(out, "--trace")
    order = ["fast", "fast_traced", "rllib", "env"]
    assert [x["contender"] for x in res["rows"]] == order + order[::-1]
    per = res["ratios"]["fast_traced_over_fast_per_round"]
    assert len(per) == 2 and all(math.isfinite(x) and x > 0 for x in per)
    # MLP Infer and Env Step every vector step, plus Env Step's nested parts (up to 6)
    assert 2.0 <= res["trace_events_per_vector_step"] <= 8.5
    assert "trace_overhead_lt_3%" in res["goals"]
    assert "fast_traced_over_fast" in r.stdout
    assert run_cli("bench", "plot", str(out)).returncode == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--trace"], "--trace adds a traced contender to --sampler"),
        (["--sampler", "--vary", "env.num_envs=4,8"], "--vary: end-to-end options"),
        (["--sampler", "--warmup", "5"], "--warmup: end-to-end options"),
        (["--sampler", "training.trace_enabled=true"], "add --trace for a traced one"),
    ],
)
def test_sampler_refuses_options_it_would_ignore(tmp_path, args, needle):
    r = run_cli("bench", "train", *args, "--out", str(tmp_path / "x.json"), timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_round_order_reverses_every_other_round():
    assert C.round_order(["a", "b"], 1) == [(0, "a"), (0, "b")]
    assert C.round_order(["a", "b", "c"], 3) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c"),
    ]  # fmt: skip


@pytest.mark.slow
def test_train_vary_runs_each_value_of_one_key(tmp_path, idle_head):
    """One round (the order of several rounds is round_order's, above): each variant is a
    contender of its own and its values reach the algorithm; two keys change together, and
    each run is divided by bare physics at its own env count, that of all its EnvRunners."""
    out = tmp_path / "train_vary.json"
    r = run_cli(
        "bench",
        "train",
        "--algo",
        "appo",
        "--sides",
        "batched",
        "--seconds",
        "3",
        "--warmup",
        "1",
        "--ref-seconds",
        "0.2",
        "--physics-seconds",
        "0.2",
        "--vary",
        "training.iteration_s=0.1,1.5",
        "--vary",
        "env.num_envs=4,3",
        "--vary",
        "resources.num_env_runners=1,2",
        "--out",
        str(out),
        "algo.hidden=[32,32]",
        "algo.train_batch_size=128",
        env=head_driver_env(idle_head),
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = _load(out)
    va = "training.iteration_s=0.1 env.num_envs=4 resources.num_env_runners=1"
    vb = "training.iteration_s=1.5 env.num_envs=3 resources.num_env_runners=2"
    a, b = f"batched@{va}", f"batched@{vb}"
    assert [x["contender"] for x in res["runs"]] == [a, b]
    by = {x["contender"]: x for x in res["runs"]}
    # The value reached the algorithm: 0.1 s iterations are many more in the same budget.
    assert by[a]["iterations"] > by[b]["iterations"]
    ratios = res["summary"]["ratios"]
    assert len(ratios[f"{b}_over_{va}_env_steps_per_round"]) == 1
    assert ratios[f"{b}_over_{va}_env_steps"] > 0
    assert "--vary training.iteration_s=0.1,1.5 --vary env.num_envs=4,3" in res["command"]
    # Bare physics: 4 envs before and after the first run, 2 x 3 before and after the second.
    w = res["physics_windows"]
    assert [x["num_envs"] for x in w] == [4, 4, 6, 6]
    assert [x.get("after_run") for x in w] == [None, f"{a}#0", None, f"{b}#0"]
    assert w[2]["before_run"] == b
    for run, (x, y) in ((by[a], w[0:2]), (by[b], w[2:4])):
        mean = (x["env_steps_per_s"] + y["env_steps_per_s"]) / 2
        assert run["physics_env_steps_per_s"] == pytest.approx(mean, 1e-4)


@pytest.mark.parametrize(
    "bad", ["training.iteration_s=1", "training.iteration_s", "=1,2", "training.iteration_s=1,1"]
)
def test_train_vary_bad_values_are_one_line(bad):
    r = run_cli("bench", "train", "--vary", bad)
    assert r.returncode != 0
    assert (
        "Traceback" not in r.stderr
        and "--vary" in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )


def test_train_vary_keys_given_twice_change_together():
    from raylab.bench.train import compose_cfg, parse_vary

    pairs = parse_vary(["resources.num_env_runners=1,2", "env.num_envs=32,16"])
    assert pairs == [
        "resources.num_env_runners=1 env.num_envs=32",
        "resources.num_env_runners=2 env.num_envs=16",
    ]
    cfg = compose_cfg("appo", "microduck_balance", pairs[1].split(" "))
    assert (cfg.resources.num_env_runners, cfg.env.num_envs) == (2, 16)
    r = run_cli("bench", "train", "--vary", "env.num_envs=8,16", "--vary", "algo.lr=1e-4,2e-4,3e-4")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "as many values" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # A paired key may repeat a value; the pairings themselves must differ.
    assert parse_vary(["resources.num_env_runners=1,2,2", "env.num_envs=128,64,128"]) == [
        "resources.num_env_runners=1 env.num_envs=128",
        "resources.num_env_runners=2 env.num_envs=64",
        "resources.num_env_runners=2 env.num_envs=128",
    ]
    r = run_cli("bench", "train", "--vary", "env.num_envs=8,8", "--vary", "algo.lr=1e-4,1e-4")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "two variants are the same" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_train_vary_takes_list_values_in_brackets():
    from raylab.bench.train import compose_cfg, parse_vary

    variants = parse_vary("algo.hidden=[256,256],[128,128],[64]")
    assert variants == ["algo.hidden=[256,256]", "algo.hidden=[128,128]", "algo.hidden=[64]"]
    cfg = compose_cfg("appo", "microduck_balance", variants[1].split(" "))
    assert list(cfg.algo.hidden) == [128, 128]


def test_the_local_ray_of_a_vary_run_has_room_for_its_largest_variant():
    """A --vary of the EnvRunners must not start a Ray sized for the first variant only: its
    second variant's actors would wait forever for CPUs (run_train_bench sizes the local Ray
    by the variant that reserves the most)."""
    from raylab.bench.train import compose_cfg, largest
    from raylab.train import cpus_reserved

    one = compose_cfg("appo", "microduck_balance", [])
    two = compose_cfg("appo", "microduck_balance", ["resources.num_env_runners=2"])
    assert cpus_reserved(two) == cpus_reserved(one) + 1
    assert largest(one, [one, two]) is two and largest(two, [one]) is two


def test_train_vary_bad_value_for_the_key_is_refused_before_anything_runs():
    r = run_cli("bench", "train", "--vary", "training.iteration_s=1,fast")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "iteration_s" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_stock_sac_has_the_hyperparameters_of_raylab_sac():
    from raylab.algorithms.build import build_algorithm_config
    from raylab.bench.train import compose_cfg, stock_sac_config

    cfg = compose_cfg(
        "sac", "Pendulum-v1", ["algo.actor_lr=7e-4", "algo.tau=0.01", "algo.batch_size=128"]
    )
    ours, stock = build_algorithm_config(cfg), stock_sac_config(cfg)
    for name in (
        "gamma",
        "actor_lr",
        "critic_lr",
        "alpha_lr",
        "tau",
        "initial_alpha",
        "n_step",
        "grad_clip",
        "train_batch_size_per_learner",
        "num_steps_sampled_before_learning_starts",
    ):
        assert getattr(ours, name) == getattr(stock, name), name
    assert (stock.actor_lr, stock.tau, stock.train_batch_size_per_learner) == (7e-4, 0.01, 128)


def test_physics_by_pose_times_a_standing_and_a_fallen_duck(tmp_path):
    """benchmarks/physics_by_pose.py: the held duck stands and the random one lies, each window
    is timed, and the JSON holds the rates, the states and the machine."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks/physics_by_pose.py"
    spec = importlib.util.spec_from_file_location("physics_by_pose", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "pose.json"
    argv = ["--num-envs", "4", "--rounds", "2", "--seconds", "0.2", "--out", str(out)]
    assert mod.main(argv) == 0
    r = json.loads(out.read_text())
    assert r["command"].startswith("python benchmarks/physics_by_pose.py --num-envs 4")
    assert {len(v) for v in r["env_steps_per_s"].values()} == {2}
    assert all(x > 0 for v in r["env_steps_per_s"].values() for x in v)
    assert all(s["fallen_share"] == 0.0 for s in r["states"]["hold"])
    assert all(s["fallen_share"] >= 0.5 for s in r["states"]["random"])
    assert r["hold_over_random"] == r["median"]["hold"] / r["median"]["random"]
    assert r["machine"]["usable_cores"] >= 1 and len(r["loadavg_after"]) == 3


def test_wait_gone_returns_when_the_processes_have_exited():
    """bench train waits for a stopped run's actor processes before the next machine windows;
    an exited child that is not reaped yet (a zombie) counts as gone."""
    import subprocess
    import time

    from raylab.bench.train import _alive, wait_gone

    proc = subprocess.Popen(["sleep", "1"])
    assert _alive(proc.pid)
    t0 = time.perf_counter()
    wait_gone([proc.pid], "test")
    assert 0.8 < time.perf_counter() - t0 < 10
    assert not _alive(proc.pid)  # exited, not reaped yet: a zombie
    proc.wait()
    t0 = time.perf_counter()
    wait_gone([proc.pid], "test", timeout_s=0.5)  # gone: no wait
    assert time.perf_counter() - t0 < 0.5
