"""loadtest/peers/compare_table.py: the serving comparison table from bench_serve JSON files."""

import json
import subprocess
import sys

from tests.server.conftest import ROOT

TABLE = ROOT / "loadtest" / "peers" / "compare_table.py"


def summary(ttft50, ttft99, tpot50, tps, failed=0):
    stats = {"mean": None, "p90": None}
    return {
        "summary": {
            "completed": 8 - failed,
            "failed": failed,
            "ttft_ms": stats | {"median": ttft50, "p99": ttft99},
            "tpot_ms": stats | {"median": tpot50, "p99": None},
            "output_throughput": tps,
        }
    }


def run(*args):
    return subprocess.run(
        [sys.executable, str(TABLE), *map(str, args)], capture_output=True, text=True, timeout=30
    )


def test_rows_and_ratios_against_the_peer(tmp_path):
    files = {
        "vtllm_c1": summary(200, 250, 16.0, 50.0),
        "llamacpp_c1": summary(400, 500, 12.5, 40.0),
        "vtllm_c16": summary(3000, 3300, 50.0, 150.0, failed=1),
        "llamacpp_c16": summary(6000, 6600, 100.0, 75.0),
        "other_c1": summary(1, 1, 1.0, 1.0),  # not among --runs: ignored
    }
    for name, body in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 + 4 and "other" not in r.stdout
    assert lines[2] == "| 1 | vtllm | 8 / 0 | 200 / 250 | 16.0 | 50.0 | 1.25 | 0.50 / 0.50 | 1.28 |"
    assert lines[3] == "| 1 | llamacpp | 8 / 0 | 400 / 500 | 12.5 | 40.0 |  |  |  |"
    assert lines[4].startswith(
        "| 16 | vtllm (failures) | 7 / 1 | 3000 / 3300 | 50.0 | 150.0 | 2.00"
    )


def test_peak_rss_table_when_rss_files_exist(tmp_path):
    for name in ("vtllm_c1", "llamacpp_c1"):
        (tmp_path / f"{name}.json").write_text(json.dumps(summary(1, 1, 1.0, 1.0)))
    (tmp_path / "vtllm_c1.rss").write_text("307200\n")  # kB, as VmHWM reads
    (tmp_path / "llamacpp_c1.rss").write_text("204800\n")
    (tmp_path / "other_c1.rss").write_text("1\n")  # not among --runs: ignored
    lines = run(tmp_path).stdout.splitlines()
    assert lines[-4:] == [
        "| C | server | peak RSS (MiB) | vs llamacpp |",
        "|---|---|---|---|",
        "| 1 | vtllm | 300 | 1.50 |",
        "| 1 | llamacpp | 200 |  |",
    ]


def test_missing_inputs_exit_2(tmp_path):
    r = run(tmp_path / "nope")
    assert r.returncode == 2 and r.stderr.startswith("compare_table: error: no directory")
    r = run(tmp_path)
    assert r.returncode == 2 and "no <run>_c<C>.json" in r.stderr


def snapshot(at, steps, prompt, output, host, wait, idle, backend=None):
    names = {
        "vt:engine_seconds_total": at,
        "vt:num_steps_total": steps,
        "vt:prompt_tokens_total": prompt,
        "vt:generation_tokens_total": output,
        "vt:engine_host_seconds_total": host,
        "vt:engine_wait_seconds_total": wait,
        "vt:engine_idle_seconds_total": idle,
    }
    if backend is not None:  # (device, launch, event loop CPU) seconds
        names["vt:engine_device_seconds_total"] = backend[0]
        names["vt:engine_launch_seconds_total"] = backend[1]
        names["vt:event_loop_cpu_seconds_total"] = backend[2]
    lines = ["# HELP vt:num_steps engine steps launched"]
    lines += [f'{name}{{model_name="m"}} {value}' for name, value in names.items()]
    return "\n".join(lines) + "\n"


def test_step_loop_table_from_metrics_snapshots(tmp_path):
    (tmp_path / "vtllm_c64.json").write_text(json.dumps(summary(1, 1, 1.0, 1.0)))
    before = snapshot(100.0, 10, 0, 0, 1.0, 1.0, 5.0, backend=(0.5, 0.1, 2.0))
    (tmp_path / "vtllm_c64.metrics.before").write_text(before)
    # 12 s on the loop's clock, 2 of them idle; 1,000 steps: 2 ms of loop work, 3 ms awaiting
    # results, so 10 - 2 - 3 = 5 ms a step went to the event loop's other tasks; the device
    # was busy 4 ms a step, the backend's thread enqueued for 1.5 ms, the event loop's thread
    # ran 6 ms
    after = snapshot(112.0, 1010, 8192, 64000, 3.0, 4.0, 7.0, backend=(4.5, 1.6, 8.0))
    (tmp_path / "vtllm_c64.metrics").write_text(after)
    # an older server's snapshots: no backend counters, so "-" in their columns
    (tmp_path / "old_c64.metrics.before").write_text(snapshot(0.0, 0, 0, 0, 0.0, 0.0, 0.0))
    (tmp_path / "old_c64.metrics").write_text(snapshot(1.0, 100, 0, 100, 0.1, 0.2, 0.0))
    for run_name in ("old", "llamacpp"):
        (tmp_path / f"{run_name}_c64.json").write_text(json.dumps(summary(1, 1, 1.0, 1.0)))
    lines = run(tmp_path, "--runs", "vtllm", "old", "llamacpp").stdout.splitlines()
    assert lines[-4:] == [
        "| C | server | steps | prompt + output tokens a step | loop work ms a step "
        "| awaiting results ms a step | rest ms a step | device busy ms a step "
        "| launch ms a step | event loop CPU ms a step |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| 64 | vtllm | 1000 | 8.2 + 64.0 | 2.00 | 3.00 | 5.00 | 4.00 | 1.50 | 6.00 |",
        "| 64 | old | 100 | 0.0 + 1.0 | 1.00 | 2.00 | 7.00 | - | - | - |",
    ]


def test_step_loop_table_skips_incomplete_snapshots(tmp_path):
    (tmp_path / "vtllm_c1.json").write_text(json.dumps(summary(1, 1, 1.0, 1.0)))
    (tmp_path / "vtllm_c1.metrics").write_text(snapshot(2.0, 5, 0, 5, 0.1, 0.1, 0.1))
    # no .before file (the scrape failed): no table rather than a made-up one
    assert "steps" not in run(tmp_path).stdout
    (tmp_path / "vtllm_c1.metrics.before").write_text('vt:num_steps_total{model_name="m"} 1\n')
    assert "steps" not in run(tmp_path).stdout
