"""The walkthrough is part of the main job: every scene must reach its promised outcome."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli import walkthrough
from cli.main import app


def test_every_scene_passes_with_the_promised_outcomes() -> None:
    scenes = {s.title: s for s in walkthrough.run()}
    assert all(s.passed for s in scenes.values())
    retry = scenes["The lost acknowledgement"].steps[1].outcome
    assert retry == "duplicate: nothing appended, original offsets 0..1 returned"
    zombie = scenes["The zombie producer"].steps[-1].outcome
    assert zombie == "rejected: INVALID_PRODUCER_EPOCH"


def test_cli_json_output_parses_and_exits_zero() -> None:
    result = CliRunner().invoke(app, ["walkthrough", "--json"])
    assert result.exit_code == 0, result.output
    scenes = json.loads(result.output)
    assert [s["passed"] for s in scenes] == [True] * 4
