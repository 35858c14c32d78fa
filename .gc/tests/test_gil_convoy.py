"""scripts/gil_convoy.py runs and reports each switch interval it was given (no timing asserted)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gil_convoy  # noqa: E402


def test_gil_convoy_reports_every_interval_and_restores_the_switch_interval(tmp_path):
    before = sys.getswitchinterval()
    out = tmp_path / "convoy.json"
    assert gil_convoy.main(["--ops", "20", "--intervals", "1,0.2", "--repeats", "1", "--json", str(out)]) == 0
    assert sys.getswitchinterval() == before
    report = json.loads(out.read_text())
    assert report["ops"] == 20 and report["parser"] == "full" and [row["switch_interval_ms"] for row in report["rows"]] == [1.0, 0.2]
    for row in report["rows"]:
        assert row["worker_ms_alone"] > 0 and row["worker_ms_beside_parser"] > 0
        assert row["parser_bodies_per_s_alone"] > 0


def test_gil_convoy_can_time_the_parse_s_parts_apart(tmp_path):
    out = tmp_path / "convoy.json"
    for parser in ("json", "base64"):
        assert gil_convoy.main(["--ops", "20", "--intervals", "0.5", "--repeats", "1", "--parser", parser,
                                "--json", str(out)]) == 0
        assert json.loads(out.read_text())["parser"] == parser
