"""bench/served_cpu.py runs the served graphs as Aegra would (minus Aegra) and reports each system's CPU per run:
its numbers back docs/performance.md's reading of the served gap, so it must keep running every system to the
end (a request that pauses, an approval that pays). Postgres: skipped without one, failed under CI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pg_server import require_postgres

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import served_cpu  # noqa: E402


def test_every_system_runs_its_threads_to_the_end_and_reports_its_cpu(monkeypatch, capsys):
    monkeypatch.setenv("GATEDLOOP_TEST_PG_URL", require_postgres())
    served_cpu.main(["--threads", "3", "--reps", "1"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for system in served_cpu.SYSTEMS:
        [batch] = report[system]["batches"]
        assert batch["runs"] == 6 and batch["cpu_ms_per_run"] > 0, batch
        assert "event loop" in batch["by_thread_ms_per_run"]
